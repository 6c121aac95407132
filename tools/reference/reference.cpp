#include "kdajit/reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "kdajit/bf16.hpp"
#include "kdajit/kdajit.hpp"
#include "kdajit/kernel_key.hpp"

namespace kdajit::ref {

size_t dtype_size(kdajit_dtype_t dtype) { return dtype == KDAJIT_DTYPE_BF16 ? 2 : 4; }

int64_t element_offset_bytes(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx) {
  int64_t off = 0;
  int i = 0;
  for (int64_t v : idx) off += v * t.strides[i++];
  return off * static_cast<int64_t>(dtype_size(t.dtype));
}

namespace {

std::byte* element_ptr(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx) {
  return static_cast<std::byte*>(t.data) + element_offset_bytes(t, idx);
}

// One element's conversion to and from f64 (load(), store() and the state rows).
double value_from(const std::byte* p, kdajit_dtype_t dtype) {
  switch (dtype) {
    case KDAJIT_DTYPE_F32: { float f; std::memcpy(&f, p, 4); return f; }
    case KDAJIT_DTYPE_BF16: { uint16_t b; std::memcpy(&b, p, 2); return bf16_bits_to_f64(b); }
    case KDAJIT_DTYPE_INT32: { int32_t i; std::memcpy(&i, p, 4); return i; }
  }
  return 0.0;
}

void value_to(std::byte* p, kdajit_dtype_t dtype, double value) {
  switch (dtype) {
    case KDAJIT_DTYPE_F32: { float f = static_cast<float>(value); std::memcpy(p, &f, 4); return; }
    case KDAJIT_DTYPE_BF16: { uint16_t b = f64_to_bf16_bits(value); std::memcpy(p, &b, 2); return; }
    case KDAJIT_DTYPE_INT32: { int32_t i = static_cast<int32_t>(value); std::memcpy(p, &i, 4); return; }
  }
}

}  // namespace

double load(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx) { return value_from(element_ptr(t, idx), t.dtype); }

void store(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx, double value) {
  value_to(element_ptr(t, idx), t.dtype, value);
}

uint16_t load_bits16(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx) {
  uint16_t b;
  std::memcpy(&b, element_ptr(t, idx), 2);
  return b;
}

void store_bits16(const kdajit_tensor_t& t, std::initializer_list<int64_t> idx, uint16_t bits) {
  std::memcpy(element_ptr(t, idx), &bits, 2);
}

namespace {

constexpr int64_t D = kHeadDim;
constexpr int64_t W = kConvWidth;

std::string_view dtype_name(kdajit_dtype_t d) {
  switch (d) {
    case KDAJIT_DTYPE_F32: return to_string(StateDtype::f32);
    case KDAJIT_DTYPE_BF16: return to_string(StateDtype::bf16);
    case KDAJIT_DTYPE_INT32: return "int32";
  }
  return "?";
}

std::string shape_string(const kdajit_tensor_t& t) {
  std::string s = "[";
  for (int i = 0; i < std::clamp(t.ndim, 0, KDAJIT_MAX_DIMS); ++i) s += fmt::format("{}{}", i ? ", " : "", t.shape[i]);
  return s + "]";
}

int64_t numel(const kdajit_tensor_t& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

// dtype, ndim and shape; data may be null only for an empty tensor.
Status check_view(const kdajit_tensor_t& t, std::string_view name, std::initializer_list<kdajit_dtype_t> dtypes,
                  std::initializer_list<int64_t> shape) {
  std::string want_dtype;
  bool dtype_ok = false;
  for (auto d : dtypes) {
    want_dtype += fmt::format("{}{}", want_dtype.empty() ? "" : "|", dtype_name(d));
    dtype_ok = dtype_ok || t.dtype == d;
  }
  std::string want_shape = "[";
  bool shape_ok = t.ndim == static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t s : shape) {
    want_shape += fmt::format("{}{}", i ? ", " : "", s);
    shape_ok = shape_ok && t.shape[i] == s;
    ++i;
  }
  want_shape += "]";
  if (!dtype_ok || !shape_ok)
    return invalid_argument(fmt::format("{}: expected {} {}, got {} {}", name, want_dtype, want_shape,
                                        dtype_name(t.dtype), shape_string(t)));
  if (t.data == nullptr && numel(t) > 0)
    return invalid_argument(fmt::format("{}: expected a host pointer, got null", name));
  return {};
}

struct Geometry {
  bool packed = false;
  int64_t R = 0, H = 0, hidden = 0, qkv = 0, S = 0, T = 1, K = 3, N = 0;
};

Result<Geometry> check_args(kdajit_op_t op, const kdajit_decode_args_t& a) {
  if (op != KDAJIT_OP_SINGLE && op != KDAJIT_OP_PACKED)
    return invalid_argument(fmt::format("op: expected single (0) or packed (1), got {}", static_cast<int>(op)));
  Geometry g;
  g.packed = op == KDAJIT_OP_PACKED;
  if (a.A_log.ndim != 1 || a.A_log.shape[0] < 1 || a.A_log.shape[0] > kMaxHeads)
    return invalid_argument(fmt::format("A_log: expected f32 [H] with 1 <= H <= {}, got {}", kMaxHeads, shape_string(a.A_log)));
  if (a.x.ndim != 2 || a.x.shape[0] < 0)
    return invalid_argument(fmt::format("x: expected bf16 [R, qkv], got {}", shape_string(a.x)));
  if (a.state.ndim != 4 || a.state.shape[0] < 1)
    return invalid_argument(fmt::format("state: expected [S, H, 128, 128] with S >= 1, got {}", shape_string(a.state)));
  g.H = a.A_log.shape[0];
  g.hidden = g.H * D;
  g.qkv = 3 * g.hidden;
  g.R = a.x.shape[0];
  g.S = a.state.shape[0];
  if (g.packed) {
    if (a.state_indices.ndim != 2 || a.state_indices.shape[0] < 0 || a.state_indices.shape[1] < 1)
      return invalid_argument(fmt::format("state_indices: expected int32 [N, T] with T >= 1, got {}",
                                          shape_string(a.state_indices)));
    g.N = a.state_indices.shape[0];
    g.T = a.state_indices.shape[1];
  }
  g.K = g.T + W - 2;
  KDAJIT_TRY(check_view(a.x, "x", {KDAJIT_DTYPE_BF16}, {g.R, g.qkv}));
  KDAJIT_TRY(check_view(a.conv_weight, "conv_weight", {KDAJIT_DTYPE_F32}, {3, W, g.hidden}));
  KDAJIT_TRY(check_view(a.conv_state, "conv_state", {KDAJIT_DTYPE_BF16}, {g.S, g.qkv, g.K}));
  KDAJIT_TRY(check_view(a.raw_gate, "raw_gate", {KDAJIT_DTYPE_BF16}, {g.R, g.H, D}));
  KDAJIT_TRY(check_view(a.raw_beta, "raw_beta", {KDAJIT_DTYPE_BF16}, {g.R, g.H}));
  KDAJIT_TRY(check_view(a.A_log, "A_log", {KDAJIT_DTYPE_F32}, {g.H}));
  KDAJIT_TRY(check_view(a.dt_bias, "dt_bias", {KDAJIT_DTYPE_F32}, {g.hidden}));
  if (g.packed)
    KDAJIT_TRY(check_view(a.state_indices, "state_indices", {KDAJIT_DTYPE_INT32}, {g.N, g.T}));
  else
    KDAJIT_TRY(check_view(a.state_indices, "state_indices", {KDAJIT_DTYPE_INT32}, {g.R}));
  KDAJIT_TRY(check_view(a.state, "state", {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16}, {g.S, g.H, D, D}));
  KDAJIT_TRY(check_view(a.output_gate, "output_gate", {KDAJIT_DTYPE_BF16}, {g.R, g.H, D}));
  KDAJIT_TRY(check_view(a.norm_weight, "norm_weight", {KDAJIT_DTYPE_F32}, {D}));
  KDAJIT_TRY(check_view(a.output, "output", {KDAJIT_DTYPE_BF16}, {g.R, g.H, D}));
  if (g.packed) {
    KDAJIT_TRY(check_view(a.query_start_loc, "query_start_loc", {KDAJIT_DTYPE_INT32}, {g.N + 1}));
    KDAJIT_TRY(check_view(a.num_accepted_tokens, "num_accepted_tokens", {KDAJIT_DTYPE_INT32}, {g.N}));
  }
  if (a.gate != KDAJIT_GATE_BOUNDED && a.gate != KDAJIT_GATE_SOFTPLUS)
    return invalid_argument(fmt::format("gate: expected bounded (0) or softplus (1), got {}", static_cast<int>(a.gate)));
  if (a.gate == KDAJIT_GATE_BOUNDED && !(std::isfinite(a.lower_bound) && a.lower_bound < 0.0f))
    return invalid_argument(fmt::format("lower_bound: expected a finite value < 0 for the bounded gate, got {}", a.lower_bound));
  if (!(std::isfinite(a.norm_eps) && a.norm_eps >= 0.0f))
    return invalid_argument(fmt::format("norm_eps: expected a finite value >= 0, got {}", a.norm_eps));
  return g;
}

// One unit of work: a packed or prefill sequence, or one row of the single op (T = 1).
struct Seq {
  int64_t row0 = 0, len = 0;
  int64_t accepted = 1;
  int64_t conv_slot = 0, src_slot = 0;
  std::vector<int64_t> ckpt;  // [len]: slot to store the state after token t, or -1
  bool live = false;
  bool zero_start = false;    // prefill without initial state: zero history and state, nothing read
  // The conv window (3 history taps, then the L x) is written back from
  // position conv_first on, conv_count taps: decode ops 1 and L + 2 (old taps
  // a, a+1, then every x), prefill L and 3 (the newest three).
  int64_t conv_first = 1, conv_count = 0;
};

std::vector<Seq> plan_sequences(const Geometry& g, const kdajit_decode_args_t& a) {
  auto valid = [&](int64_t s) { return s >= 1 && s < g.S; };
  std::vector<Seq> seqs;
  if (!g.packed) {
    seqs.resize(static_cast<size_t>(g.R));
    for (int64_t r = 0; r < g.R; ++r) {
      const auto s = static_cast<int64_t>(load(a.state_indices, {r}));
      Seq& q = seqs[static_cast<size_t>(r)];
      q.row0 = r;
      q.len = 1;
      q.conv_slot = q.src_slot = s;
      q.live = valid(s);
      q.ckpt = {q.live ? s : -1};
      q.conv_count = 3;
    }
    return seqs;
  }
  seqs.resize(static_cast<size_t>(g.N));
  for (int64_t n = 0; n < g.N; ++n) {
    Seq& q = seqs[static_cast<size_t>(n)];
    const auto q0 = static_cast<int64_t>(load(a.query_start_loc, {n}));
    const auto q1 = static_cast<int64_t>(load(a.query_start_loc, {n + 1}));
    q.row0 = q0;
    q.len = q1 - q0;
    q.accepted = std::clamp<int64_t>(static_cast<int64_t>(load(a.num_accepted_tokens, {n})), 1, g.T);
    q.conv_slot = static_cast<int64_t>(load(a.state_indices, {n, 0}));
    q.src_slot = static_cast<int64_t>(load(a.state_indices, {n, q.accepted - 1}));
    q.live = q.len > 0 && q.len <= g.T && q0 >= 0 && q1 <= g.R && valid(q.conv_slot) && valid(q.src_slot);
    if (!q.live) continue;
    q.conv_count = q.len + 2;
    q.ckpt.resize(static_cast<size_t>(q.len));
    for (int64_t t = 0; t < q.len; ++t) {
      const auto s = static_cast<int64_t>(load(a.state_indices, {n, t}));
      q.ckpt[static_cast<size_t>(t)] = valid(s) ? s : -1;
    }
  }
  return seqs;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Row v of head h of state slot s, D elements through the strides (a row at
// a time: the reference moves ~1e8 state elements per GPU test run).
void load_state_row(const kdajit_tensor_t& t, int64_t s, int64_t h, int64_t v, double* out) {
  const std::byte* p = element_ptr(t, {s, h, v, 0});
  const int64_t step = t.strides[3] * static_cast<int64_t>(dtype_size(t.dtype));
  for (int64_t k = 0; k < D; ++k, p += step) out[k] = value_from(p, t.dtype);
}
void store_state_row(const kdajit_tensor_t& t, int64_t s, int64_t h, int64_t v, const double* in) {
  std::byte* p = element_ptr(t, {s, h, v, 0});
  const int64_t step = t.strides[3] * static_cast<int64_t>(dtype_size(t.dtype));
  for (int64_t k = 0; k < D; ++k, p += step) value_to(p, t.dtype, in[k]);
}

// Steps 1-7 of the spec for every token of one live sequence, head by head.
void run_sequence(const Geometry& g, const kdajit_decode_args_t& a, const Seq& q, Capture* capture) {
  const int64_t L = q.len, win_len = L + 3;
  const int64_t ch = 3 * D;  // this head's q, k and v channels
  std::vector<uint16_t> win_bits(static_cast<size_t>(ch * win_len));
  std::vector<double> win(win_bits.size()), weight(static_cast<size_t>(ch * W));
  std::vector<double> S(static_cast<size_t>(D * D)), m(static_cast<size_t>(ch));
  std::vector<double> decay(D), o(D), ob(D);

  for (int64_t h = 0; h < g.H; ++h) {
    // All reads of this (sequence, head) precede its writes.
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t c = j * g.hidden + h * D + d, lc = j * D + d;
        for (int64_t w = 0; w < 3; ++w)
          win_bits[static_cast<size_t>(lc * win_len + w)] =
              q.zero_start ? uint16_t{0} : load_bits16(a.conv_state, {q.conv_slot, c, q.accepted - 1 + w});
        for (int64_t t = 0; t < L; ++t)
          win_bits[static_cast<size_t>(lc * win_len + 3 + t)] = load_bits16(a.x, {q.row0 + t, c});
        for (int64_t w = 0; w < W; ++w) weight[static_cast<size_t>(lc * W + w)] = load(a.conv_weight, {j, w, h * D + d});
      }
    for (size_t i = 0; i < win.size(); ++i) win[i] = bf16_bits_to_f64(win_bits[i]);
    if (q.zero_start)
      std::fill(S.begin(), S.end(), 0.0);
    else
      for (int64_t v = 0; v < D; ++v) load_state_row(a.state, q.src_slot, h, v, S.data() + v * D);
    const double A = std::exp(load(a.A_log, {h}));

    for (int64_t t = 0; t < L; ++t) {
      const int64_t r = q.row0 + t;
      // 1. conv over the window (3 history taps, then x) + SiLU, rounding point 1.
      for (int64_t lc = 0; lc < ch; ++lc) {
        double acc = 0.0;
        for (int64_t w = 0; w < W; ++w)
          acc += weight[static_cast<size_t>(lc * W + w)] * win[static_cast<size_t>(lc * win_len + t + w)];
        m[static_cast<size_t>(lc)] = round_bf16(acc * sigmoid(acc));
      }
      // 2-3. split and l2-normalize q (with the D^-1/2 scale) and k.
      const double* qv = m.data();
      const double* kv = m.data() + D;
      const double* vv = m.data() + 2 * D;
      double qss = 0.0, kss = 0.0;
      for (int64_t i = 0; i < D; ++i) {
        qss += qv[i] * qv[i];
        kss += kv[i] * kv[i];
      }
      const double qscale = 1.0 / std::sqrt(qss + 1e-6) / std::sqrt(static_cast<double>(D));
      const double kscale = 1.0 / std::sqrt(kss + 1e-6);
      double qn[D], kn[D];
      for (int64_t i = 0; i < D; ++i) {
        qn[i] = qv[i] * qscale;
        kn[i] = kv[i] * kscale;
      }
      // 4. gate.
      for (int64_t k = 0; k < D; ++k) {
        const double gl = load(a.raw_gate, {r, h, k}) + load(a.dt_bias, {h * D + k});
        double gv;
        if (a.gate == KDAJIT_GATE_BOUNDED) {
          gv = static_cast<double>(a.lower_bound) * sigmoid(A * gl);
        } else {
          const double sp = gl > 20.0 ? gl : std::log1p(std::exp(gl));
          gv = -A * sp;
        }
        decay[static_cast<size_t>(k)] = std::exp(gv);
      }
      // 5. beta.
      const double beta = sigmoid(load(a.raw_beta, {r, h}));
      // 6. delta rule; the carry S stays unrounded.
      for (int64_t v = 0; v < D; ++v) {
        double* Sv = S.data() + v * D;
        double u = 0.0;
        for (int64_t k = 0; k < D; ++k) {
          Sv[k] *= decay[static_cast<size_t>(k)];
          u += Sv[k] * kn[k];
        }
        const double delta = beta * (vv[v] - u);
        double ov = 0.0;
        for (int64_t k = 0; k < D; ++k) {
          Sv[k] += delta * kn[k];
          ov += Sv[k] * qn[k];
        }
        o[static_cast<size_t>(v)] = ov;
      }
      const int64_t ck = q.ckpt[static_cast<size_t>(t)];
      if (ck >= 0)  // rounding point 2 (store() rounds to the state dtype)
        for (int64_t v = 0; v < D; ++v) store_state_row(a.state, ck, h, v, S.data() + v * D);
      // 7. gated RMSNorm, rounding points 3 and 4.
      double ss = 0.0;
      for (int64_t v = 0; v < D; ++v) {
        ob[static_cast<size_t>(v)] = round_bf16(o[static_cast<size_t>(v)]);
        ss += ob[static_cast<size_t>(v)] * ob[static_cast<size_t>(v)];
      }
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(D) + static_cast<double>(a.norm_eps));
      for (int64_t v = 0; v < D; ++v) {
        const double y = ob[static_cast<size_t>(v)] * inv * load(a.norm_weight, {v}) *
                         sigmoid(load(a.output_gate, {r, h, v}));
        if (capture) capture->output[static_cast<size_t>((r * g.H + h) * D + v)] = y;
        store(a.output, {r, h, v}, y);
      }
    }
    // The new conv window: window positions conv_first.. to taps 0..conv_count-1.
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t c = j * g.hidden + h * D + d, lc = j * D + d;
        for (int64_t p = 0; p < q.conv_count; ++p)
          store_bits16(a.conv_state, {q.conv_slot, c, p},
                       win_bits[static_cast<size_t>(lc * win_len + q.conv_first + p)]);
      }
  }
}

}  // namespace

