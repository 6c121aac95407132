// Host-side validation of the chunk op (docs/CONTRACT.md §11): the baselines
// pass and fill the parameter block; every rule broken one at a time fails with
// a message naming the argument and the expected value; validation writes
// nothing.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "catch.hpp"
#include "kdajit/kdajit.hpp"
#include "kdajit/runtime/call/validate.hpp"

namespace kdajit {
namespace {

constexpr int64_t kD = kHeadDim;

struct ChunkConfig {
  int64_t heads = 4, rows = 70, seqs = 3;
  kdajit_dtype_t state = KDAJIT_DTYPE_F32, g = KDAJIT_DTYPE_BF16, beta = KDAJIT_DTYPE_BF16;
  bool initial = true, final_state = true, dt_bias = true;
  int64_t row_pad = 8;
};

// kdajit_chunk_args_init's defaults (the C entry points are tested in test_c_api).
kdajit_chunk_args_t chunk_defaults() {
  kdajit_chunk_args_t a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.gate = KDAJIT_GATE_BOUNDED;
  a.lower_bound = -5.f;
  a.scale = 0.08838834764831845f;
  a.qk_l2norm = 1;
  a.beta_sigmoid = 1;
  return a;
}

// Host buffers behind every view (validation must not write them) and the args.
struct HostChunk {
  std::vector<std::vector<std::byte>> buffers;
  kdajit_chunk_args_t args = chunk_defaults();

  kdajit_tensor_t make(kdajit_dtype_t dtype, std::initializer_list<int64_t> shape,
                       std::initializer_list<int64_t> strides) {
    kdajit_tensor_t t = tensor_view(nullptr, dtype, shape, strides);
    int64_t extent = 1;
    for (int i = 0; i < t.ndim; ++i) extent += (t.shape[i] - 1) * t.strides[i];
    buffers.emplace_back(static_cast<size_t>(extent) * (dtype == KDAJIT_DTYPE_BF16 ? 2 : 4) + 64, std::byte{0x5A});
    // 16-byte aligned start inside the buffer.
    auto p = reinterpret_cast<uintptr_t>(buffers.back().data());
    t.data = reinterpret_cast<void*>((p + 15) / 16 * 16);
    return t;
  }

  explicit HostChunk(const ChunkConfig& c) {
    const int64_t H = c.heads, R = c.rows, N = c.seqs, hidden = H * kD, slice = kD * kD;
    args.q = make(KDAJIT_DTYPE_BF16, {R, H, kD}, {hidden + c.row_pad, kD, 1});
    args.k = make(KDAJIT_DTYPE_BF16, {R, H, kD}, {hidden, kD, 1});
    args.v = make(KDAJIT_DTYPE_BF16, {R, H, kD}, {hidden + 2 * c.row_pad, kD, 1});
    args.g = make(c.g, {R, H, kD}, {hidden, kD, 1});
    args.beta = make(c.beta, {R, H}, {H + 1, 1});
    args.A_log = make(KDAJIT_DTYPE_F32, {H}, {1});
    if (c.dt_bias) args.dt_bias = make(KDAJIT_DTYPE_F32, {hidden}, {1});
    if (c.initial) args.initial_state = make(c.state, {N, H, kD, kD}, {H * slice + 64, slice, kD, 1});
    if (c.final_state) args.final_state = make(c.state, {N, H, kD, kD}, {H * slice, slice, kD, 1});
    args.output = make(KDAJIT_DTYPE_BF16, {R, H, kD}, {hidden + c.row_pad, kD, 1});
    args.cu_seqlens = make(KDAJIT_DTYPE_INT32, {N + 1}, {1});
  }

