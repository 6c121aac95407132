// A random chunk-op call on the host (docs/CONTRACT.md §11, §8's data rules):
// q, k, v, g, beta, A_log, dt_bias, the dense states, the output and
// cu_seqlens with padded row and sequence strides, outputs and final states
// poisoned; and the check of a device run against ref::chunk. `kdajit
// selfcheck`, the GPU tests and the benchmarks build their chunk calls here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kdajit/error.hpp"
#include "kdajit/kdajit.h"

namespace kdajit::ref {

struct ChunkSpec {
  int heads = 16;
  kdajit_dtype_t state = KDAJIT_DTYPE_F32;
  kdajit_gate_t gate = KDAJIT_GATE_BOUNDED;
  kdajit_dtype_t g_dtype = KDAJIT_DTYPE_BF16, beta_dtype = KDAJIT_DTYPE_BF16;
  bool qk_l2norm = true, beta_sigmoid = true, state_v_first = false;
  bool initial = true, final_state = true, in_place = false, dt_bias = true;
  float lower_bound = -5.f;  // the bounded gate's; -20 makes half a sub-chunk decay past the factored pass's limit
  std::vector<int32_t> lengths = {65, 0, 1000, 1, 64, 63};
  std::vector<int32_t> cu;  // cu_seqlens as given (malformed ranges); empty: from lengths
  int rows_after = 5;       // rows past cu[N] (zeros)
  int rows = 0;             // T_total; 0: the largest cu value + rows_after
  int row_pad = 8;          // q's and output's row padding (k's twice it), elements; odd: rows not 16-byte aligned
  uint64_t seed = 1;

  std::string name() const;  // e.g. "kda_chunk.h16.state_f32 gate bounded g bf16 beta bf16, in place"
};

// One host buffer and the view over it (strides in elements); an empty
// tensor has ndim 0 and data NULL.
struct HostTensor {
  std::vector<std::byte> bytes;
  kdajit_tensor_t view{};
  bool empty() const { return view.ndim == 0; }
};

struct ChunkProblem {
  ChunkSpec spec;
  int64_t H = 0, R = 0, N = 0;
  HostTensor q, k, v, g, beta, A_log, dt_bias, initial, final_state, output, cu;
  kdajit_chunk_args_t args{};  // host views over this problem's buffers

  static ChunkProblem make(const ChunkSpec& spec);
  ChunkProblem(const ChunkProblem& other);
  ChunkProblem& operator=(const ChunkProblem& other);
  ChunkProblem(ChunkProblem&&) = default;
  ChunkProblem& operator=(ChunkProblem&&) = default;

  // Every tensor in args order (q, k, v, g, beta, A_log, dt_bias,
  // initial_state, final_state, output, cu_seqlens) and the args' view of it.
  std::vector<std::pair<HostTensor*, kdajit_tensor_t kdajit_chunk_args_t::*>> tensors();
  // cu_seqlens as host values.
  std::vector<int32_t> cu_values() const;
  // The state the call writes: final_state, or initial_state in place.
  const HostTensor& written_state() const { return spec.in_place ? initial : final_state; }

 private:
  ChunkProblem() = default;
  void bind();  // args over this object's buffers
};

// got (after a device run) against expected (after ref::chunk): output rel L2
// and elementwise limits (§8), the final states of live sequences (§10.6's
// state limits), untouched final states bit for bit.
struct ChunkReport {
  bool pass = true;
  double output_rel_l2 = 0, state_rel_l2 = 0;
  int64_t output_bad = 0, state_untouched_bad = 0;
  // Rows the contract leaves undefined (in two sequences' ranges, or in one and
  // the zero rows around them: a cu_seqlens that steps back); not compared.
  int64_t undefined_rows = 0;
  std::string message;  // the first failure; "" when pass
  // The first (row, head) pairs with output elements outside, each with its
  // count and got/expected's least-squares scale over the row, e.g.
  // "(60, 2) x40 scale 0.21": where a failure sits, and whether it is a factor.
  std::string bad_rows;

  // One line: the figures, the first failure and the bad rows.
  std::string summary() const;
};
ChunkReport compare_chunk(const ChunkProblem& expected, const ChunkProblem& got);
// Per row of R: whether more than one writer of CONTRACT §11.2 names it (its
// value is then undefined), for cu_seqlens as given.
std::vector<bool> undefined_output_rows(const std::vector<int32_t>& cu, int64_t rows);

// Device copies of a chunk problem through kdajit's driver API (the current
// context, else the only GPU's primary one) and the args over them, with a
// workspace for route twopass (every route gets it; the others ignore it).
class DeviceChunk {
 public:
  static Result<std::unique_ptr<DeviceChunk>> upload(ChunkProblem& p);
  ~DeviceChunk();
  DeviceChunk(const DeviceChunk&) = delete;
  DeviceChunk& operator=(const DeviceChunk&) = delete;
  // Waits for the context's work, then copies output and the written state into p.
  Status download(ChunkProblem& p) const;
  const kdajit_chunk_args_t& args() const { return args_; }
  kdajit_chunk_args_t& args() { return args_; }

 private:
  DeviceChunk() = default;
  kdajit_chunk_args_t args_{};
  std::vector<std::pair<unsigned long long, size_t>> buffers_;  // CUdeviceptr, bytes; index as tensors()
  std::pair<unsigned long long, size_t> workspace_{0, 0};     // CUdeviceptr, bytes
};

}  // namespace kdajit::ref
