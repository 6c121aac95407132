// The device buffers of one prefill cell, filled on the device with fresh random
// data (the decode grid's fill kernels and distributions, device_data.hpp), and
// the prefill arguments pointing at them: bench/bench_prefill.py's problem
// (class Problem): S = N + 4 slots, every sequence live in a distinct slot of
// 1..S-1 in shuffled order and starting from it (has_initial_state empty),
// query_start_loc the running sum of the prompt lengths, max_seq_len the longest,
// conv_state of K = 3 taps, and a workspace of kdajit_prefill_workspace_bytes
// (as an engine gives every call, so that the selector may pick twopass).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "bench_cuda.hpp"
#include "device_data.hpp"
#include "kdajit/kdajit.h"
#include "prefill_grid.hpp"

namespace kdajit::bench {

// The argument views of a cell (shapes, strides, scalars); data pointers null.
kdajit_prefill_args_t prefill_layout_args(const PrefillCell& c);
// prefill_layout_args with stand-in data pointers, the workspace's too (aligned,
// never dereferenced):
// enough for validation and route selection, which read no device memory.
kdajit_prefill_args_t prefill_stand_in_args(const PrefillCell& c);

// The host-side metadata of a cell: the slot of each sequence (distinct, in
// 1..S-1, shuffled by `seed`) and query_start_loc (N + 1 entries).
struct PrefillMetadata {
  std::vector<int32_t> slots, qsl;
};
PrefillMetadata prefill_metadata(const PrefillCell& c, uint64_t seed);

class PrefillData : public DeviceArgs<kdajit_prefill_args_t> {
 public:
  static size_t bytes_needed(const PrefillCell& c);
  // Allocates, fills (every float tensor random, output zeroed), copies the
  // metadata, and waits for all of it.
  static Result<std::unique_ptr<PrefillData>> create(const PrefillCell& c, const FillKernels& fill, cudaStream_t s,
                                                     uint64_t seed, double timeout_s);

 private:
  PrefillData() = default;
  DeviceBuffer workspace_;
};

}  // namespace kdajit::bench
