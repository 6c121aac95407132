#include "prefill_data.hpp"

#include <algorithm>
#include <numeric>
#include <random>

#include "kdajit/kdajit.hpp"
#include "kdajit/routes.hpp"

namespace kdajit::bench {

namespace {

// The tensors of a call with the decode grid's distributions (device_data.cpp).
constexpr TensorFill<kdajit_prefill_args_t> kTensors[] = {
    {&kdajit_prefill_args_t::x, 1.0f, 0.0f},
    {&kdajit_prefill_args_t::conv_weight, 0.5f, 0.0f},
    {&kdajit_prefill_args_t::conv_state, 1.0f, 0.0f},
    {&kdajit_prefill_args_t::raw_gate, 1.0f, 0.0f},
    {&kdajit_prefill_args_t::raw_beta, 1.0f, 0.0f},
    {&kdajit_prefill_args_t::A_log, 0.5f, 0.0f},
    {&kdajit_prefill_args_t::dt_bias, 0.1f, 0.0f},
    {&kdajit_prefill_args_t::state_indices, 0.0f, 0.0f},
    {&kdajit_prefill_args_t::state, 0.1f, 0.0f},
    {&kdajit_prefill_args_t::output_gate, 1.0f, 0.0f},
    {&kdajit_prefill_args_t::norm_weight, 0.1f, 1.0f},
    {&kdajit_prefill_args_t::output, 0.0f, 0.0f},
    {&kdajit_prefill_args_t::query_start_loc, 0.0f, 0.0f},
};

}  // namespace

kdajit_prefill_args_t prefill_layout_args(const PrefillCell& c) {
  const int64_t N = c.seqs();
  kdajit_prefill_args_t a = default_prefill_args();
  set_shared_views(a, c.tokens(), c.heads, /*slots=*/N + 4, /*taps=*/3, c.conv, c.state);
  a.state_indices = layout_view(KDAJIT_DTYPE_INT32, {N}, {1});
  a.query_start_loc = layout_view(KDAJIT_DTYPE_INT32, {N + 1}, {1});
  // has_initial_state stays empty: every sequence starts from its slot.
  a.max_seq_len = c.longest();
  a.workspace_bytes = twopass_workspace_bytes(N, c.tokens(), c.heads);
  return a;
}

kdajit_prefill_args_t prefill_stand_in_args(const PrefillCell& c) {
  kdajit_prefill_args_t a = prefill_layout_args(c);
  set_stand_in_pointers<kdajit_prefill_args_t>(a, kTensors);
  if (a.workspace_bytes > 0) a.workspace = reinterpret_cast<void*>(uintptr_t{1} << 46);
  return a;
}

PrefillMetadata prefill_metadata(const PrefillCell& c, uint64_t seed) {
  const int64_t N = c.seqs(), S = N + 4;
  PrefillMetadata m;
  std::mt19937_64 rng(seed);
  m.slots = shuffled_slots(S, static_cast<size_t>(N), rng);
  m.qsl.push_back(0);
  for (int32_t l : c.lengths) m.qsl.push_back(m.qsl.back() + l);
  return m;
}

size_t PrefillData::bytes_needed(const PrefillCell& c) {
  const kdajit_prefill_args_t a = prefill_layout_args(c);
  return tensors_bytes<kdajit_prefill_args_t>(a, kTensors) + static_cast<size_t>(a.workspace_bytes);
}

Result<std::unique_ptr<PrefillData>> PrefillData::create(const PrefillCell& c, const FillKernels& fill, cudaStream_t s,
                                                         uint64_t seed, double timeout_s) {
  std::unique_ptr<PrefillData> d(new PrefillData());
  d->args_ = prefill_layout_args(c);
  kdajit_prefill_args_t& a = d->args_;
  KDAJIT_TRY(d->buffers_.allocate_and_fill<kdajit_prefill_args_t>(a, kTensors, fill, seed, s));
  if (a.workspace_bytes > 0) {
    KDAJIT_TRY(d->workspace_.allocate(static_cast<size_t>(a.workspace_bytes)));
    a.workspace = d->workspace_.get();
  }
  const PrefillMetadata m = prefill_metadata(c, seed);
  BENCH_CUDA(cudaMemcpyAsync(a.state_indices.data, m.slots.data(), m.slots.size() * 4, cudaMemcpyHostToDevice, s));
  BENCH_CUDA(cudaMemcpyAsync(a.query_start_loc.data, m.qsl.data(), m.qsl.size() * 4, cudaMemcpyHostToDevice, s));
  // The host vectors are pageable: the copies are done when the calls return, the fills after the wait.
  KDAJIT_TRY(wait_stream(s, timeout_s, "device data fill"));
  return d;
}

}  // namespace kdajit::bench
