// main() of the GPU test binaries: exit 77 (CTest SKIP_RETURN_CODE) when fewer
// usable CUDA devices exist than the binary needs (KDAJIT_TEST_MIN_GPUS, 1
// unless its target says more), so such machines report the tests skipped.
#define CATCH_CONFIG_RUNNER
#include <dlfcn.h>

#include <cstdio>
#include <string_view>

#include "catch.hpp"

#ifndef KDAJIT_TEST_MIN_GPUS
#define KDAJIT_TEST_MIN_GPUS 1
#endif

namespace {

int gpu_count() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  return init && count && init(0) == 0 && count(&n) == 0 ? n : 0;
}

}  // namespace

// Listing the test cases needs no GPU.
bool listing(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]).substr(0, 6) == "--list") return true;
  return false;
}

int main(int argc, char** argv) {
  if (!listing(argc, argv)) {
    const int n = gpu_count();
    if (n < KDAJIT_TEST_MIN_GPUS) {
      if (n == 0) std::fprintf(stderr, "no CUDA device: skipping GPU tests\n");
      else std::fprintf(stderr, "%d CUDA device(s), %d needed: skipping these GPU tests\n", n, KDAJIT_TEST_MIN_GPUS);
      return 77;
    }
  }
  return Catch::Session().run(argc, argv);
}
