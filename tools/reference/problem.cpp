#include "kdajit/problem.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "kdajit/bf16.hpp"
#include "kdajit/kdajit.hpp"
#include "kdajit/rng.hpp"
#include "view_iter.hpp"

namespace kdajit::ref {

namespace {

constexpr int64_t D = kHeadDim;

enum Stream : uint64_t { kX, kConvWeight, kConvState, kRawGate, kRawBeta, kALog, kDtBias, kState, kOutputGate, kNormWeight, kMeta };

kdajit_tensor_t make_view(kdajit_dtype_t dtype, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides) {
  return tensor_view(nullptr, dtype, shape, strides);  // data: set when the buffers exist
}

// Enough bytes for every element, and for a padded leading stride the padding after the last row.
size_t buffer_bytes(const kdajit_tensor_t& t) {
  if (t.ndim <= 0) return 0;  // a tensor the op does not take
  int64_t elems = 1;
  for (int i = 0; i < t.ndim; ++i) elems += (t.shape[i] - 1) * t.strides[i];
  if (t.ndim > 0 && t.shape[0] > 0) elems = std::max(elems, t.shape[0] * t.strides[0]);
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] == 0) elems = 0;
  return static_cast<size_t>(elems) * dtype_size(t.dtype);
}

// Fills the whole buffer with a NaN pattern (what padding keeps), then the elements.
void fill_padding(std::vector<std::byte>& b, kdajit_dtype_t dtype) {
  auto fill_with = [&b](auto pattern) {
    for (size_t i = 0; i + sizeof(pattern) <= b.size(); i += sizeof(pattern)) std::memcpy(&b[i], &pattern, sizeof(pattern));
  };
  if (dtype == KDAJIT_DTYPE_BF16) fill_with(uint16_t{0x7fc1u});
  else if (dtype == KDAJIT_DTYPE_F32) fill_with(uint32_t{0x7fc00001u});
}

// Null and out-of-range slot values: a mix of 0, -1, INT32_MIN and S, S+k, INT32_MAX.
int32_t null_slot(int k) {
  switch (k % 3) {
    case 0: return 0;
    case 1: return -1 - k;
    default: return INT32_MIN + k;
  }
}
int32_t oob_slot(int k, int64_t S) { return k % 3 == 2 ? INT32_MAX - k : static_cast<int32_t>(S + k); }

Status check_spec(const ProblemSpec& s) {
  if (s.op != KDAJIT_OP_SINGLE && s.op != KDAJIT_OP_PACKED)
    return invalid_argument(fmt::format("ProblemSpec.op: expected single or packed, got {}", static_cast<int>(s.op)));
  if (s.heads < 1 || s.heads > kMaxHeads)
    return invalid_argument(fmt::format("ProblemSpec.heads: expected 1..{}, got {}", kMaxHeads, s.heads));
  if (s.state_dtype != KDAJIT_DTYPE_F32 && s.state_dtype != KDAJIT_DTYPE_BF16)
    return invalid_argument("ProblemSpec.state_dtype: expected f32 or bf16");
  if (s.conv != KDAJIT_CONV_SD && s.conv != KDAJIT_CONV_DS) return invalid_argument("ProblemSpec.conv: expected sd or ds");
  if (s.gate != KDAJIT_GATE_BOUNDED && s.gate != KDAJIT_GATE_SOFTPLUS)
    return invalid_argument("ProblemSpec.gate: expected bounded or softplus");
  if (s.op == KDAJIT_OP_SINGLE && s.tokens != 1)
    return invalid_argument(fmt::format("ProblemSpec.tokens: expected 1 for op single, got {}", s.tokens));
  if (s.tokens < 1 || s.tokens > kMaxTokens)
    return invalid_argument(fmt::format("ProblemSpec.tokens: expected 1..{}, got {}", kMaxTokens, s.tokens));
  if (s.conv_taps != 0 && (s.conv_taps < 3 || s.conv_taps > kMaxTokens + 2))
    return invalid_argument(fmt::format("ProblemSpec.conv_taps: expected 0 (T + 2) or 3..{}, got {}", kMaxTokens + 2,
                                        s.conv_taps));
  if (s.row_pad < 0 || s.slot_pad < 0 || s.extra_rows < 0 || s.null_rows < 0 || s.oob_rows < 0 ||
      s.null_checkpoints < 0 || s.num_slots < 0 || s.rows < 0)
    return invalid_argument("ProblemSpec: rows, row_pad, slot_pad, extra_rows, null_rows, oob_rows, "
                            "null_checkpoints and num_slots must be >= 0");
  if (s.mode != KDAJIT_INDICES_UNIQUE_OR_NULL && s.null_rows > 0)
    return invalid_argument(fmt::format("ProblemSpec.null_rows: expected 0 with a positive-only indices mode, got {}", s.null_rows));
  if (s.op == KDAJIT_OP_SINGLE) {
    if (s.null_rows + s.oob_rows > s.rows)
      return invalid_argument(fmt::format("ProblemSpec: null_rows + oob_rows = {} exceeds rows = {}", s.null_rows + s.oob_rows, s.rows));
  } else {
    const auto N = static_cast<int>(s.seq_lens.size());
    // Sharing slots between sequences is only legal for unwritten source slots;
    // the generator does not produce that (see reference.hpp).
    if (s.mode == KDAJIT_INDICES_REPEATED_POSITIVE)
      return invalid_argument("ProblemSpec.mode: repeated_positive is generated for op single only");
    if (s.null_rows + s.oob_rows > N)
      return invalid_argument(fmt::format("ProblemSpec: null_rows + oob_rows = {} exceeds the {} sequences", s.null_rows + s.oob_rows, N));
    for (int L : s.seq_lens)
      if (L < 0) return invalid_argument(fmt::format("ProblemSpec.seq_lens: expected lengths >= 0, got {}", L));
    if (!s.num_accepted.empty() && s.num_accepted.size() != s.seq_lens.size())
      return invalid_argument(fmt::format("ProblemSpec.num_accepted: expected {} values (one per sequence) or none, got {}",
                                          N, s.num_accepted.size()));
  }
  return {};
}

}  // namespace

