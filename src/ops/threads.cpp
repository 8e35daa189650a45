#include "ops/threads.h"

#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

extern "C" void openblas_set_num_threads(int num_threads);

namespace longtron {
namespace {
int g_threads = 0;
}

int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

int set_num_threads(int n, int ranks_on_node) {
  if (n <= 0) n = std::max(1, hardware_threads() / std::max(1, ranks_on_node));
  g_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
  return n;
}

int num_threads() { return g_threads > 0 ? g_threads : hardware_threads(); }

void ensure_passive_omp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: continue with the default policy
}

}  // namespace longtron
