// Host-side validation of a decode call (docs/CONTRACT.md §6). It reads the args
// struct only: never device memory, and it writes nothing.
//
// The rules. D = 128, hidden = H*D, qkv = 3*hidden, K = T + 2 (3 for the single
// op). Strides are in elements; "row >= n" means a free stride of at least n.
// A dimension of size 1 accepts any stride (as PyTorch and DLPack do); its
// stride is never used, so the parameter block gets the packed value instead.
//
// | argument            | dtype    | shape                  | strides                                  | data align |
// |---------------------|----------|------------------------|------------------------------------------|------------|
// | x                   | bf16     | [R, qkv]               | (row >= qkv, 1)                          | 2          |
// | conv_weight         | f32      | [3, 4, hidden]         | (4*hidden, hidden, 1)                    | 4          |
// | conv_state          | bf16     | [S, qkv, K]            | SD (slot >= qkv*K, 1, qkv) or            | 8          |
// |                     |          |                        | DS (slot >= qkv*K, K, 1); slot % 4 == 0  |            |
// | raw_gate            | bf16     | [R, H, D]              | (row >= hidden, D, 1)                    | 2          |
// | raw_beta            | bf16     | [R, H]                 | (row >= H, 1)                            | 2          |
// | A_log               | f32      | [H], 1 <= H <= 128     | (1)                                      | 4          |
// | dt_bias             | f32      | [hidden]               | (1)                                      | 4          |
// | state_indices       | int32    | single [R]; packed     | contiguous                               | 4          |
// |                     |          | [N, T], 1 <= T <= 16   |                                          |            |
// | state               | f32|bf16 | [S, H, D, D]           | (slot >= H*D*D, D*D, D, 1);              | 16         |
// |                     |          |                        | slot stride a multiple of 16 bytes       |            |
// | output_gate, output | bf16     | [R, H, D]              | (row >= hidden, D, 1)                    | 2          |
// | norm_weight         | f32      | [D]                    | (1)                                      | 4          |
// | query_start_loc     | int32    | packed [N + 1]         | (1)                                      | 4          |
// | num_accepted_tokens | int32    | packed [N]             | (1)                                      | 4          |
// | oob_counter         | int32*   | optional (NULL: none)  |                                          | 4          |
//
// Sizes: H from A_log, R from x, S from state (conv_state must agree), N and T
// from the packed op's state_indices. R, S, N in 1..2^31-1 (S = 1 is legal: only
// the null slot, every row null). Every tensor's furthest byte lies below 2^63.
// Scalars: gate bounded|softplus; bounded needs lower_bound finite and < 0
// (softplus ignores it); norm_eps finite and >= 0; state_indices_mode one of the
// three, and not repeated_positive for the packed op (docs/CONTRACT.md §4: live
// sequences never share a written slot, so there is no sequential packed route).
// The single op ignores query_start_loc and num_accepted_tokens.
// Alignment: the kernels read bf16/f32/int32 elements one at a time except for
// state (16-byte vector loads) and conv_state (spec: 8-byte slots), hence the
// column above; the row tensors may be tightened when a kernel vectorizes them.
// Codes: H > 128 and T > 16 are well formed but outside what this build serves
// (unsupported, as the support query says); everything else is invalid_argument.
// Not checked: slot, query_start_loc and accepted-token values (device memory),
// and aliasing between tensors (engines interleave conv_state and state slots in
// one pool, so address ranges overlap legitimately).
//
// The prefill op (docs/CONTRACT.md §10, validate_prefill) takes the same rules
// with R = T_total, except: state_indices [N] (N in 1..2^31-2, so that N + 1
// fits), query_start_loc [N + 1], has_initial_state [N] or empty (ndim 0, or
// shape [0]), conv_state [S, qkv, K] with K in 3..18 from its shape, no
// state_indices_mode, and max_seq_len >= 0 (the selector's hint).
#include "kdajit/runtime/call/validate.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <utility>

#include <fmt/format.h>

namespace kdajit {
namespace {

constexpr int64_t kD = kHeadDim;
constexpr int64_t kMaxCount = std::numeric_limits<int32_t>::max();  // R, S, N live in int32 params

// Accepted dtypes as a bit mask over kdajit_dtype_t.
constexpr unsigned kF32 = 1u << KDAJIT_DTYPE_F32;
constexpr unsigned kBF16 = 1u << KDAJIT_DTYPE_BF16;
constexpr unsigned kI32 = 1u << KDAJIT_DTYPE_INT32;

bool known_dtype(int32_t t) { return t == KDAJIT_DTYPE_F32 || t == KDAJIT_DTYPE_BF16 || t == KDAJIT_DTYPE_INT32; }

std::string dtype_name(int32_t t) {
  switch (t) {
    case KDAJIT_DTYPE_F32: return std::string(to_string(StateDtype::f32));
    case KDAJIT_DTYPE_BF16: return std::string(to_string(StateDtype::bf16));
    case KDAJIT_DTYPE_INT32: return "int32";
    default: return fmt::format("dtype({})", t);
  }
}

// Bytes of one element; the dtype was checked by check_header before any use.
int64_t dtype_bytes(const kdajit_tensor_t& t) { return enum_value(t.dtype) == KDAJIT_DTYPE_BF16 ? 2 : 4; }

std::string mask_names(unsigned mask) {
  std::string s;
  for (int32_t t : {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16, KDAJIT_DTYPE_INT32})
    if (mask & (1u << t)) s += (s.empty() ? "" : " or ") + dtype_name(t);
  return s;
}

// "[3, 8, 64]" / "(1024, 128, 1)"; ndim clamped so a garbage ndim prints safely.
std::string list(const int64_t* v, int32_t ndim, char open, char close) {
  int n = ndim < 0 ? 0 : ndim > KDAJIT_MAX_DIMS ? KDAJIT_MAX_DIMS : ndim;
  return fmt::format("{}{}{}", open, fmt::join(v, v + n, ", "), close);
}
std::string shape_of(const kdajit_tensor_t& t) { return list(t.shape, t.ndim, '[', ']'); }
std::string strides_of(const kdajit_tensor_t& t) { return list(t.strides, t.ndim, '(', ')'); }

// One expected dimension: its size (label shown in errors, e.g. "R" -> "R=3";
// none for constants) and its stride: exact, or a minimum when `free` names it.
struct Dim {
  int64_t size;
  const char* label;
  int64_t stride;
  const char* free = nullptr;  // "row" / "slot"
};

std::string expected_shape(std::span<const Dim> dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += dims[i].label ? fmt::format("{}={}", dims[i].label, dims[i].size) : fmt::format("{}", dims[i].size);
  }
  return s + "]";
}

std::string expected_strides(std::span<const Dim> dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += dims[i].free ? fmt::format("{} >= {}", dims[i].free, dims[i].stride) : fmt::format("{}", dims[i].stride);
  }
  return s + ")";
}