Status decode(kdajit_op_t op, const kdajit_decode_args_t& args, Capture* capture) {
  KDAJIT_TRY_ASSIGN(const Geometry g, check_args(op, args));
  if (capture) capture->output.assign(static_cast<size_t>(g.R * g.H * D), 0.0);
  // Rows that no live sequence computes stay zero.
  for (int64_t r = 0; r < g.R; ++r)
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t v = 0; v < D; ++v) store_bits16(args.output, {r, h, v}, 0);
  for (const Seq& q : plan_sequences(g, args))
    if (q.live) run_sequence(g, args, q, capture);
  return {};
}

namespace {

// A prefill call as the runner sees it: the decode ops' fields under the same
// names (the single op's geometry, R = T_total rows, with this call's K and
// slots) and every sequence with its liveness by the rules of reference.hpp.
struct PrefillPlan {
  kdajit_decode_args_t a{};
  Geometry g;
  std::vector<Seq> seqs;           // [N]
  std::vector<int32_t> row_slots;  // backs a.state_indices for the geometry check (all null)
};

Result<PrefillPlan> plan_prefill(const PrefillArgs& p) {
  PrefillPlan plan;
  kdajit_decode_args_t& a = plan.a;
  a.x = p.x;
  a.conv_weight = p.conv_weight;
  a.conv_state = p.conv_state;
  a.raw_gate = p.raw_gate;
  a.raw_beta = p.raw_beta;
  a.A_log = p.A_log;
  a.dt_bias = p.dt_bias;
  a.state = p.state;
  a.output_gate = p.output_gate;
  a.norm_weight = p.norm_weight;
  a.output = p.output;
  a.gate = p.gate;
  a.lower_bound = p.lower_bound;
  a.norm_eps = p.norm_eps;
  if (p.conv_state.ndim != 3 || p.conv_state.shape[2] < 3 || p.conv_state.shape[2] > kMaxTokens + 2)
    return invalid_argument(fmt::format("conv_state: expected bf16 [S, 3*H*128, K] with K in 3..{}, got {}",
                                        kMaxTokens + 2, shape_string(p.conv_state)));
  if (p.state_indices.ndim != 1 || p.state_indices.shape[0] < 0)
    return invalid_argument(fmt::format("state_indices: expected int32 [N], got {}", shape_string(p.state_indices)));
  const int64_t N = p.state_indices.shape[0];
  plan.row_slots.assign(static_cast<size_t>(std::max<int64_t>(p.x.ndim == 2 ? p.x.shape[0] : 0, 0)), 0);
  a.state_indices =
      dense_tensor_view(plan.row_slots.data(), KDAJIT_DTYPE_INT32, {static_cast<int64_t>(plan.row_slots.size())});
  kdajit_tensor_t conv3 = p.conv_state;
  conv3.shape[2] = 3;
  a.conv_state = conv3;
  KDAJIT_TRY_ASSIGN(plan.g, check_args(KDAJIT_OP_SINGLE, a));
  a.conv_state = p.conv_state;
  plan.g.K = p.conv_state.shape[2];
  KDAJIT_TRY(check_view(p.state_indices, "state_indices", {KDAJIT_DTYPE_INT32}, {N}));
  KDAJIT_TRY(check_view(p.query_start_loc, "query_start_loc", {KDAJIT_DTYPE_INT32}, {N + 1}));
  // Empty (ndim 0, or shape [0]): every sequence starts from its slot (kdajit.h).
  const kdajit_tensor_t& hi = p.has_initial_state;
  const bool all_initial = hi.ndim == 0 || (hi.ndim == 1 && hi.shape[0] == 0);
  if (!all_initial) KDAJIT_TRY(check_view(p.has_initial_state, "has_initial_state", {KDAJIT_DTYPE_INT32}, {N}));

  const Geometry& g = plan.g;
  plan.seqs.resize(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    Seq& q = plan.seqs[static_cast<size_t>(n)];
    const auto q0 = static_cast<int64_t>(load(p.query_start_loc, {n}));
    const auto q1 = static_cast<int64_t>(load(p.query_start_loc, {n + 1}));
    const auto s = static_cast<int64_t>(load(p.state_indices, {n}));
    q.row0 = q0;
    q.len = q1 - q0;
    q.conv_slot = q.src_slot = s;
    q.live = q0 >= 0 && q0 <= q1 && q1 <= g.R && q.len > 0 && s >= 1 && s < g.S;
    if (!q.live) continue;
    q.zero_start = !all_initial && load(p.has_initial_state, {n}) == 0.0;
    q.ckpt.assign(static_cast<size_t>(q.len), -1);
    q.ckpt.back() = s;
    q.conv_first = q.len;
    q.conv_count = 3;
  }
  return plan;
}

}  // namespace

