#include "kdajit/runtime/call/support.hpp"

#include <cctype>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "kdajit/kdajit.hpp"
#include "kdajit/runtime/jit/compile.hpp"
#include "kdajit/runtime/call/select.hpp"
#include "kdajit/runtime/call/validate.hpp"
#include "kdajit/runtime/device/driver_api.hpp"

namespace kdajit {

namespace {

// "sm_<digits>" with an optional letter suffix: a real arch this build may not serve.
bool looks_like_arch(std::string_view s) {
  if (s.substr(0, 3) != "sm_" || s.size() < 4) return false;
  size_t i = 3;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  return i > 3 && (i == s.size() || (i + 1 == s.size() && std::isalpha(static_cast<unsigned char>(s[i]))));
}

// The device the configuration describes: its arch (given, or the device's)
// and SM count (given, the device's, or the arch's reference part).
Result<DeviceTraits> config_device(const kdajit_config_t& c) {
  DeviceTraits d;
  if (!c.arch) {
    auto dev = [&]() -> Result<DeviceTraits> {
      KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
      KDAJIT_TRY_ASSIGN(CUdevice device, device_for(*api, c.device));
      return device_traits(*api, device, std::nullopt);
    }();
    if (!dev) {
      Error e = std::move(dev).error();
      e.message = fmt::format("arch: NULL means the arch of device {}, which cannot be read: {}", c.device, e.message);
      return e;
    }
    d = *dev;
  } else {
    const std::string_view s = c.arch;
    auto arch = parse_arch(s);
    if (!arch) {
      if (looks_like_arch(s))
        return Error(ErrorCode::unsupported, fmt::format("arch: expected one of {} (the targets this build serves), got '{}'",
                                                         choices<Arch>(), s));
      return invalid_argument(fmt::format("arch: expected one of {}, got '{}'", choices<Arch>(), s));
    }
    d.arch = *arch;
    // The reference part of the target when no SM count is given (kdajit/arches.def).
    d.sm_count = arch_spec(d.arch).reference_sm_count;
  }
  if (c.sm_count < 0) return invalid_argument(fmt::format("sm_count: expected 0 (the device's) or > 0, got {}", c.sm_count));
  if (c.sm_count > 0) d.sm_count = c.sm_count;
  return d;
}

// Hands out 256-byte aligned fake addresses: validation reads the args struct
// only, never the memory behind it.
struct Placer {
  uintptr_t next = 1u << 20;
  void* take(int64_t bytes) {
    void* p = reinterpret_cast<void*>(next);
    next += (static_cast<uintptr_t>(bytes) + 255) / 256 * 256;
    return p;
  }
};

kdajit_tensor_t view(Placer& pl, kdajit_dtype_t dtype, std::initializer_list<int64_t> shape,
                     std::initializer_list<int64_t> strides) {
  kdajit_tensor_t t = tensor_view(nullptr, dtype, shape, strides);
  int64_t extent = 1;
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] > 0) extent += (t.shape[i] - 1) * t.strides[i];
  t.data = pl.take(extent * (dtype == KDAJIT_DTYPE_BF16 ? 2 : 4));
  return t;
}