  // Validates, and checks that no buffer changed.
  Result<ValidatedCall> validate() const {
    const auto before = buffers;
    auto r = validate_chunk(args);
    CHECK(buffers == before);
    return r;
  }
};

void expect_error(const HostChunk& call, const std::string& needle, ErrorCode code = ErrorCode::invalid_argument) {
  auto r = call.validate();
  REQUIRE_FALSE(r.ok());
  INFO(r.error().message);
  CHECK(r.error().code == code);
  CHECK(r.error().message.find(needle) != std::string::npos);
}

TEST_CASE("validate chunk: the baselines pass and fill the parameter block", "[validate][chunk]") {
  for (auto st : {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16})
    for (auto gd : {KDAJIT_DTYPE_BF16, KDAJIT_DTYPE_F32})
      for (int v_first : {0, 1})
        for (bool initial : {true, false}) {
          ChunkConfig c;
          c.state = st;
          c.g = c.beta = gd;
          c.initial = initial;
          c.dt_bias = initial;
          HostChunk call(c);
          call.args.state_v_first = v_first;
          call.args.gate = v_first ? KDAJIT_GATE_SOFTPLUS : KDAJIT_GATE_BOUNDED;
          call.args.max_seq_len = v_first ? 40 : 0;
          auto r = call.validate();
          INFO((r ? std::string() : r.error().message));
          REQUIRE(r.ok());
          const KernelKey& f = r->shape.family;
          CHECK(f.op == Op::chunk);
          CHECK(f.heads == c.heads);
          CHECK(f.tokens == kPrefillChunk);
          CHECK(f.state == (st == KDAJIT_DTYPE_F32 ? StateDtype::f32 : StateDtype::bf16));
          CHECK(f.conv == ConvLayout::sd);
          CHECK(f.gate == (v_first ? Gate::softplus : Gate::bounded));
          CHECK(r->shape.rows == c.rows);
          CHECK(r->shape.num_seqs == c.seqs);
          CHECK(r->shape.max_seq_len == (v_first ? 40 : c.rows));
          const KdaParams& p = r->params;
          const kdajit_chunk_args_t& a = call.args;
          CHECK(p.q == a.q.data);
          CHECK(p.k == a.k.data);
          CHECK(p.v == a.v.data);
          CHECK(p.q_row_stride == a.q.strides[0]);
          CHECK(p.k_row_stride == a.k.strides[0]);
          CHECK(p.v_row_stride == a.v.strides[0]);
          CHECK(static_cast<const void*>(p.raw_gate) == a.g.data);
          CHECK(static_cast<const void*>(p.raw_beta) == a.beta.data);
          CHECK(p.gate_row_stride == a.g.strides[0]);
          CHECK(p.beta_row_stride == a.beta.strides[0]);
          CHECK(p.dt_bias == (initial ? a.dt_bias.data : nullptr));
          CHECK(p.state == (initial ? a.initial_state.data : nullptr));
          CHECK(p.state_slot_stride == (initial ? a.initial_state.strides[0] : 0));
          CHECK(p.final_state == a.final_state.data);
          CHECK(p.final_slot_stride == a.final_state.strides[0]);
          CHECK(p.state_v_stride == (v_first ? kD : 1));
          CHECK(p.state_k_stride == (v_first ? 1 : kD));
          CHECK(p.state_bf16 == (st == KDAJIT_DTYPE_BF16 ? 1 : 0));
          CHECK(p.output == a.output.data);
          CHECK(p.out_row_stride == a.output.strides[0]);
          CHECK(p.query_start_loc == a.cu_seqlens.data);
          CHECK(p.rows == c.rows);
          CHECK(p.num_seqs == c.seqs);
          CHECK(p.scale == a.scale);
          CHECK(p.chunk_flags == (KDA_CHUNK_QK_L2NORM | KDA_CHUNK_BETA_SIGMOID |
                                  (gd == KDAJIT_DTYPE_F32 ? KDA_CHUNK_G_F32 | KDA_CHUNK_BETA_F32 : 0)));
          CHECK(p.state_indices == nullptr);
          CHECK(p.conv_state == nullptr);
          CHECK(p.norm_weight == nullptr);
        }
}

TEST_CASE("validate chunk: neither state given means f32 keys; the flags reach the parameter block", "[validate][chunk]") {
  ChunkConfig c;
  c.initial = c.final_state = false;
  c.state = KDAJIT_DTYPE_BF16;
  HostChunk call(c);
  call.args.qk_l2norm = 0;
  call.args.beta_sigmoid = 0;
  call.args.scale = 0.5f;
  auto r = call.validate();
  REQUIRE(r.ok());
  CHECK(r->shape.family.state == StateDtype::f32);
  CHECK(r->params.chunk_flags == 0);
  CHECK(r->params.scale == 0.5f);
  CHECK(r->params.final_state == nullptr);
}

TEST_CASE("validate chunk: every rule broken alone names the argument", "[validate][chunk]") {
  const ChunkConfig c;
  struct Case {
    const char* what;
    std::function<void(HostChunk&)> breaks;
    std::string needle;
    ErrorCode code = ErrorCode::invalid_argument;
  };
  const int64_t H = c.heads, R = c.rows, hidden = H * kD;
  const std::vector<Case> cases = {
      {"q dtype", [](HostChunk& h) { h.args.q.dtype = KDAJIT_DTYPE_F32; }, "q: expected dtype bf16, got f32"},
      {"q null", [](HostChunk& h) { h.args.q.data = nullptr; }, "q: expected a non-null data pointer"},
      {"k rows", [&](HostChunk& h) { h.args.k.shape[0] = R + 1; }, "k: expected shape [R=70, H=4, 128]"},
      {"v row stride", [&](HostChunk& h) { h.args.v.strides[0] = hidden - 1; }, "v: expected strides (row >= 512, 128, 1)"},
      {"v head stride", [](HostChunk& h) { h.args.v.strides[1] = 256; }, "v: expected strides"},
      {"g dtype", [](HostChunk& h) { h.args.g.dtype = KDAJIT_DTYPE_INT32; }, "g: expected dtype f32 or bf16, got int32"},
      {"beta heads", [&](HostChunk& h) { h.args.beta.shape[1] = H + 1; }, "beta: expected shape [R=70, H=4]"},
      {"beta rank", [](HostChunk& h) { h.args.beta.ndim = 3; }, "beta: expected ndim 2"},
      {"A_log empty", [](HostChunk& h) { h.args.A_log.shape[0] = 0; }, "A_log: expected shape [H] with H (heads) in 1..128"},
      {"A_log heads", [](HostChunk& h) { h.args.A_log.shape[0] = 129; }, "A_log: expected shape [H]", ErrorCode::unsupported},
      {"dt_bias size", [&](HostChunk& h) { h.args.dt_bias.shape[0] = hidden - 1; }, "dt_bias: expected shape [H*128=512]"},
      {"initial rows", [](HostChunk& h) { h.args.initial_state.shape[0] = 4; }, "initial_state: expected shape [N=3"},
      {"initial align", [](HostChunk& h) { h.args.initial_state.strides[0] = 4 * kD * kD + 2; },
       "initial_state: expected a slot stride that is a multiple of 16 bytes"},
      {"final dtype", [](HostChunk& h) { h.args.final_state.dtype = KDAJIT_DTYPE_BF16; },
       "final_state: expected dtype f32 (initial_state's), got bf16"},
      {"final layout", [](HostChunk& h) { h.args.final_state.strides[3] = kD; }, "final_state: expected strides"},
      {"output dtype", [](HostChunk& h) { h.args.output.dtype = KDAJIT_DTYPE_F32; }, "output: expected dtype bf16"},
      {"cu_seqlens N=0", [](HostChunk& h) { h.args.cu_seqlens.shape[0] = 1; },
       "cu_seqlens: expected shape [N+1] with N (sequences) in 1.."},
      {"cu_seqlens dtype", [](HostChunk& h) { h.args.cu_seqlens.dtype = KDAJIT_DTYPE_F32; },
       "cu_seqlens: expected dtype int32, got f32"},
      {"cu_seqlens stride", [](HostChunk& h) { h.args.cu_seqlens.strides[0] = 2; }, "cu_seqlens: expected strides (1)"},
      {"gate", [](HostChunk& h) { h.args.gate = static_cast<kdajit_gate_t>(7); }, "gate: expected bounded|softplus, got 7"},
      {"lower_bound", [](HostChunk& h) { h.args.lower_bound = 0.f; }, "lower_bound: expected a finite value < 0"},
      {"scale 0", [](HostChunk& h) { h.args.scale = 0.f; }, "scale: expected a finite value > 0, got 0"},
      {"scale NaN", [](HostChunk& h) { h.args.scale = std::nanf(""); }, "scale: expected a finite value > 0"},
      {"qk_l2norm", [](HostChunk& h) { h.args.qk_l2norm = 2; }, "qk_l2norm: expected 0 or 1, got 2"},
      {"beta_sigmoid", [](HostChunk& h) { h.args.beta_sigmoid = -1; }, "beta_sigmoid: expected 0 or 1, got -1"},
      {"state_v_first", [](HostChunk& h) { h.args.state_v_first = 3; }, "state_v_first: expected 0 or 1, got 3"},
      {"max_seq_len", [](HostChunk& h) { h.args.max_seq_len = -1; }, "max_seq_len: expected 0 (T_total)"},
      {"workspace_bytes < 0", [](HostChunk& h) { h.args.workspace_bytes = -1; }, "workspace_bytes: expected >= 0, got -1"},
      {"workspace NULL", [](HostChunk& h) { h.args.workspace_bytes = 4096; },
       "workspace: expected a device pointer for workspace_bytes 4096, got NULL"},
      {"workspace without bytes", [](HostChunk& h) { h.args.workspace = reinterpret_cast<void*>(0x10000); },
       "workspace_bytes: expected the workspace's size (> 0) with a workspace, got 0"},
      {"workspace alignment", [](HostChunk& h) {
         h.args.workspace = reinterpret_cast<void*>(0x10008);
         h.args.workspace_bytes = 4096;
       }, "workspace: expected a pointer aligned to 16 bytes, got 0x10008"},
  };
  for (const Case& k : cases) {
    INFO(k.what);
    HostChunk call(c);
    k.breaks(call);
    expect_error(call, k.needle, k.code);
  }
}

TEST_CASE("validate decode: a chunk op on decode args names the chunk entry", "[validate][chunk]") {
  kdajit_decode_args_t a{};
  a.struct_size = sizeof a;
  auto r = validate_decode(Op::chunk, a);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("kdajit_chunk_args_t") != std::string::npos);
}

}  // namespace
}  // namespace kdajit
