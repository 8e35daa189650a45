#!/usr/bin/env bash
# Builds longtron with AddressSanitizer + UndefinedBehaviorSanitizer in build-asan/ and runs the
# whole test suite (unit tests, CLI tests, MPI tests) under them with ctest.
# -O1 -g1 keeps the asserts (no NDEBUG: nlohmann::json's own checks run too) and file:line in
# every stack while staying fast enough to run the suite (the sanitizers' own advice for optimised
# builds). Extra arguments go to ctest (e.g. -R pack).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
LAUNCHER=()
command -v ccache > /dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
scripts/setup.sh build-asan -DLONGTRON_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" -DLONGTRON_MPI_TEST_TIMEOUT=1800 "${LAUNCHER[@]}"

# Every test runs these processes as children (gtest binaries, `longtron` from the CLI tests,
# mpirun's ranks on this machine), and all of them inherit this environment. Only third-party
# allocations are suppressed (scripts/lsan.supp); a leak in longtron's own frames still fails.
export ASAN_OPTIONS="detect_leaks=1:fast_unwind_on_malloc=0:check_initialization_order=1:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$ROOT/scripts/lsan.supp:print_suppressions=0"
cd build-asan && ctest --output-on-failure -j "$(nproc)" --timeout 1800 "$@"