bool strides_match(const kdajit_tensor_t& t, std::span<const Dim> dims) {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (t.shape[i] == 1) continue;  // never stepped over
    if (dims[i].free ? t.strides[i] < dims[i].stride : t.strides[i] != dims[i].stride) return false;
  }
  return true;
}

// The stride the kernel uses for a free dimension (packed when the size is 1).
int64_t used_stride(const kdajit_tensor_t& t, const Dim& d, int i) { return t.shape[i] == 1 ? d.stride : t.strides[i]; }

uintptr_t address(const kdajit_tensor_t& t) { return reinterpret_cast<uintptr_t>(t.data); }

// Non-null, dtype, rank and element alignment: what must hold before the shape
// can be read. `shape_desc` spells the expected dims for the rank message.
Status check_header(const char* name, const kdajit_tensor_t& t, unsigned dtypes, int32_t ndim,
                    const char* shape_desc) {
  if (!t.data) return invalid_argument(fmt::format("{}: expected a non-null data pointer, got NULL", name));
  const int32_t dtype = enum_value(t.dtype);
  if (!known_dtype(dtype) || !(dtypes & (1u << dtype)))
    return invalid_argument(fmt::format("{}: expected dtype {}, got {}", name, mask_names(dtypes), dtype_name(dtype)));
  if (t.ndim != ndim)
    return invalid_argument(fmt::format("{}: expected ndim {} {}, got ndim {}", name, ndim, shape_desc, t.ndim));
  int64_t elem = dtype_bytes(t);
  if (address(t) % static_cast<uintptr_t>(elem) != 0)
    return invalid_argument(fmt::format("{}: expected a data pointer aligned to {} bytes ({}), got {:#x}", name, elem,
                                        dtype_name(dtype), address(t)));
  return {};
}

// The sizes the call derives, for the context of shape errors.
struct Sizes {
  Op op = Op::single;
  int64_t H = 0, R = 0, S = 0, N = 0, T = 1;
  int64_t K = 3;  // conv_state taps: T + 2 for the decode ops, from conv_state for prefill

  std::string context() const {
    if (op == Op::prefill)
      return fmt::format("H={} from A_log, R=T_total={} from x, S={} from state, N={} from state_indices", H, R, S, N);
    if (op == Op::chunk) return fmt::format("H={} from A_log, R=T_total={} from q, N={} from cu_seqlens", H, R, N);
    std::string s = fmt::format("H={} from A_log, R={} from x, S={} from state", H, R, S);
    if (op == Op::packed) s += fmt::format(", N={} and T={} from state_indices", N, T);
    return s;
  }
};

Status check_shape(const char* name, const kdajit_tensor_t& t, std::span<const Dim> dims, const Sizes& sz) {
  for (size_t i = 0; i < dims.size(); ++i)
    if (t.shape[i] != dims[i].size)
      return invalid_argument(fmt::format("{}: expected shape {}, got {} ({})", name, expected_shape(dims),
                                          shape_of(t), sz.context()));
  return {};
}

// The furthest byte must be addressable with the kernels' int64 offsets.
Status check_extent(const char* name, const kdajit_tensor_t& t) {
  unsigned __int128 last = 0;
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] > 1) last += static_cast<unsigned __int128>(t.shape[i] - 1) * static_cast<uint64_t>(t.strides[i]);
  unsigned __int128 bytes = (last + 1) * static_cast<unsigned __int128>(dtype_bytes(t));
  if (bytes > static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max()) ||
      address(t) + bytes > static_cast<unsigned __int128>(std::numeric_limits<uintptr_t>::max()))
    return invalid_argument(fmt::format("{}: expected a strided extent below 2^63 bytes, got shape {} strides {}", name,
                                        shape_of(t), strides_of(t)));
  return {};
}

// Shape, strides, data alignment beyond the element's, and extent.
Status check_tensor(const char* name, const kdajit_tensor_t& t, std::span<const Dim> dims, int64_t align,
                    const Sizes& sz) {
  KDAJIT_TRY(check_shape(name, t, dims, sz));
  if (!strides_match(t, dims))
    return invalid_argument(
        fmt::format("{}: expected strides {}, got {}", name, expected_strides(dims), strides_of(t)));
  if (address(t) % static_cast<uintptr_t>(align) != 0)
    return invalid_argument(fmt::format("{}: expected a data pointer aligned to {} bytes, got {:#x}", name, align, address(t)));
  return check_extent(name, t);
}

// A slot stride (when slots are stepped over) must keep every slot `align`-byte aligned.
Status check_slot_alignment(const char* name, const kdajit_tensor_t& t, int64_t align) {
  if (t.shape[0] == 1) return {};
  int64_t bytes = t.strides[0] * dtype_bytes(t);
  if (bytes % align != 0)
    return invalid_argument(fmt::format("{}: expected a slot stride that is a multiple of {} bytes ({} {} elements), "
                                        "got {} ({} bytes)",
                                        name, align, align / dtype_bytes(t), dtype_name(enum_value(t.dtype)), t.strides[0],
                                        bytes));
  return {};
}

// A count taken from a shape: lo.., at most kMaxCount, `what` names it.
Status check_count(const char* name, const kdajit_tensor_t& t, int dim, const char* what, int64_t lo) {
  int64_t v = t.shape[dim];
  if (v < lo || v > kMaxCount)
    return invalid_argument(fmt::format("{}: expected {} (shape[{}]) in {}..{}, got shape {}", name, what, dim, lo,
                                        kMaxCount, shape_of(t)));
  return {};
}

