// The project's f64 reference (kdajit::ref::decode, ::prefill, ::chunk) behind
// C functions, so that Python code runs it on host tensors through the same
// kdajit_decode_args_t / kdajit_prefill_args_t bytes the kdajit package passes
// to libkdajit.so: the Python tests' and the peer benchmarks' reference (tests/python/kda_testing.py: reference_call), and
// the tests' stand-in for the kernels on a machine without a GPU.
#include <algorithm>
#include <cstring>
#include <string>

#include "kdajit/kdajit.h"
#include "kdajit/reference.hpp"

namespace {

int report(const kdajit::Status& s, char* message, size_t message_size) {
  std::string msg = s ? std::string() : s.error().message;
  if (message && message_size > 0) {
    size_t n = std::min(message_size - 1, msg.size());
    std::memcpy(message, msg.data(), n);
    message[n] = '\0';
  }
  return s ? 0 : static_cast<int>(s.error().code);
}

}  // namespace

// Runs op (kdajit_op_t) on *args in place. Returns 0, or the error's code with
// its message in `message` (cut to message_size - 1 bytes, NUL-terminated).
extern "C" __attribute__((visibility("default"))) int kdajit_reference_decode(int op, const kdajit_decode_args_t* args,
                                                                               char* message, size_t message_size) {
  return report(kdajit::ref::decode(static_cast<kdajit_op_t>(op), *args), message, message_size);
}

// Runs the prefill op on *args in place (its scalars as given; max_seq_len and
// oob_counter are the kernels' business and not read). Returns as above.
extern "C" __attribute__((visibility("default"))) int kdajit_reference_prefill(const kdajit_prefill_args_t* args,
                                                                                char* message, size_t message_size) {
  kdajit::ref::PrefillArgs p;
  p.x = args->x;
  p.conv_weight = args->conv_weight;
  p.conv_state = args->conv_state;
  p.raw_gate = args->raw_gate;
  p.raw_beta = args->raw_beta;
  p.A_log = args->A_log;
  p.dt_bias = args->dt_bias;
  p.state_indices = args->state_indices;
  p.has_initial_state = args->has_initial_state;
  p.state = args->state;
  p.output_gate = args->output_gate;
  p.norm_weight = args->norm_weight;
  p.output = args->output;
  p.query_start_loc = args->query_start_loc;
  p.gate = args->gate;
  p.lower_bound = args->lower_bound;
  p.norm_eps = args->norm_eps;
  return report(kdajit::ref::prefill(p), message, message_size);
}

// Runs the chunk op on *args in place (ref::chunk: every scalar as given;
// max_seq_len is the kernels' business). Returns as above.
extern "C" __attribute__((visibility("default"))) int kdajit_reference_chunk(const kdajit_chunk_args_t* args,
                                                                              char* message, size_t message_size) {
  return report(kdajit::ref::chunk(*args), message, message_size);
}