std::string_view tensor_name(Tensor t) {
  static constexpr std::string_view kNames[kNumTensors] = {
      "x", "conv_weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias", "state_indices", "state",
      "output_gate", "norm_weight", "output", "query_start_loc", "num_accepted_tokens"};
  return kNames[static_cast<int>(t)];
}

kdajit_tensor_t kdajit_decode_args_t::*tensor_field(Tensor t) {
  using A = kdajit_decode_args_t;
  static constexpr kdajit_tensor_t A::*kFields[kNumTensors] = {
      &A::x, &A::conv_weight, &A::conv_state, &A::raw_gate, &A::raw_beta, &A::A_log, &A::dt_bias,
      &A::state_indices, &A::state, &A::output_gate, &A::norm_weight, &A::output, &A::query_start_loc,
      &A::num_accepted_tokens};
  return kFields[static_cast<int>(t)];
}

bool tensor_written(Tensor t) { return t == Tensor::output || t == Tensor::conv_state || t == Tensor::state; }

ProblemSpec default_spec(const KernelKey& key, uint64_t seed) {
  ProblemSpec s;
  s.op = key.op == Op::single ? KDAJIT_OP_SINGLE : KDAJIT_OP_PACKED;
  s.heads = key.heads;
  s.state_dtype = key.state == StateDtype::f32 ? KDAJIT_DTYPE_F32 : KDAJIT_DTYPE_BF16;
  s.conv = key.conv == ConvLayout::sd ? KDAJIT_CONV_SD : KDAJIT_CONV_DS;
  s.tokens = key.tokens;
  s.gate = key.gate == Gate::bounded ? KDAJIT_GATE_BOUNDED : KDAJIT_GATE_SOFTPLUS;
  s.row_pad = 8;
  s.slot_pad = 8;
  s.seed = seed;
  if (s.op == KDAJIT_OP_SINGLE) {
    s.rows = 7;
    s.null_rows = 1;
    s.oob_rows = 1;
  } else {
    const int T = key.tokens;
    s.seq_lens = {T, 1, 0, T, std::max(T - 1, 1), T};
    s.extra_rows = 1;
    s.null_rows = 1;
    s.oob_rows = 1;
    s.null_checkpoints = T >= 3 ? 1 : 0;
  }
  return s;
}