// Rule group 1: the scalars, which need no shapes.
struct Scalars {
  Gate gate = Gate::bounded;
  IndicesMode mode = IndicesMode::unique_or_null;
};

// The gate and its bound: the same fields in every op's args.
template <class Args>
Result<Gate> check_gate(const Args& a) {
  const int32_t gate = enum_value(a.gate);
  if (gate != KDAJIT_GATE_BOUNDED && gate != KDAJIT_GATE_SOFTPLUS)
    return invalid_argument(fmt::format("gate: expected {}, got {}", choices<Gate>(), gate));
  const Gate g = gate == KDAJIT_GATE_BOUNDED ? Gate::bounded : Gate::softplus;
  if (g == Gate::bounded && !(std::isfinite(a.lower_bound) && a.lower_bound < 0.0f))
    return invalid_argument(
        fmt::format("lower_bound: expected a finite value < 0 for the bounded gate, got {}", a.lower_bound));
  return g;
}

// The gate, its bound and norm_eps: the decode and prefill args.
template <class Args>
Result<Gate> check_gate_and_eps(const Args& a) {
  KDAJIT_TRY_ASSIGN(const Gate g, check_gate(a));
  if (!(std::isfinite(a.norm_eps) && a.norm_eps >= 0.0f))
    return invalid_argument(fmt::format("norm_eps: expected a finite value >= 0, got {}", a.norm_eps));
  return g;
}

Status check_oob_counter(const int32_t* oob_counter) {
  if (oob_counter && reinterpret_cast<uintptr_t>(oob_counter) % 4 != 0)
    return invalid_argument(fmt::format("oob_counter: expected NULL or an int32 pointer aligned to 4 bytes, got {:#x}",
                                        reinterpret_cast<uintptr_t>(oob_counter)));
  return {};
}

// The chunked ops' optional workspace (route twopass): NULL with 0 bytes, or a
// 256-byte aligned pointer with > 0 bytes. How much a route needs is its
// eligibility (routes.hpp), not an error here.
Status check_workspace(const void* workspace, int64_t bytes) {
  if (bytes < 0) return invalid_argument(fmt::format("workspace_bytes: expected >= 0, got {}", bytes));
  if (workspace == nullptr && bytes > 0)
    return invalid_argument(fmt::format("workspace: expected a device pointer for workspace_bytes {}, got NULL", bytes));
  if (workspace != nullptr && bytes == 0)
    return invalid_argument("workspace_bytes: expected the workspace's size (> 0) with a workspace, got 0");
  if (reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlignment != 0)
    return invalid_argument(fmt::format("workspace: expected a pointer aligned to {} bytes, got {:#x}",
                                        kWorkspaceAlignment, reinterpret_cast<uintptr_t>(workspace)));
  return {};
}

Result<Scalars> check_scalars(Op op, const kdajit_decode_args_t& a) {
  Scalars sc;
  KDAJIT_TRY_ASSIGN(sc.gate, check_gate_and_eps(a));
  const int32_t mode = enum_value(a.state_indices_mode);
  if (mode < 0 || mode >= static_cast<int32_t>(kIndicesModeNames.size()))
    return invalid_argument(
        fmt::format("state_indices_mode: expected {}, got {}", fmt::join(kIndicesModeNames, "|"), mode));
  sc.mode = static_cast<IndicesMode>(mode);
  if (op == Op::packed && sc.mode == IndicesMode::repeated_positive)
    return invalid_argument(
        "state_indices_mode: expected unique_or_null or positive_unique for the packed op (live sequences must "
        "not share slots, docs/CONTRACT.md §4), got repeated_positive");
  KDAJIT_TRY(check_oob_counter(a.oob_counter));
  return sc;
}

// Rule group 2: the sizes, each from the tensor that defines it (after that
// tensor's pointer, dtype, rank and element alignment).
// H from A_log, R from x and S from state, which the decode and prefill args
// read alike; x_desc and rows name x's shape and R as the op's contract does.
// H from A_log, every op's first size.
Status read_heads(const kdajit_tensor_t& A_log, Sizes& sz) {
  KDAJIT_TRY(check_header("A_log", A_log, kF32, 1, "[H]"));
  sz.H = A_log.shape[0];
  if (sz.H < 1)
    return invalid_argument(
        fmt::format("A_log: expected shape [H] with H (heads) in 1..{}, got {}", kMaxHeads, shape_of(A_log)));
  if (sz.H > kMaxHeads)
    return Error(ErrorCode::unsupported, fmt::format("A_log: expected shape [H] with H (heads) in 1..{} (the heads "
                                                     "this build serves), got {}",
                                                     kMaxHeads, shape_of(A_log)));
  return {};
}

template <class Args>
Status read_shared_sizes(const Args& a, const char* x_desc, const char* rows, Sizes& sz) {
  KDAJIT_TRY(read_heads(a.A_log, sz));
  KDAJIT_TRY(check_header("x", a.x, kBF16, 2, x_desc));
  KDAJIT_TRY(check_count("x", a.x, 0, rows, 1));
  sz.R = a.x.shape[0];
  KDAJIT_TRY(check_header("state", a.state, kF32 | kBF16, 4, "[S, H, 128, 128]"));
  KDAJIT_TRY(check_count("state", a.state, 0, "slots S", 1));
  sz.S = a.state.shape[0];
  return {};
}

// Rule group 2 of the decode ops: H, R, S, then N and T from state_indices.
Result<Sizes> read_sizes(Op op, const kdajit_decode_args_t& a) {
  Sizes sz;
  sz.op = op;
  KDAJIT_TRY(read_shared_sizes(a, "[R, 3*H*128]", "rows R", sz));
  if (op == Op::packed) {
    KDAJIT_TRY(check_header("state_indices", a.state_indices, kI32, 2, "[N, T]"));
    KDAJIT_TRY(check_count("state_indices", a.state_indices, 0, "sequences N", 1));
    sz.N = a.state_indices.shape[0];
    sz.T = a.state_indices.shape[1];
    if (sz.T < 1)
      return invalid_argument(fmt::format("state_indices: expected shape [N, T] with T (tokens) in 1..{}, got {}",
                                          kMaxTokens, shape_of(a.state_indices)));
    if (sz.T > kMaxTokens)
      return Error(ErrorCode::unsupported,
                   fmt::format("state_indices: expected shape [N, T] with T (tokens) in 1..{} (the tokens this "
                               "build serves), got {}",
                               kMaxTokens, shape_of(a.state_indices)));
  } else {
    KDAJIT_TRY(check_header("state_indices", a.state_indices, kI32, 1, "[R]"));
  }
  sz.K = sz.T + kConvWidth - 2;
  return sz;
}

