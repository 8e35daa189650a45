// Refuses a CPU without AVX2 and FMA with a clear message instead of an illegal instruction: the
// binary's baseline is x86-64-v3. Built for plain x86-64 (CMakeLists.txt), and run as a
// constructor of the earliest priority, before the static initialisers of code built for the
// baseline.
#include <cstdio>
#include <cstdlib>

namespace {

__attribute__((constructor(101))) void require_avx2() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return;
  std::fputs("longtron: this CPU lacks AVX2 or FMA; longtron needs an x86-64 CPU with both "
             "(x86-64-v3: Intel Haswell, AMD Zen or newer)\n", stderr);
  std::exit(1);
}

}  // namespace