Result<Problem> Problem::make(const ProblemSpec& spec) {
  KDAJIT_TRY(check_spec(spec));
  Problem p;
  p.spec_ = spec;
  const bool packed = spec.op == KDAJIT_OP_PACKED;
  const int64_t H = spec.heads, hidden = H * D, qkv = 3 * hidden, T = spec.tokens;
  const int64_t K = spec.conv_taps > 0 ? spec.conv_taps : T + kConvWidth - 2;
  const int64_t N = packed ? static_cast<int64_t>(spec.seq_lens.size()) : 0;
  int64_t R = spec.rows;
  if (packed) R = std::accumulate(spec.seq_lens.begin(), spec.seq_lens.end(), int64_t{0}) + spec.extra_rows;
  const int64_t live_needed = packed ? N * T : spec.rows - spec.null_rows - spec.oob_rows;
  int64_t S = spec.num_slots > 0 ? spec.num_slots : live_needed + 4;
  if (S < live_needed + 1)
    return invalid_argument(fmt::format("ProblemSpec.num_slots: expected at least {} (null slot + one per {}), got {}",
                                        live_needed + 1, packed ? "checkpoint" : "live row", S));
  p.rows_ = R;
  p.num_seqs_ = N;
  p.num_slots_ = S;

  const int64_t rp = spec.row_pad, sp = (spec.slot_pad + 7) / 8 * 8;
  kdajit_decode_args_t& a = p.args_;
  a.struct_size = sizeof a;  // this header's struct: the entry points read it whole
  a.x = make_view(KDAJIT_DTYPE_BF16, {R, qkv}, {qkv + rp, 1});
  a.conv_weight = make_view(KDAJIT_DTYPE_F32, {3, kConvWidth, hidden}, {kConvWidth * hidden, hidden, 1});
  a.conv_state = spec.conv == KDAJIT_CONV_SD ? make_view(KDAJIT_DTYPE_BF16, {S, qkv, K}, {qkv * K + sp, 1, qkv})
                                              : make_view(KDAJIT_DTYPE_BF16, {S, qkv, K}, {qkv * K + sp, K, 1});
  a.raw_gate = make_view(KDAJIT_DTYPE_BF16, {R, H, D}, {hidden + rp, D, 1});
  a.raw_beta = make_view(KDAJIT_DTYPE_BF16, {R, H}, {H + rp, 1});
  a.A_log = make_view(KDAJIT_DTYPE_F32, {H}, {1});
  a.dt_bias = make_view(KDAJIT_DTYPE_F32, {hidden}, {1});
  a.state_indices = packed ? make_view(KDAJIT_DTYPE_INT32, {N, T}, {T, 1}) : make_view(KDAJIT_DTYPE_INT32, {R}, {1});
  a.state = make_view(spec.state_dtype, {S, H, D, D}, {H * D * D + sp, D * D, D, 1});
  a.output_gate = make_view(KDAJIT_DTYPE_BF16, {R, H, D}, {hidden + rp, D, 1});
  a.norm_weight = make_view(KDAJIT_DTYPE_F32, {D}, {1});
  a.output = make_view(KDAJIT_DTYPE_BF16, {R, H, D}, {hidden + rp, D, 1});
  if (packed) {
    a.query_start_loc = make_view(KDAJIT_DTYPE_INT32, {N + 1}, {1});
    a.num_accepted_tokens = make_view(KDAJIT_DTYPE_INT32, {N}, {1});
  }
  a.gate = spec.gate;
  a.lower_bound = spec.lower_bound;
  a.norm_eps = spec.norm_eps;
  a.state_indices_mode = spec.mode;
  a.oob_counter = nullptr;

  p.buffers_.resize(kNumTensors);
  for (int i = 0; i < kNumTensors; ++i) {
    const kdajit_tensor_t& v = a.*tensor_field(static_cast<Tensor>(i));
    p.buffers_[static_cast<size_t>(i)].resize(buffer_bytes(v));
    fill_padding(p.buffers_[static_cast<size_t>(i)], v.dtype);
  }
  p.repoint();

  // Data (docs/CONTRACT.md §8), each tensor from its own stream in logical order.
  auto fill = [&](Tensor t, Stream stream, double scale, double offset) {
    Rng rng(spec.seed, stream);
    const kdajit_tensor_t& v = p.view(t);
    detail::for_each_element(v, [&](const detail::Index&, int64_t off) {
      const double val = offset + scale * rng.normal();
      std::byte* dst = static_cast<std::byte*>(v.data) + off;
      if (v.dtype == KDAJIT_DTYPE_BF16) {
        const uint16_t bits = f64_to_bf16_bits(val);
        std::memcpy(dst, &bits, 2);
      } else {
        const float f = static_cast<float>(val);
        std::memcpy(dst, &f, 4);
      }
    });
  };
  fill(Tensor::x, kX, 1.0, 0.0);
  fill(Tensor::conv_weight, kConvWeight, 0.5, 0.0);
  fill(Tensor::conv_state, kConvState, 1.0, 0.0);
  fill(Tensor::raw_gate, kRawGate, 1.0, 0.0);
  fill(Tensor::raw_beta, kRawBeta, 1.0, 0.0);
  fill(Tensor::A_log, kALog, 0.5, 0.0);
  fill(Tensor::dt_bias, kDtBias, 0.1, 0.0);
  fill(Tensor::state, kState, 0.1, 0.0);
  fill(Tensor::output_gate, kOutputGate, 1.0, 0.0);
  fill(Tensor::norm_weight, kNormWeight, 0.1, 1.0);

  // Metadata: slots from a shuffled pool of 1..S-1 (slot 0 and the spares stay untouched).
  Rng meta(spec.seed, kMeta);
  std::vector<int32_t> pool(static_cast<size_t>(S - 1));
  std::iota(pool.begin(), pool.end(), 1);
  meta.shuffle(pool);
  const kdajit_tensor_t& si = p.view(Tensor::state_indices);
  auto set_slot = [&](std::initializer_list<int64_t> idx, int32_t slot) { store(si, idx, slot); };
  int nulls = 0, oobs = 0;
  if (!packed) {
    std::vector<int64_t> order(static_cast<size_t>(R));
    std::iota(order.begin(), order.end(), 0);
    meta.shuffle(order);
    std::vector<uint8_t> kind(static_cast<size_t>(R), 0);  // 0 live, 1 null, 2 oob
    for (int i = 0; i < spec.null_rows; ++i) kind[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
    for (int i = 0; i < spec.oob_rows; ++i) kind[static_cast<size_t>(order[static_cast<size_t>(spec.null_rows + i)])] = 2;
    std::vector<int32_t> used;
    bool repeated = false;
    size_t next = 0;
    for (int64_t r = 0; r < R; ++r) {
      if (kind[static_cast<size_t>(r)] == 1) { set_slot({r}, null_slot(nulls++)); continue; }
      if (kind[static_cast<size_t>(r)] == 2) { set_slot({r}, oob_slot(oobs++, S)); continue; }
      int32_t slot = pool[next++];
      if (spec.mode == KDAJIT_INDICES_REPEATED_POSITIVE && !used.empty()) {
        const bool last_live = std::none_of(kind.begin() + r + 1, kind.end(), [](uint8_t k) { return k == 0; });
        if (meta.below(3) == 0 || (last_live && !repeated)) {
          slot = used[static_cast<size_t>(meta.below(static_cast<int64_t>(used.size())))];
          repeated = true;
        }
      }
      used.push_back(slot);
      set_slot({r}, slot);
    }
  } else {
    std::vector<int64_t> accepted(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) {
      const int32_t na = spec.num_accepted.empty() ? static_cast<int32_t>(1 + meta.below(T)) : spec.num_accepted[static_cast<size_t>(n)];
      store(p.view(Tensor::num_accepted_tokens), {n}, na);
      accepted[static_cast<size_t>(n)] = std::clamp<int64_t>(na, 1, T);
      for (int64_t t = 0; t < T; ++t) set_slot({n, t}, pool[static_cast<size_t>(n * T + t)]);
    }
    int64_t q = 0;
    for (int64_t n = 0; n <= N; ++n) {
      store(p.view(Tensor::query_start_loc), {n}, static_cast<double>(q));
      if (n < N) q += spec.seq_lens[static_cast<size_t>(n)];
    }
    std::vector<int64_t> order(static_cast<size_t>(N));
    std::iota(order.begin(), order.end(), 0);
    meta.shuffle(order);
    // Break cs (token 0) or src (token a-1) of the chosen sequences.
    for (int i = 0; i < spec.null_rows + spec.oob_rows; ++i) {
      const int64_t n = order[static_cast<size_t>(i)];
      const int64_t t = meta.below(2) == 0 ? 0 : accepted[static_cast<size_t>(n)] - 1;
      set_slot({n, t}, i < spec.null_rows ? null_slot(nulls++) : oob_slot(oobs++, S));
    }
    std::vector<std::pair<int64_t, int64_t>> spots;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t t = 1; t < T; ++t)
        if (t != accepted[static_cast<size_t>(n)] - 1) spots.emplace_back(n, t);
    if (static_cast<int64_t>(spots.size()) < spec.null_checkpoints)
      return invalid_argument(fmt::format("ProblemSpec.null_checkpoints: at most {} entries (t not 0 or a-1) exist, got {}",
                                          spots.size(), spec.null_checkpoints));
    meta.shuffle(spots);
    for (int i = 0; i < spec.null_checkpoints; ++i) {
      const auto [n, t] = spots[static_cast<size_t>(i)];
      const bool use_null = spec.mode == KDAJIT_INDICES_UNIQUE_OR_NULL && i % 2 == 0;
      set_slot({n, t}, use_null ? null_slot(nulls++) : oob_slot(oobs++, S));
    }
  }
  p.poison_outputs();
  return p;
}