// The used stride of every tensor the kernel steps over, and the conv layout.
struct Layout {
  ConvLayout conv = ConvLayout::sd;
  int64_t x_row = 0, conv_slot = 0, gate_row = 0, beta_row = 0, state_slot = 0, ogate_row = 0, out_row = 0;
};

// Rule group 3: every tensor against the sizes (§1.2), in the contract's order.
// The tensors the decode and prefill args share, in two parts around
// state_indices; `k_label` names conv_state's taps ("K=T+2" or "K"), and
// `conv_desc` its expected shape for the rank message.
template <class Args>
Status check_inputs(const Args& a, const Sizes& sz, const char* k_label, const char* conv_desc, Layout& lay) {
  const int64_t H = sz.H, R = sz.R, S = sz.S, K = sz.K;
  const int64_t hidden = H * kD, qkv = 3 * hidden;

  // x [R, qkv]
  const Dim x_dims[] = {{R, "R", qkv, "row"}, {qkv, "3*H*128", 1}};
  KDAJIT_TRY(check_tensor("x", a.x, x_dims, 2, sz));

  // conv_weight [3, W, hidden]
  KDAJIT_TRY(check_header("conv_weight", a.conv_weight, kF32, 3, "[3, 4, H*128]"));
  const Dim cw_dims[] = {{3, nullptr, kConvWidth * hidden}, {kConvWidth, nullptr, hidden}, {hidden, "H*128", 1}};
  KDAJIT_TRY(check_tensor("conv_weight", a.conv_weight, cw_dims, 4, sz));

  // conv_state [S, qkv, K]: S must equal state's; the strides pick the layout.
  KDAJIT_TRY(check_header("conv_state", a.conv_state, kBF16, 3, conv_desc));
  const Dim sd_dims[] = {{S, "S", qkv * K, "slot"}, {qkv, "3*H*128", 1}, {K, k_label, qkv}};
  const Dim ds_dims[] = {{S, "S", qkv * K, "slot"}, {qkv, "3*H*128", K}, {K, k_label, 1}};
  KDAJIT_TRY(check_shape("conv_state", a.conv_state, sd_dims, sz));
  if (strides_match(a.conv_state, sd_dims))
    lay.conv = ConvLayout::sd;
  else if (strides_match(a.conv_state, ds_dims))
    lay.conv = ConvLayout::ds;
  else
    return invalid_argument(fmt::format("conv_state: expected strides {} [SD] or {} [DS], got {}",
                                        expected_strides(sd_dims), expected_strides(ds_dims),
                                        strides_of(a.conv_state)));
  const auto& conv_dims = lay.conv == ConvLayout::sd ? sd_dims : ds_dims;
  KDAJIT_TRY(check_tensor("conv_state", a.conv_state, conv_dims, 8, sz));
  KDAJIT_TRY(check_slot_alignment("conv_state", a.conv_state, 8));

  // Row tensors [R, H, D] and [R, H].
  const Dim rhd_dims[] = {{R, "R", hidden, "row"}, {H, "H", kD}, {kD, nullptr, 1}};
  KDAJIT_TRY(check_header("raw_gate", a.raw_gate, kBF16, 3, "[R, H, 128]"));
  KDAJIT_TRY(check_tensor("raw_gate", a.raw_gate, rhd_dims, 2, sz));
  KDAJIT_TRY(check_header("raw_beta", a.raw_beta, kBF16, 2, "[R, H]"));
  const Dim beta_dims[] = {{R, "R", H, "row"}, {H, "H", 1}};
  KDAJIT_TRY(check_tensor("raw_beta", a.raw_beta, beta_dims, 2, sz));

  const Dim alog_dims[] = {{H, "H", 1}};
  KDAJIT_TRY(check_tensor("A_log", a.A_log, alog_dims, 4, sz));
  KDAJIT_TRY(check_header("dt_bias", a.dt_bias, kF32, 1, "[H*128]"));
  const Dim dtb_dims[] = {{hidden, "H*128", 1}};
  KDAJIT_TRY(check_tensor("dt_bias", a.dt_bias, dtb_dims, 4, sz));

  lay.x_row = used_stride(a.x, x_dims[0], 0);
  lay.conv_slot = used_stride(a.conv_state, conv_dims[0], 0);
  lay.gate_row = used_stride(a.raw_gate, rhd_dims[0], 0);
  lay.beta_row = used_stride(a.raw_beta, beta_dims[0], 0);
  return {};
}

template <class Args>
Status check_state_and_outputs(const Args& a, const Sizes& sz, Layout& lay) {
  const int64_t H = sz.H, R = sz.R, S = sz.S;
  const int64_t hidden = H * kD;
  // state [S, H, D(v), D(k)]
  const Dim st_dims[] = {{S, "S", H * kD * kD, "slot"}, {H, "H", kD * kD}, {kD, nullptr, kD}, {kD, nullptr, 1}};
  KDAJIT_TRY(check_tensor("state", a.state, st_dims, 16, sz));
  KDAJIT_TRY(check_slot_alignment("state", a.state, 16));

  const Dim rhd_dims[] = {{R, "R", hidden, "row"}, {H, "H", kD}, {kD, nullptr, 1}};
  KDAJIT_TRY(check_header("output_gate", a.output_gate, kBF16, 3, "[R, H, 128]"));
  KDAJIT_TRY(check_tensor("output_gate", a.output_gate, rhd_dims, 2, sz));
  KDAJIT_TRY(check_header("norm_weight", a.norm_weight, kF32, 1, "[128]"));
  const Dim nw_dims[] = {{kD, nullptr, 1}};
  KDAJIT_TRY(check_tensor("norm_weight", a.norm_weight, nw_dims, 4, sz));
  KDAJIT_TRY(check_header("output", a.output, kBF16, 3, "[R, H, 128]"));
  KDAJIT_TRY(check_tensor("output", a.output, rhd_dims, 2, sz));

  lay.state_slot = used_stride(a.state, st_dims[0], 0);
  lay.ogate_row = used_stride(a.output_gate, rhd_dims[0], 0);
  lay.out_row = used_stride(a.output, rhd_dims[0], 0);
  return {};
}