// The scalars and views both ops' synthetic args share: R rows, S = 2 slots,
// K conv taps, placed in the contract's order; place_indices places the op's
// state_indices (between dt_bias and state).
template <class Args, class PlaceIndices>
void place_shared_args(Args& a, Placer& pl, const kdajit_config_t& c, int32_t conv, int64_t R, int64_t K,
                       PlaceIndices place_indices) {
  a.lower_bound = -5.0f;
  a.norm_eps = 1e-6f;
  a.gate = c.gate;
  const int64_t H = c.heads, S = 2;
  const int64_t hidden = H * kHeadDim, qkv = 3 * hidden;
  a.x = view(pl, KDAJIT_DTYPE_BF16, {R, qkv}, {qkv, 1});
  a.conv_weight = view(pl, KDAJIT_DTYPE_F32, {3, kConvWidth, hidden}, {kConvWidth * hidden, hidden, 1});
  a.conv_state = conv == KDAJIT_CONV_SD ? view(pl, KDAJIT_DTYPE_BF16, {S, qkv, K}, {qkv * K, 1, qkv})
                                        : view(pl, KDAJIT_DTYPE_BF16, {S, qkv, K}, {qkv * K, K, 1});
  a.raw_gate = view(pl, KDAJIT_DTYPE_BF16, {R, H, kHeadDim}, {hidden, kHeadDim, 1});
  a.raw_beta = view(pl, KDAJIT_DTYPE_BF16, {R, H}, {H, 1});
  a.A_log = view(pl, KDAJIT_DTYPE_F32, {H}, {1});
  a.dt_bias = view(pl, KDAJIT_DTYPE_F32, {hidden}, {1});
  place_indices(a);
  a.state = view(pl, c.state_dtype, {S, H, kHeadDim, kHeadDim},
                 {H * kHeadDim * kHeadDim, kHeadDim * kHeadDim, kHeadDim, 1});
  a.output_gate = view(pl, KDAJIT_DTYPE_BF16, {R, H, kHeadDim}, {hidden, kHeadDim, 1});
  a.norm_weight = view(pl, KDAJIT_DTYPE_F32, {kHeadDim}, {1});
  a.output = view(pl, KDAJIT_DTYPE_BF16, {R, H, kHeadDim}, {hidden, kHeadDim, 1});
}

struct SyntheticCall {
  Op op = Op::single;
  kdajit_decode_args_t args{};
  kdajit_prefill_args_t prefill{};  // op prefill
  kdajit_chunk_args_t chunk{};      // op chunk
};

// A well-formed prefill of the configuration: N = `rows` sequences of one
// chunk each (T_total = 64 N, max_seq_len 64), the state_indices pool's conv
// taps K = 3, no has_initial_state.
// The rules of both chunked ops' configurations: N sequences of one chunk fit
// int32 rows, and tokens is the chunk size.
Status check_chunked_config(const kdajit_config_t& c, int64_t rows, Op op) {
  if (rows > std::numeric_limits<int32_t>::max() / kPrefillChunk)
    return invalid_argument(fmt::format("rows: expected N in 1..{} (N sequences of {} tokens must fit in int32 rows), "
                                        "got {}",
                                        std::numeric_limits<int32_t>::max() / kPrefillChunk, kPrefillChunk, rows));
  if (c.tokens != kPrefillChunk)
    return invalid_argument(fmt::format("tokens: expected {} (the chunk size of the {} op's keys), got {}",
                                        kPrefillChunk, to_string(op), c.tokens));
  return {};
}

Result<SyntheticCall> synthetic_prefill(const kdajit_config_t& c, int64_t rows, int32_t conv) {
  KDAJIT_TRY(check_chunked_config(c, rows, Op::prefill));
  SyntheticCall out;
  out.op = Op::prefill;
  kdajit_prefill_args_t& a = out.prefill;  // zeroed: no oob_counter, has_initial_state empty
  a.struct_size = sizeof a;
  a.max_seq_len = kPrefillChunk;
  const int64_t N = rows;
  Placer pl;
  place_shared_args(a, pl, c, conv, rows * kPrefillChunk, kConvWidth - 1, [&](kdajit_prefill_args_t& args) {
    args.state_indices = view(pl, KDAJIT_DTYPE_INT32, {N}, {1});
  });
  a.query_start_loc = view(pl, KDAJIT_DTYPE_INT32, {N + 1}, {1});
  return out;
}

