#include "prefill_data.hpp"

#include <algorithm>
#include <numeric>
#include <random>

#include "kdajit/kdajit.hpp"

namespace kdajit::bench {

namespace {

kdajit_tensor_t view(kdajit_dtype_t dtype, std::initializer_list<int64_t> shape,
                     std::initializer_list<int64_t> strides) {
  return tensor_view(nullptr, dtype, shape, strides);  // data: set when the buffers exist
}

// The tensors of a call with their fill (scale, offset; 0, 0: written by the
// host or zeroed), the decode grid's distributions (device_data.cpp).
struct TensorFill {
  kdajit_tensor_t kdajit_prefill_args_t::*field;
  float scale, offset;
};
constexpr TensorFill kTensors[] = {
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
  const int64_t H = c.heads, hidden = H * D, qkv = 3 * hidden, K = 3;
  const int64_t T = c.tokens(), N = c.seqs(), S = N + 4;
  kdajit_prefill_args_t a = default_prefill_args();
  a.x = view(KDAJIT_DTYPE_BF16, {T, qkv}, {qkv, 1});
  a.conv_weight = view(KDAJIT_DTYPE_F32, {3, 4, hidden}, {4 * hidden, hidden, 1});
  a.conv_state = c.conv == ConvLayout::sd ? view(KDAJIT_DTYPE_BF16, {S, qkv, K}, {qkv * K, 1, qkv})
                                          : view(KDAJIT_DTYPE_BF16, {S, qkv, K}, {qkv * K, K, 1});
  a.raw_gate = view(KDAJIT_DTYPE_BF16, {T, H, D}, {hidden, D, 1});
  a.raw_beta = view(KDAJIT_DTYPE_BF16, {T, H}, {H, 1});
  a.A_log = view(KDAJIT_DTYPE_F32, {H}, {1});
  a.dt_bias = view(KDAJIT_DTYPE_F32, {hidden}, {1});
  a.state_indices = view(KDAJIT_DTYPE_INT32, {N}, {1});
  a.state = view(c_dtype(c.state), {S, H, D, D}, {H * D * D, D * D, D, 1});
  a.output_gate = view(KDAJIT_DTYPE_BF16, {T, H, D}, {hidden, D, 1});
  a.norm_weight = view(KDAJIT_DTYPE_F32, {D}, {1});
  a.output = view(KDAJIT_DTYPE_BF16, {T, H, D}, {hidden, D, 1});
  a.query_start_loc = view(KDAJIT_DTYPE_INT32, {N + 1}, {1});
  // has_initial_state stays empty: every sequence starts from its slot.
  a.gate = KDAJIT_GATE_BOUNDED;
  a.lower_bound = -5.0f;
  a.norm_eps = 1e-6f;
  a.max_seq_len = c.longest();
  a.oob_counter = nullptr;
  return a;
}

kdajit_prefill_args_t prefill_stand_in_args(const PrefillCell& c) {
  kdajit_prefill_args_t a = prefill_layout_args(c);
  uintptr_t at = uintptr_t{1} << 36;
  for (const TensorFill& t : kTensors) {
    kdajit_tensor_t& v = a.*t.field;
    if (v.ndim > 0) v.data = reinterpret_cast<void*>(at);
    at += uintptr_t{1} << 36;
  }
  return a;
}

PrefillMetadata prefill_metadata(const PrefillCell& c, uint64_t seed) {
  const int64_t N = c.seqs(), S = N + 4;
  PrefillMetadata m;
  m.slots.resize(static_cast<size_t>(S - 1));
  std::iota(m.slots.begin(), m.slots.end(), 1);
  std::mt19937_64 rng(seed);
  std::shuffle(m.slots.begin(), m.slots.end(), rng);
  m.slots.resize(static_cast<size_t>(N));
  m.qsl.push_back(0);
  for (int32_t l : c.lengths) m.qsl.push_back(m.qsl.back() + l);
  return m;
}

size_t PrefillData::bytes_needed(const PrefillCell& c) {
  const kdajit_prefill_args_t a = prefill_layout_args(c);
  size_t n = 0;
  for (const TensorFill& t : kTensors) n += tensor_bytes(a.*t.field);
  return n;
}

Result<std::unique_ptr<PrefillData>> PrefillData::create(const PrefillCell& c, const FillKernels& fill, cudaStream_t s,
                                                         uint64_t seed, double timeout_s) {
  std::unique_ptr<PrefillData> d(new PrefillData());
  d->args_ = prefill_layout_args(c);
  kdajit_prefill_args_t& a = d->args_;
  for (const TensorFill& t : kTensors) {
    kdajit_tensor_t& v = a.*t.field;
    const size_t bytes = tensor_bytes(v);
    if (bytes == 0) continue;
    auto& buf = d->buffers_.emplace_back(std::make_unique<DeviceBuffer>());
    KDAJIT_TRY(buf->allocate(bytes));
    v.data = buf->get();
  }
  // Random values on the device, one hash stream per tensor.
  uint64_t stream_id = 0;
  for (const TensorFill& t : kTensors) {
    ++stream_id;
    const kdajit_tensor_t& v = a.*t.field;
    if (t.scale != 0.0f) KDAJIT_TRY(fill.fill(v, seed * 1000003u + stream_id, t.scale, t.offset, s));
  }
  BENCH_CUDA(cudaMemsetAsync(a.output.data, 0, tensor_bytes(a.output), s));
  const PrefillMetadata m = prefill_metadata(c, seed);
  BENCH_CUDA(cudaMemcpyAsync(a.state_indices.data, m.slots.data(), m.slots.size() * 4, cudaMemcpyHostToDevice, s));
  BENCH_CUDA(cudaMemcpyAsync(a.query_start_loc.data, m.qsl.data(), m.qsl.size() * 4, cudaMemcpyHostToDevice, s));
  // The host vectors are pageable: the copies are done when the calls return, the fills after the wait.
  KDAJIT_TRY(wait_stream(s, timeout_s, "device data fill"));
  return d;
}

}  // namespace kdajit::bench