Result<Layout> check_tensors(const kdajit_decode_args_t& a, const Sizes& sz) {
  const int64_t R = sz.R, N = sz.N, T = sz.T;
  Layout lay;
  KDAJIT_TRY(check_inputs(a, sz, "K=T+2", "[S, 3*H*128, K=T+2]", lay));

  if (sz.op == Op::packed) {
    const Dim si_dims[] = {{N, "N", T}, {T, "T", 1}};
    KDAJIT_TRY(check_tensor("state_indices", a.state_indices, si_dims, 4, sz));
  } else {
    const Dim si_dims[] = {{R, "R", 1}};
    KDAJIT_TRY(check_tensor("state_indices", a.state_indices, si_dims, 4, sz));
  }

  KDAJIT_TRY(check_state_and_outputs(a, sz, lay));

  if (sz.op == Op::packed) {
    KDAJIT_TRY(check_header("query_start_loc", a.query_start_loc, kI32, 1, "[N+1]"));
    const Dim qsl_dims[] = {{N + 1, "N+1", 1}};
    KDAJIT_TRY(check_tensor("query_start_loc", a.query_start_loc, qsl_dims, 4, sz));
    KDAJIT_TRY(check_header("num_accepted_tokens", a.num_accepted_tokens, kI32, 1, "[N]"));
    const Dim nat_dims[] = {{N, "N", 1}};
    KDAJIT_TRY(check_tensor("num_accepted_tokens", a.num_accepted_tokens, nat_dims, 4, sz));
  }
  return lay;
}

// The kernel parameter block of a call whose every rule held: the pointers,
// strides and sizes the decode and prefill args share; each op sets the rest
// (query_start_loc, num_accepted, has_initial_state, num_seqs).
template <class Args>
KdaParams make_shared_params(const Args& a, const Sizes& sz, const Layout& lay) {
  KdaParams p{};
  p.x = static_cast<const kda_bf16_bits*>(a.x.data);
  p.conv_weight = static_cast<const float*>(a.conv_weight.data);
  p.conv_state = static_cast<kda_bf16_bits*>(a.conv_state.data);
  p.raw_gate = static_cast<const kda_bf16_bits*>(a.raw_gate.data);
  p.raw_beta = static_cast<const kda_bf16_bits*>(a.raw_beta.data);
  p.A_log = static_cast<const float*>(a.A_log.data);
  p.dt_bias = static_cast<const float*>(a.dt_bias.data);
  p.state_indices = static_cast<const kda_i32*>(a.state_indices.data);
  p.state = a.state.data;
  p.output_gate = static_cast<const kda_bf16_bits*>(a.output_gate.data);
  p.norm_weight = static_cast<const float*>(a.norm_weight.data);
  p.output = static_cast<kda_bf16_bits*>(a.output.data);
  p.oob_counter = a.oob_counter;
  p.x_row_stride = lay.x_row;
  p.conv_slot_stride = lay.conv_slot;
  p.gate_row_stride = lay.gate_row;
  p.beta_row_stride = lay.beta_row;
  p.state_slot_stride = lay.state_slot;
  p.ogate_row_stride = lay.ogate_row;
  p.out_row_stride = lay.out_row;
  p.rows = static_cast<kda_i32>(sz.R);
  p.num_slots = static_cast<kda_i32>(sz.S);
  p.lower_bound = a.lower_bound;
  p.norm_eps = a.norm_eps;
  p.conv_taps = static_cast<kda_i32>(sz.K);
  p.heads = static_cast<kda_i32>(sz.H);
  p.heads_mul = kda_heads_multiplier(p.heads);
  return p;
}

KdaParams make_params(const kdajit_decode_args_t& a, const Sizes& sz, const Layout& lay) {
  const bool packed = sz.op == Op::packed;
  KdaParams p = make_shared_params(a, sz, lay);
  p.query_start_loc = packed ? static_cast<const kda_i32*>(a.query_start_loc.data) : nullptr;
  p.num_accepted = packed ? static_cast<const kda_i32*>(a.num_accepted_tokens.data) : nullptr;
  p.num_seqs = static_cast<kda_i32>(packed ? sz.N : 0);
  return p;
}

// The prefill op (docs/CONTRACT.md §10): the decode rules with R = T_total,
// N from state_indices [N], K from conv_state, and its own tail of tensors.
constexpr int64_t kMinPrefillTaps = kConvWidth - 1;  // the conv's 3 history taps
constexpr int64_t kMaxPrefillTaps = kMaxTokens + kConvWidth - 2;  // the packed op's largest K: pools are shared

// Rule group 1 of the prefill op.
Result<Gate> check_prefill_scalars(const kdajit_prefill_args_t& a) {
  KDAJIT_TRY_ASSIGN(const Gate gate, check_gate_and_eps(a));
  if (a.max_seq_len < 0)
    return invalid_argument(fmt::format(
        "max_seq_len: expected 0 (T_total) or a bound >= 1 on the longest sequence, got {}", a.max_seq_len));
  KDAJIT_TRY(check_oob_counter(a.oob_counter));
  KDAJIT_TRY(check_workspace(a.workspace, a.workspace_bytes));
  return gate;
}