// A well-formed chunk call of the configuration: N = `rows` sequences of one
// chunk each, both states given in FLA's layout, bf16 g and beta. Its keys
// carry conv sd: a DS configuration is an error, as for the key.
Result<SyntheticCall> synthetic_chunk(const kdajit_config_t& c, int64_t rows, int32_t conv) {
  KDAJIT_TRY(check_chunked_config(c, rows, Op::chunk));
  if (conv != KDAJIT_CONV_SD)
    return invalid_argument("conv_layout: expected sd for the chunk op (it has no conv; its keys carry sd), got ds");
  SyntheticCall out;
  out.op = Op::chunk;
  kdajit_chunk_args_t& a = out.chunk;
  a.struct_size = sizeof a;
  a.gate = c.gate;
  a.lower_bound = -5.0f;
  a.scale = 0.08838834764831845f;
  a.qk_l2norm = 1;
  a.beta_sigmoid = 1;
  a.max_seq_len = kPrefillChunk;
  const int64_t H = c.heads, N = rows, R = rows * kPrefillChunk, hidden = H * kHeadDim;
  Placer pl;
  a.q = view(pl, KDAJIT_DTYPE_BF16, {R, H, kHeadDim}, {hidden, kHeadDim, 1});
  a.k = view(pl, KDAJIT_DTYPE_BF16, {R, H, kHeadDim}, {hidden, kHeadDim, 1});
  a.v = view(pl, KDAJIT_DTYPE_BF16, {R, H, kHeadDim}, {hidden, kHeadDim, 1});
  a.g = view(pl, KDAJIT_DTYPE_BF16, {R, H, kHeadDim}, {hidden, kHeadDim, 1});
  a.beta = view(pl, KDAJIT_DTYPE_BF16, {R, H}, {H, 1});
  a.A_log = view(pl, KDAJIT_DTYPE_F32, {H}, {1});
  a.dt_bias = view(pl, KDAJIT_DTYPE_F32, {hidden}, {1});
  const int64_t slice = kHeadDim * kHeadDim;
  a.initial_state = view(pl, c.state_dtype, {N, H, kHeadDim, kHeadDim}, {H * slice, slice, kHeadDim, 1});
  a.final_state = view(pl, c.state_dtype, {N, H, kHeadDim, kHeadDim}, {H * slice, slice, kHeadDim, 1});
  a.output = view(pl, KDAJIT_DTYPE_BF16, {R, H, kHeadDim}, {hidden, kHeadDim, 1});
  a.cu_seqlens = view(pl, KDAJIT_DTYPE_INT32, {N + 1}, {1});
  return out;
}

// A well-formed call of the configuration with `rows` rows or sequences: the
// input of the same validation a real call goes through.
Result<SyntheticCall> synthetic_call(const kdajit_config_t& c, int64_t rows) {
  const int32_t op = enum_value(c.op);
  if (op != KDAJIT_OP_SINGLE && op != KDAJIT_OP_PACKED && op != KDAJIT_OP_PREFILL && op != KDAJIT_OP_CHUNK)
    return invalid_argument(fmt::format("op: expected {}, got {}", choices<Op>(), op));
  const int32_t conv = enum_value(c.conv_layout);
  if (conv != KDAJIT_CONV_SD && conv != KDAJIT_CONV_DS)
    return invalid_argument(fmt::format("conv_layout: expected {}, got {}", choices<ConvLayout>(), conv));
  if (rows < 1) return invalid_argument(fmt::format("rows: expected R (or N) >= 1, got {}", rows));
  if (op == KDAJIT_OP_PREFILL) return synthetic_prefill(c, rows, conv);
  if (op == KDAJIT_OP_CHUNK) return synthetic_chunk(c, rows, conv);
  SyntheticCall out;
  out.op = op == KDAJIT_OP_SINGLE ? Op::single : Op::packed;
  // A packed call has N x T rows: N past INT64_MAX / T would wrap to a negative shape.
  if (out.op == Op::packed && c.tokens > 0 && rows > INT64_MAX / c.tokens)
    return invalid_argument(fmt::format("rows: expected N in 1..{} (N x T rows must fit in int64 with T = {}), got {}",
                                        INT64_MAX / c.tokens, c.tokens, rows));
  kdajit_decode_args_t& a = out.args;  // zeroed: no oob_counter
  a.state_indices_mode = c.state_indices_mode;
  // Sizes: a negative or huge H or T only shapes the views; validation judges them.
  const int64_t T = out.op == Op::single ? 1 : c.tokens;
  const int64_t N = rows, R = out.op == Op::single ? rows : rows * (T > 0 ? T : 1);
  Placer pl;
  place_shared_args(a, pl, c, conv, R, T + kConvWidth - 2, [&](kdajit_decode_args_t& args) {
    args.state_indices = out.op == Op::single ? view(pl, KDAJIT_DTYPE_INT32, {R}, {1})
                                              : view(pl, KDAJIT_DTYPE_INT32, {N, T}, {T, 1});
  });
  if (out.op == Op::packed) {
    a.query_start_loc = view(pl, KDAJIT_DTYPE_INT32, {N + 1}, {1});
    a.num_accepted_tokens = view(pl, KDAJIT_DTYPE_INT32, {N}, {1});
  }
  return out;
}

