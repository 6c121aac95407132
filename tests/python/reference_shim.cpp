// The project's f64 reference (tools/reference) behind one C function, so that
// the Python tests can run it on host torch tensors through the same
// kdajit_decode_args_t bytes the package passes to libkdajit.so
// (test_reference.py: the Python float64 reference and the mapping against it).
#include <algorithm>
#include <cstring>
#include <string>

#include "kdajit/kdajit.h"
#include "kdajit/reference.hpp"

extern "C" __attribute__((visibility("default"))) int kdajit_test_reference(int op, const kdajit_decode_args_t* args,
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
