// The project's f64 reference (kdajit::ref::decode) behind one C function, so
// that Python code runs it on host tensors through the same kdajit_decode_args_t
// bytes the kdajit package passes to libkdajit.so: the Python tests' and the
// peer benchmarks' reference (tests/python/kda_testing.py: reference_call), and
// the tests' stand-in for the kernels on a machine without a GPU.
#include <algorithm>
#include <cstring>
#include <string>

#include "kdajit/kdajit.h"
#include "kdajit/reference.hpp"

// Runs op (kdajit_op_t) on *args in place. Returns 0, or the error's code with
// its message in `message` (cut to message_size - 1 bytes, NUL-terminated).
extern "C" __attribute__((visibility("default"))) int kdajit_reference_decode(int op, const kdajit_decode_args_t* args,
                                                                               char* message, size_t message_size) {
  kdajit::Status s = kdajit::ref::decode(static_cast<kdajit_op_t>(op), *args);
  std::string msg = s ? std::string() : s.error().message;
  if (message && message_size > 0) {
    size_t n = std::min(message_size - 1, msg.size());
    std::memcpy(message, msg.data(), n);
    message[n] = '\0';
  }
  return s ? 0 : static_cast<int>(s.error().code);
}