// Validation of the synthetic call, plus the arch and the NVRTC target check.
Result<std::pair<ValidatedCall, DeviceTraits>> derive(const kdajit_config_t& c, int64_t rows) {
  // The state dtype is named after the config field, not the tensor.
  const int32_t dt = enum_value(c.state_dtype);
  if (dt != KDAJIT_DTYPE_F32 && dt != KDAJIT_DTYPE_BF16)
    return invalid_argument(fmt::format("state_dtype: expected f32 or bf16, got {}",
                                        dt == KDAJIT_DTYPE_INT32 ? std::string("int32") : fmt::format("dtype({})", dt)));
  KDAJIT_TRY_ASSIGN(SyntheticCall sc, synthetic_call(c, rows));
  KDAJIT_TRY_ASSIGN(ValidatedCall call,
                    sc.op == Op::prefill ? validate_prefill(sc.prefill)
                    : sc.op == Op::chunk ? validate_chunk(sc.chunk)
                                         : validate_decode(sc.op, sc.args));
  // The single op's call has T = 1 by construction (conv_state K = 3); a real
  // call with another K fails validation after the checks above, as here.
  if (sc.op == Op::single && c.tokens != 1)
    return invalid_argument(fmt::format("tokens: expected T = 1 for the single op, got {}", c.tokens));
  KDAJIT_TRY_ASSIGN(DeviceTraits device, config_device(c));
  return std::pair{std::move(call), device};
}

}  // namespace

kdajit_config_t default_config() {
  kdajit_config_t c{};
  c.struct_size = sizeof c;
  c.op = KDAJIT_OP_SINGLE;
  c.heads = 64;
  c.state_dtype = KDAJIT_DTYPE_F32;
  c.conv_layout = KDAJIT_CONV_SD;
  c.tokens = 1;
  c.gate = KDAJIT_GATE_BOUNDED;
  c.arch = nullptr;
  c.device = -1;
  c.state_indices_mode = KDAJIT_INDICES_UNIQUE_OR_NULL;
  c.sm_count = 0;
  return c;
}

Status query_support(const kdajit_config_t& c) {
  KDAJIT_TRY_ASSIGN(auto derived, derive(c, 1));
  KDAJIT_TRY(validate(key_for(derived.first.shape, builtin_route(derived.first.shape, derived.second),
                              derived.second.arch)));
  return check_arch_target(derived.second.arch);
}

Result<KernelKey> config_key(const kdajit_config_t& c, int64_t rows) {
  KDAJIT_TRY_ASSIGN(auto derived, derive(c, rows));
  const auto& [call, device] = derived;
  return key_for(call.shape, builtin_route(call.shape, device), device.arch);
}

Result<std::vector<KernelKey>> config_keys(const kdajit_config_t& c) {
  KDAJIT_TRY_ASSIGN(auto derived, derive(c, 1));
  auto& [call, device] = derived;
  // A chunked call may bring a workspace (route twopass): its keys are the
  // configuration's too.
  if (chunked(call.shape.family.op)) call.shape.workspace_bytes = INT64_MAX;
  std::vector<KernelKey> out;
  for (const RouteSpec& r : route_table())
    if (r.serves(call.shape.family.op) && !forced_only(r.route, call.shape.family.op) && r.eligible(call.shape, device))
      out.push_back(key_for(call.shape, r.route, device.arch));
  return out;
}

}  // namespace kdajit
