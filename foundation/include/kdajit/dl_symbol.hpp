// Binding entry points of a dlopen'ed library (the CUDA driver, NVRTC): both are
// loaded at run time so that kdajit runs where they are absent.
#pragma once

#include <dlfcn.h>

namespace kdajit {

// Sets `fn` to `symbol` of `lib`; false (and fn null) when the library lacks it.
template <class Fn>
bool bind_symbol(void* lib, Fn& fn, const char* symbol) {
  fn = reinterpret_cast<Fn>(dlsym(lib, symbol));
  return fn != nullptr;
}

}  // namespace kdajit