Status prefill(const PrefillArgs& p, Capture* capture) {
  KDAJIT_TRY_ASSIGN(const PrefillPlan plan, plan_prefill(p));
  const Geometry& g = plan.g;
  if (capture) capture->output.assign(static_cast<size_t>(g.R * g.H * D), 0.0);
  for (int64_t r = 0; r < g.R; ++r)
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t v = 0; v < D; ++v) store_bits16(plan.a.output, {r, h, v}, 0);
  for (const Seq& q : plan.seqs)
    if (q.live) run_sequence(g, plan.a, q, capture);
  return {};
}

Result<WritePlan> plan_prefill_writes(const PrefillArgs& args) {
  KDAJIT_TRY_ASSIGN(const PrefillPlan plan, plan_prefill(args));
  WritePlan w;
  w.rows = plan.g.R;
  w.heads = plan.g.H;
  w.slots = plan.g.S;
  w.row_live.assign(static_cast<size_t>(plan.g.R), 0);
  w.state_written.assign(static_cast<size_t>(plan.g.S), 0);
  w.conv_taps_written.assign(static_cast<size_t>(plan.g.S), 0);
  for (const Seq& q : plan.seqs) {
    if (!q.live) continue;
    for (int64_t t = 0; t < q.len; ++t) w.row_live[static_cast<size_t>(q.row0 + t)] = 1;
    w.state_written[static_cast<size_t>(q.conv_slot)] = 1;
    w.conv_taps_written[static_cast<size_t>(q.conv_slot)] = static_cast<int32_t>(q.conv_count);
  }
  return w;
}