Problem::Problem(const Problem& o)
    : spec_(o.spec_), rows_(o.rows_), num_seqs_(o.num_seqs_), num_slots_(o.num_slots_), args_(o.args_),
      buffers_(o.buffers_), initial_(o.initial_) {
  repoint();
}

Problem& Problem::operator=(const Problem& o) {
  if (this != &o) {
    Problem copy(o);
    *this = std::move(copy);
  }
  return *this;
}

Problem::Problem(Problem&& o) noexcept
    : spec_(std::move(o.spec_)), rows_(o.rows_), num_seqs_(o.num_seqs_), num_slots_(o.num_slots_), args_(o.args_),
      buffers_(std::move(o.buffers_)), initial_(std::move(o.initial_)) {
  repoint();
}

Problem& Problem::operator=(Problem&& o) noexcept {
  spec_ = std::move(o.spec_);
  rows_ = o.rows_;
  num_seqs_ = o.num_seqs_;
  num_slots_ = o.num_slots_;
  args_ = o.args_;
  buffers_ = std::move(o.buffers_);
  initial_ = std::move(o.initial_);
  repoint();
  return *this;
}

void Problem::repoint() {
  for (int i = 0; i < kNumTensors; ++i) {
    auto& b = buffers_[static_cast<size_t>(i)];
    (args_.*tensor_field(static_cast<Tensor>(i))).data = b.empty() ? nullptr : b.data();
  }
}