// Rule group 2 of the prefill op: H, R = T_total, S, N, K.
Result<Sizes> read_prefill_sizes(const kdajit_prefill_args_t& a) {
  Sizes sz;
  sz.op = Op::prefill;
  sz.T = kPrefillChunk;
  KDAJIT_TRY(read_shared_sizes(a, "[T_total, 3*H*128]", "rows T_total", sz));
  KDAJIT_TRY(check_header("state_indices", a.state_indices, kI32, 1, "[N]"));
  // N + 1 entries of query_start_loc must fit int32 too.
  const int64_t n = a.state_indices.shape[0];
  if (n < 1 || n > kMaxCount - 1)
    return invalid_argument(fmt::format("state_indices: expected sequences N (shape[0]) in 1..{}, got shape {}",
                                        kMaxCount - 1, shape_of(a.state_indices)));
  sz.N = n;
  KDAJIT_TRY(check_header("conv_state", a.conv_state, kBF16, 3, "[S, 3*H*128, K]"));
  sz.K = a.conv_state.shape[2];
  if (sz.K < kMinPrefillTaps || sz.K > kMaxPrefillTaps)
    return invalid_argument(fmt::format("conv_state: expected shape [S, 3*H*128, K] with K (taps) in {}..{}, got {}",
                                        kMinPrefillTaps, kMaxPrefillTaps, shape_of(a.conv_state)));
  return sz;
}

// has_initial_state: empty (ndim 0, or ndim 1 with shape [0]) means every
// sequence starts from its slot.
bool is_empty_tensor(const kdajit_tensor_t& t) { return t.ndim == 0 || (t.ndim == 1 && t.shape[0] == 0); }

// Rule group 3 of the prefill op.
Result<Layout> check_prefill_tensors(const kdajit_prefill_args_t& a, const Sizes& sz) {
  const int64_t N = sz.N;
  Layout lay;
  KDAJIT_TRY(check_inputs(a, sz, "K", "[S, 3*H*128, K]", lay));
  const Dim si_dims[] = {{N, "N", 1}};
  KDAJIT_TRY(check_tensor("state_indices", a.state_indices, si_dims, 4, sz));
  if (!is_empty_tensor(a.has_initial_state)) {
    KDAJIT_TRY(check_header("has_initial_state", a.has_initial_state, kI32, 1, "[N] (or empty: ndim 0 or shape [0])"));
    KDAJIT_TRY(check_tensor("has_initial_state", a.has_initial_state, si_dims, 4, sz));
  }
  KDAJIT_TRY(check_state_and_outputs(a, sz, lay));
  KDAJIT_TRY(check_header("query_start_loc", a.query_start_loc, kI32, 1, "[N+1]"));
  const Dim qsl_dims[] = {{N + 1, "N+1", 1}};
  KDAJIT_TRY(check_tensor("query_start_loc", a.query_start_loc, qsl_dims, 4, sz));
  return lay;
}

KdaParams make_prefill_params(const kdajit_prefill_args_t& a, const Sizes& sz, const Layout& lay) {
  KdaParams p = make_shared_params(a, sz, lay);
  p.query_start_loc = static_cast<const kda_i32*>(a.query_start_loc.data);
  p.num_accepted = nullptr;
  p.has_initial_state =
      is_empty_tensor(a.has_initial_state) ? nullptr : static_cast<const kda_i32*>(a.has_initial_state.data);
  p.num_seqs = static_cast<kda_i32>(sz.N);
  p.state_v_stride = kD;  // the pool's [v][k]
  p.state_k_stride = 1;
  p.state_bf16 = enum_value(a.state.dtype) == KDAJIT_DTYPE_BF16 ? 1 : 0;
  // conv_state [S, 3*H*128, K]: SD (taps slow) or DS (taps contiguous).
  p.conv_chan_stride = lay.conv == ConvLayout::ds ? sz.K : 1;
  p.conv_tap_stride = lay.conv == ConvLayout::ds ? 1 : 3 * sz.H * kD;
  return p;
}

// The chunk op (docs/CONTRACT.md §11): FLA chunk_kda's tensors.
//
// | argument                    | dtype    | shape                | strides                                  | align |
// |-----------------------------|----------|----------------------|------------------------------------------|-------|
// | q, k, v, output             | bf16     | [R, H, D]            | (row >= hidden, D, 1)                    | 2     |
// | g                           | bf16|f32 | [R, H, D]            | (row >= hidden, D, 1)                    | elem  |
// | beta                        | bf16|f32 | [R, H]               | (row >= H, 1)                            | elem  |
// | A_log                       | f32      | [H], 1 <= H <= 128   | (1)                                      | 4     |
// | dt_bias                     | f32      | [hidden] or empty    | (1)                                      | 4     |
// | initial_state, final_state  | f32|bf16 | [N, H, D, D] or empty| (n >= H*D*D, D*D, D, 1); n % 16 bytes    | 16    |
// | cu_seqlens                  | int32    | [N + 1]              | (1)                                      | 4     |
//
// R = T_total from q, H from A_log, N from cu_seqlens (1..2^31-2). The two
// states, when both are given, have one dtype (the key's); with neither the
// key's is f32. Scalars: gate and lower_bound as the other ops, scale finite
// and > 0, qk_l2norm, beta_sigmoid and state_v_first 0 or 1, max_seq_len >= 0.

// Rule group 1 of the chunk op.
Result<Gate> check_chunk_scalars(const kdajit_chunk_args_t& a) {
  KDAJIT_TRY_ASSIGN(const Gate g, check_gate(a));
  if (!(std::isfinite(a.scale) && a.scale > 0.0f))
    return invalid_argument(fmt::format("scale: expected a finite value > 0, got {}", a.scale));
  const std::pair<const char*, int32_t> flags[] = {
      {"qk_l2norm", a.qk_l2norm}, {"beta_sigmoid", a.beta_sigmoid}, {"state_v_first", a.state_v_first}};
  for (const auto& [name, v] : flags)
    if (v != 0 && v != 1) return invalid_argument(fmt::format("{}: expected 0 or 1, got {}", name, v));
  if (a.max_seq_len < 0)
    return invalid_argument(fmt::format(
        "max_seq_len: expected 0 (T_total) or a bound >= 1 on the longest sequence, got {}", a.max_seq_len));
  KDAJIT_TRY(check_workspace(a.workspace, a.workspace_bytes));
  return g;
}