Status single_decode(const kdajit_decode_args_t& args, Capture* capture) {
  return decode(KDAJIT_OP_SINGLE, args, capture);
}

Status chunk(const kdajit_chunk_args_t& a, Capture* capture) {
  if (a.A_log.ndim != 1 || a.A_log.shape[0] < 1)
    return invalid_argument(fmt::format("A_log: expected f32 [H], got {}", shape_string(a.A_log)));
  const int64_t H = a.A_log.shape[0];
  if (a.q.ndim != 3 || a.cu_seqlens.ndim != 1 || a.cu_seqlens.shape[0] < 2)
    return invalid_argument("q, cu_seqlens: expected [T_total, H, 128] and [N+1]");
  const int64_t R = a.q.shape[0], N = a.cu_seqlens.shape[0] - 1;
  KDAJIT_TRY(check_view(a.A_log, "A_log", {KDAJIT_DTYPE_F32}, {H}));
  for (const auto& [t, name] : {std::pair{&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"}, {&a.output, "output"}})
    KDAJIT_TRY(check_view(*t, name, {KDAJIT_DTYPE_BF16}, {R, H, D}));
  KDAJIT_TRY(check_view(a.g, "g", {KDAJIT_DTYPE_BF16, KDAJIT_DTYPE_F32}, {R, H, D}));
  KDAJIT_TRY(check_view(a.beta, "beta", {KDAJIT_DTYPE_BF16, KDAJIT_DTYPE_F32}, {R, H}));
  KDAJIT_TRY(check_view(a.cu_seqlens, "cu_seqlens", {KDAJIT_DTYPE_INT32}, {N + 1}));
  const auto given = [](const kdajit_tensor_t& t) { return !(t.ndim == 0 || (t.ndim == 1 && t.shape[0] == 0)); };
  const bool has_bias = given(a.dt_bias), has_initial = given(a.initial_state), has_final = given(a.final_state);
  if (has_bias) KDAJIT_TRY(check_view(a.dt_bias, "dt_bias", {KDAJIT_DTYPE_F32}, {H * D}));
  if (has_initial)
    KDAJIT_TRY(check_view(a.initial_state, "initial_state", {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16}, {N, H, D, D}));
  if (has_final)
    KDAJIT_TRY(check_view(a.final_state, "final_state", {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16}, {N, H, D, D}));
  if (capture) capture->output.assign(static_cast<size_t>(R * H * D), 0.0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t v = 0; v < D; ++v) store_bits16(a.output, {r, h, v}, 0);

  std::vector<double> S(static_cast<size_t>(D * D)), decay(D), qn(D), kn(D);
  for (int64_t n = 0; n < N; ++n) {
    const auto q0 = static_cast<int64_t>(load(a.cu_seqlens, {n}));
    const auto q1 = static_cast<int64_t>(load(a.cu_seqlens, {n + 1}));
    if (!(q0 >= 0 && q0 <= q1 && q1 <= R)) continue;  // not live
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t v = 0; v < D; ++v)
        for (int64_t k = 0; k < D; ++k)
          S[static_cast<size_t>(v * D + k)] =
              !has_initial ? 0.0
              : a.state_v_first ? load(a.initial_state, {n, h, v, k})
                                : load(a.initial_state, {n, h, k, v});
      const double A = std::exp(load(a.A_log, {h}));
      for (int64_t r = q0; r < q1; ++r) {
        double qss = 0.0, kss = 0.0;
        for (int64_t i = 0; i < D; ++i) {
          qn[static_cast<size_t>(i)] = load(a.q, {r, h, i});
          kn[static_cast<size_t>(i)] = load(a.k, {r, h, i});
          qss += qn[static_cast<size_t>(i)] * qn[static_cast<size_t>(i)];
          kss += kn[static_cast<size_t>(i)] * kn[static_cast<size_t>(i)];
        }
        const double qs = static_cast<double>(a.scale) * (a.qk_l2norm ? 1.0 / std::sqrt(qss + 1e-6) : 1.0);
        const double ks = a.qk_l2norm ? 1.0 / std::sqrt(kss + 1e-6) : 1.0;
        for (int64_t i = 0; i < D; ++i) {
          qn[static_cast<size_t>(i)] *= qs;
          kn[static_cast<size_t>(i)] *= ks;
        }
        for (int64_t k = 0; k < D; ++k) {
          const double gl = load(a.g, {r, h, k}) + (has_bias ? load(a.dt_bias, {h * D + k}) : 0.0);
          const double gv = a.gate == KDAJIT_GATE_BOUNDED ? static_cast<double>(a.lower_bound) * sigmoid(A * gl)
                                                          : -A * (gl > 20.0 ? gl : std::log1p(std::exp(gl)));
          decay[static_cast<size_t>(k)] = std::exp(gv);
        }
        const double braw = load(a.beta, {r, h});
        const double beta = a.beta_sigmoid ? sigmoid(braw) : braw;
        for (int64_t v = 0; v < D; ++v) {
          double* Sv = S.data() + v * D;
          double u = 0.0;
          for (int64_t k = 0; k < D; ++k) {
            Sv[k] *= decay[static_cast<size_t>(k)];
            u += Sv[k] * kn[static_cast<size_t>(k)];
          }
          const double delta = beta * (load(a.v, {r, h, v}) - u);
          double o = 0.0;
          for (int64_t k = 0; k < D; ++k) {
            Sv[k] += delta * kn[static_cast<size_t>(k)];
            o += Sv[k] * qn[static_cast<size_t>(k)];
          }
          if (capture) capture->output[static_cast<size_t>((r * H + h) * D + v)] = o;
          store(a.output, {r, h, v}, o);
        }
      }
      if (has_final)
        for (int64_t v = 0; v < D; ++v)
          for (int64_t k = 0; k < D; ++k) {
            const double x = S[static_cast<size_t>(v * D + k)];
            if (a.state_v_first) store(a.final_state, {n, h, v, k}, x);
            else store(a.final_state, {n, h, k, v}, x);
          }
    }
  }
  return {};
}

Status packed_decode(const kdajit_decode_args_t& args, Capture* capture) {
  return decode(KDAJIT_OP_PACKED, args, capture);
}

Result<WritePlan> plan_writes(kdajit_op_t op, const kdajit_decode_args_t& args) {
  KDAJIT_TRY_ASSIGN(const Geometry g, check_args(op, args));
  WritePlan p;
  p.rows = g.R;
  p.heads = g.H;
  p.slots = g.S;
  p.tokens = g.T;
  p.row_live.assign(static_cast<size_t>(g.R), 0);
  p.state_written.assign(static_cast<size_t>(g.S), 0);
  p.conv_taps_written.assign(static_cast<size_t>(g.S), 0);
  for (const Seq& q : plan_sequences(g, args)) {
    if (!q.live) continue;
    for (int64_t t = 0; t < q.len; ++t) {
      p.row_live[static_cast<size_t>(q.row0 + t)] = 1;
      if (q.ckpt[static_cast<size_t>(t)] >= 0) p.state_written[static_cast<size_t>(q.ckpt[static_cast<size_t>(t)])] = 1;
    }
    auto& taps = p.conv_taps_written[static_cast<size_t>(q.conv_slot)];
    taps = std::max<int32_t>(taps, static_cast<int32_t>(q.conv_count));
  }
  return p;
}

}  // namespace kdajit::ref