std::vector<BufferRef> Problem::buffers() {
  std::vector<BufferRef> out;
  for (int i = 0; i < kNumTensors; ++i) {
    const auto t = static_cast<Tensor>(i);
    if (!bytes(t).empty()) out.push_back({t, tensor_name(t), &bytes(t), tensor_field(t), tensor_written(t)});
  }
  return out;
}

void Problem::poison_outputs() {
  const kdajit_tensor_t& out = view(Tensor::output);
  detail::for_each_element(out, [&](const detail::Index&, int64_t off) {
    const uint16_t poison = 0xffff;
    std::memcpy(static_cast<std::byte*>(out.data) + off, &poison, 2);
  });
  snapshot();
}

void Problem::snapshot() {
  initial_ = std::make_shared<const std::vector<std::vector<std::byte>>>(buffers_);
}

Status Problem::run_reference(Capture* capture) { return decode(spec_.op, args_, capture); }

namespace {
kdajit_tensor_t int32_view(const std::vector<int32_t>& v) {
  return dense_tensor_view(const_cast<int32_t*>(v.data()), KDAJIT_DTYPE_INT32, {static_cast<int64_t>(v.size())});
}
}  // namespace

PrefillArgs prefill_args(const Problem& p, const PrefillMeta& meta) {
  PrefillArgs f;
  copy_shared_fields(p.args(), f);
  f.state_indices = int32_view(meta.slots);
  f.query_start_loc = int32_view(meta.qsl);
  f.has_initial_state = int32_view(meta.initial);  // empty: shape [0]
  return f;
}

}  // namespace kdajit::ref