// Rule group 2 of the chunk op: H from A_log, R = T_total from q, N from cu_seqlens.
Result<Sizes> read_chunk_sizes(const kdajit_chunk_args_t& a) {
  Sizes sz;
  sz.op = Op::chunk;
  sz.T = kPrefillChunk;
  KDAJIT_TRY(read_heads(a.A_log, sz));
  KDAJIT_TRY(check_header("q", a.q, kBF16, 3, "[T_total, H, 128]"));
  KDAJIT_TRY(check_count("q", a.q, 0, "rows T_total", 1));
  sz.R = a.q.shape[0];
  KDAJIT_TRY(check_header("cu_seqlens", a.cu_seqlens, kI32, 1, "[N+1]"));
  const int64_t n1 = a.cu_seqlens.shape[0];
  if (n1 < 2 || n1 > kMaxCount)
    return invalid_argument(fmt::format("cu_seqlens: expected shape [N+1] with N (sequences) in 1..{}, got {}",
                                        kMaxCount - 1, shape_of(a.cu_seqlens)));
  sz.N = n1 - 1;
  return sz;
}

// Rule group 3 of the chunk op; the state dtype comes back through `state`.
Result<Layout> check_chunk_tensors(const kdajit_chunk_args_t& a, const Sizes& sz, StateDtype& state) {
  const int64_t H = sz.H, R = sz.R, N = sz.N, hidden = H * kD;
  Layout lay;
  const Dim rhd_dims[] = {{R, "R", hidden, "row"}, {H, "H", kD}, {kD, nullptr, 1}};
  const Dim beta_dims[] = {{R, "R", H, "row"}, {H, "H", 1}};
  for (const auto& [name, t] : {std::pair<const char*, const kdajit_tensor_t&>{"q", a.q}, {"k", a.k}, {"v", a.v}}) {
    KDAJIT_TRY(check_header(name, t, kBF16, 3, "[T_total, H, 128]"));
    KDAJIT_TRY(check_tensor(name, t, rhd_dims, 2, sz));
  }
  KDAJIT_TRY(check_header("g", a.g, kBF16 | kF32, 3, "[T_total, H, 128]"));
  KDAJIT_TRY(check_tensor("g", a.g, rhd_dims, dtype_bytes(a.g), sz));
  KDAJIT_TRY(check_header("beta", a.beta, kBF16 | kF32, 2, "[T_total, H]"));
  KDAJIT_TRY(check_tensor("beta", a.beta, beta_dims, dtype_bytes(a.beta), sz));
  const Dim alog_dims[] = {{H, "H", 1}};
  KDAJIT_TRY(check_tensor("A_log", a.A_log, alog_dims, 4, sz));
  if (!is_empty_tensor(a.dt_bias)) {
    KDAJIT_TRY(check_header("dt_bias", a.dt_bias, kF32, 1, "[H*128] (or empty: ndim 0 or shape [0])"));
    const Dim dtb_dims[] = {{hidden, "H*128", 1}};
    KDAJIT_TRY(check_tensor("dt_bias", a.dt_bias, dtb_dims, 4, sz));
  }
  // The states: [N, H, D, D], one dtype between them.
  const Dim st_dims[] = {{N, "N", H * kD * kD, "n"}, {H, "H", kD * kD}, {kD, nullptr, kD}, {kD, nullptr, 1}};
  const bool has_initial = !is_empty_tensor(a.initial_state), has_final = !is_empty_tensor(a.final_state);
  state = StateDtype::f32;
  for (const auto& [name, t, given] : {std::tuple<const char*, const kdajit_tensor_t&, bool>{"initial_state",
                                                                                               a.initial_state, has_initial},
                                       {"final_state", a.final_state, has_final}}) {
    if (!given) continue;
    KDAJIT_TRY(check_header(name, t, kF32 | kBF16, 4, "[N, H, 128, 128] (or empty: ndim 0 or shape [0])"));
    KDAJIT_TRY(check_tensor(name, t, st_dims, 16, sz));
    KDAJIT_TRY(check_slot_alignment(name, t, 16));
  }
  if (has_initial && has_final && a.initial_state.dtype != a.final_state.dtype)
    return invalid_argument(fmt::format("final_state: expected dtype {} (initial_state's), got {}",
                                        dtype_name(enum_value(a.initial_state.dtype)),
                                        dtype_name(enum_value(a.final_state.dtype))));
  if (has_initial || has_final) {
    const kdajit_tensor_t& t = has_initial ? a.initial_state : a.final_state;
    state = enum_value(t.dtype) == KDAJIT_DTYPE_F32 ? StateDtype::f32 : StateDtype::bf16;
  }
  KDAJIT_TRY(check_header("output", a.output, kBF16, 3, "[T_total, H, 128]"));
  KDAJIT_TRY(check_tensor("output", a.output, rhd_dims, 2, sz));
  const Dim csl_dims[] = {{N + 1, "N+1", 1}};
  KDAJIT_TRY(check_tensor("cu_seqlens", a.cu_seqlens, csl_dims, 4, sz));

  lay.gate_row = used_stride(a.g, rhd_dims[0], 0);
  lay.beta_row = used_stride(a.beta, beta_dims[0], 0);
  lay.out_row = used_stride(a.output, rhd_dims[0], 0);
  lay.state_slot = has_initial ? used_stride(a.initial_state, st_dims[0], 0) : 0;
  return lay;
}

KdaParams make_chunk_params(const kdajit_chunk_args_t& a, const Sizes& sz, const Layout& lay) {
  const Dim rhd_row{sz.R, "R", sz.H * kD, "row"};
  const Dim st_n{sz.N, "N", sz.H * kD * kD, "n"};
  KdaParams p{};
  p.q = static_cast<const kda_bf16_bits*>(a.q.data);
  p.k = static_cast<const kda_bf16_bits*>(a.k.data);
  p.v = static_cast<const kda_bf16_bits*>(a.v.data);
  p.q_row_stride = used_stride(a.q, rhd_row, 0);
  p.k_row_stride = used_stride(a.k, rhd_row, 0);
  p.v_row_stride = used_stride(a.v, rhd_row, 0);
  p.raw_gate = static_cast<const kda_bf16_bits*>(a.g.data);  // f32 with KDA_CHUNK_G_F32
  p.raw_beta = static_cast<const kda_bf16_bits*>(a.beta.data);
  p.gate_row_stride = lay.gate_row;
  p.beta_row_stride = lay.beta_row;
  p.A_log = static_cast<const float*>(a.A_log.data);
  p.dt_bias = is_empty_tensor(a.dt_bias) ? nullptr : static_cast<const float*>(a.dt_bias.data);
  p.state = is_empty_tensor(a.initial_state) ? nullptr : a.initial_state.data;
  p.state_slot_stride = lay.state_slot;
  p.final_state = is_empty_tensor(a.final_state) ? nullptr : a.final_state.data;
  p.final_slot_stride = p.final_state ? used_stride(a.final_state, st_n, 0) : 0;
  p.state_v_stride = a.state_v_first ? kD : 1;
  p.state_k_stride = a.state_v_first ? 1 : kD;
  p.output = static_cast<kda_bf16_bits*>(a.output.data);
  p.out_row_stride = lay.out_row;
  p.query_start_loc = static_cast<const kda_i32*>(a.cu_seqlens.data);
  p.rows = static_cast<kda_i32>(sz.R);
  p.num_seqs = static_cast<kda_i32>(sz.N);
  p.lower_bound = a.lower_bound;
  p.scale = a.scale;
  p.chunk_flags = (a.qk_l2norm ? KDA_CHUNK_QK_L2NORM : 0) | (a.beta_sigmoid ? KDA_CHUNK_BETA_SIGMOID : 0) |
                  (enum_value(a.g.dtype) == KDAJIT_DTYPE_F32 ? KDA_CHUNK_G_F32 : 0) |
                  (enum_value(a.beta.dtype) == KDAJIT_DTYPE_F32 ? KDA_CHUNK_BETA_F32 : 0);
  return p;
}

}  // namespace

Result<ValidatedCall> validate_prefill(const kdajit_prefill_args_t& a) {
  KDAJIT_TRY_ASSIGN(const Gate gate, check_prefill_scalars(a));
  KDAJIT_TRY_ASSIGN(const Sizes sz, read_prefill_sizes(a));
  KDAJIT_TRY_ASSIGN(const Layout lay, check_prefill_tensors(a, sz));

  ValidatedCall call;
  KernelKey& family = call.shape.family;
  family.op = Op::prefill;
  family.heads = static_cast<int>(sz.H);
  family.tokens = kPrefillChunk;
  family.state = enum_value(a.state.dtype) == KDAJIT_DTYPE_F32 ? StateDtype::f32 : StateDtype::bf16;
  family.conv = lay.conv;
  family.gate = gate;
  call.shape.mode = IndicesMode::unique_or_null;  // live sequences have distinct slots (§10)
  call.shape.rows = sz.R;
  call.shape.num_seqs = sz.N;
  call.shape.max_seq_len = a.max_seq_len > 0 ? std::min(a.max_seq_len, sz.R) : sz.R;
  call.params = make_prefill_params(a, sz, lay);
  call.shape.workspace_bytes = a.workspace_bytes;
  call.params.workspace = static_cast<unsigned char*>(a.workspace);
  return call;
}

Result<ValidatedCall> validate_chunk(const kdajit_chunk_args_t& a) {
  KDAJIT_TRY_ASSIGN(const Gate gate, check_chunk_scalars(a));
  KDAJIT_TRY_ASSIGN(const Sizes sz, read_chunk_sizes(a));
  StateDtype state = StateDtype::f32;
  KDAJIT_TRY_ASSIGN(const Layout lay, check_chunk_tensors(a, sz, state));

  ValidatedCall call;
  KernelKey& family = call.shape.family;
  family.op = Op::chunk;
  family.heads = static_cast<int>(sz.H);
  family.tokens = kPrefillChunk;
  family.state = state;
  family.conv = ConvLayout::sd;  // the chunk op has no conv; its keys carry sd
  family.gate = gate;
  call.shape.mode = IndicesMode::unique_or_null;
  call.shape.rows = sz.R;
  call.shape.num_seqs = sz.N;
  call.shape.max_seq_len = a.max_seq_len > 0 ? std::min(a.max_seq_len, sz.R) : sz.R;
  call.params = make_chunk_params(a, sz, lay);
  call.shape.workspace_bytes = a.workspace_bytes;
  call.params.workspace = static_cast<unsigned char*>(a.workspace);
  call.params.state_bf16 = state == StateDtype::bf16 ? 1 : 0;
  return call;
}

Result<ValidatedCall> validate_decode(Op op, const kdajit_decode_args_t& a) {
  if (op == Op::prefill)
    return invalid_argument(
        "op: expected single|packed for kdajit_decode_args_t, got prefill (a prefill call takes "
        "kdajit_prefill_args_t: kdajit_prefill, kdajit_validate_prefill_args)");
  if (op == Op::chunk)
    return invalid_argument(
        "op: expected single|packed for kdajit_decode_args_t, got chunk (a chunk call takes kdajit_chunk_args_t: "
        "kdajit_chunk, kdajit_validate_chunk_args)");
  if (op != Op::single && op != Op::packed)
    return invalid_argument(fmt::format("op: expected single|packed, got {}", static_cast<int>(op)));
  KDAJIT_TRY_ASSIGN(const Scalars sc, check_scalars(op, a));
  KDAJIT_TRY_ASSIGN(const Sizes sz, read_sizes(op, a));
  KDAJIT_TRY_ASSIGN(const Layout lay, check_tensors(a, sz));

  ValidatedCall call;
  KernelKey& family = call.shape.family;
  family.op = op;
  family.heads = static_cast<int>(sz.H);
  family.tokens = static_cast<int>(sz.T);
  family.state = enum_value(a.state.dtype) == KDAJIT_DTYPE_F32 ? StateDtype::f32 : StateDtype::bf16;
  family.conv = lay.conv;
  family.gate = sc.gate;
  call.shape.mode = sc.mode;
  call.shape.rows = sz.R;
  call.shape.num_seqs = op == Op::packed ? sz.N : 0;
  call.params = make_params(a, sz, lay);
  return call;
}

}  // namespace kdajit
