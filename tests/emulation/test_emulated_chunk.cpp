// The chunk op's kernel (templates/kda_prefill.cu with KDA_CHUNK 1, the source
// `kdajit show` prints for the key) emulated on the CPU (cuda_on_cpu.hpp)
// against the f64 reference, on every route: the call validated and laid out
// by the runtime's own code (validate_chunk, launch_plan), every CTA of the
// grid run with its shared memory poisoned (NaN bytes) first, the outputs and
// final states poisoned, then compared like test_gpu_chunk. No GPU: this runs
// in CI and catches a wrong index, a missing barrier that reorders a read, or
// a shared-memory read before its write, in every route.
#include <optional>
#include <string>

#include "catch.hpp"
#include "emulated_launch.hpp"
#include "kdajit/chunk_problem.hpp"
#include "kdajit/reference.hpp"

using namespace kdajit;
using ref::ChunkProblem;
using ref::ChunkSpec;

namespace {

// Route twopass needs a workspace: `ws` (reused across calls), else a fresh
// poisoned one; `sm_count` sets its state pass CTAs per (sequence, head).
void check_key(const std::string& key_name, const ChunkSpec& s, unsigned max_wave = 0, emu::Workspace* ws = nullptr,
               int sm_count = 132) {
  const ChunkProblem input = ChunkProblem::make(s);
  ChunkProblem expected = input;
  REQUIRE(ref::chunk(expected.args).ok());
  ChunkProblem got = input;
  std::optional<emu::Workspace> fresh;
  if (key_name.find(".route_twopass.") != std::string::npos) {
    if (ws == nullptr) ws = &fresh.emplace(got.N, got.R, got.H);
    got.args.workspace = ws->data();
    got.args.workspace_bytes = ws->size();
  }
  auto call = validate_chunk(got.args);
  INFO(key_name << ": " << (call ? std::string() : call.error().message));
  REQUIRE(call.ok());
  REQUIRE_NOTHROW(emu::emulate_call(key_name, *call, max_wave, sm_count));
  const ref::ChunkReport r = ref::compare_chunk(expected, got);
  INFO(key_name << ": " << r.summary());
  CHECK(r.pass);
}

// Two heads over two chunks (the second of one row), an empty sequence and a short one.
ChunkSpec ragged(uint64_t seed) {
  ChunkSpec s;
  s.heads = 2;
  s.lengths = {65, 0, 3};
  s.rows_after = 3;
  s.seed = seed;
  return s;
}

}  // namespace

TEST_CASE("emulated chunk kernel: ragged batch, every route, f32 state, bounded gate", "[emulation][chunk]") {
  for (const char* route : {"rowcta", "split2", "split4", "split8"}) {
    const ChunkSpec s = ragged(9700);
    check_key(std::string("kda_chunk.h2.state_f32.conv_sd.t64.gate_bounded.route_") + route + ".sm_90", s);
  }
}

TEST_CASE("emulated chunk kernel: chunks of 16 (routes rowcta16 and pipe16), rows copied and element-wise, a strong decay",
          "[emulation][chunk]") {
  // Lengths around the chunk edges of 16, step 1 by 16-byte copies, then with
  // rows that are not 16-byte aligned (element by element) and f32 g and beta
  // (every sequence through one CTA per head), then the per-element path for
  // the chunk's one block of A and M. Route pipe16 also on sm_100a (its
  // consumer's state pass on mma.sync).
  for (const char* key : {"kda_chunk.h2.state_f32.conv_sd.t16.gate_bounded.route_rowcta16.sm_90",
                          "kda_chunk.h2.state_f32.conv_sd.t16.gate_bounded.route_pipe16.sm_90",
                          "kda_chunk.h2.state_f32.conv_sd.t16.gate_bounded.route_pipe16.sm_100a"}) {
    INFO(key);
    ChunkSpec s = ragged(9730);
    s.lengths = {17, 0, 1, 40, 16, 15};
    check_key(key, s);
    s.seed = 9731;
    s.row_pad = 3;
    s.g_dtype = s.beta_dtype = KDAJIT_DTYPE_F32;
    check_key(key, s, 1);
    s = ragged(9732);
    s.lengths = {33, 16};
    s.lower_bound = -20.f;
    check_key(key, s);
  }
}

TEST_CASE("emulated chunk kernel: route pipe16, long sequences through one CTA (the ring full)", "[emulation][chunk]") {
  // As the prefill op's case: the consumer's warps held back most rounds, the
  // producers a ring ahead; the chunk op hands a slot back right after step 5.
  ChunkSpec s = ragged(9740);
  s.lengths = {150, 3, 240};
  emu::set_slow_warps(8, 15);
  check_key("kda_chunk.h2.state_f32.conv_sd.t16.gate_bounded.route_pipe16.sm_90", s, 1);
  emu::set_slow_warps(1, 0);
}

TEST_CASE("emulated chunk kernel: no L2 norm, beta as given, rowcta and twopass", "[emulation][chunk]") {
  // q and k as given (scale and 1 for every token): norm_scales' no-norm
  // branch, in the fused kernel and in the intra-chunk kernel.
  for (const char* route : {"rowcta", "twopass"}) {
    ChunkSpec s = ragged(9706);
    s.qk_l2norm = false;
    s.beta_sigmoid = false;
    check_key(std::string("kda_chunk.h2.state_f32.conv_sd.t64.gate_bounded.route_") + route + ".sm_90", s);
  }
}

TEST_CASE("emulated chunk kernel: bf16 state in FLA's layout in place, softplus gate, f32 g and beta", "[emulation][chunk]") {
  ChunkSpec s;
  s.heads = 2;
  s.lengths = {70, 1};
  s.rows_after = 2;
  s.state = KDAJIT_DTYPE_BF16;
  s.gate = KDAJIT_GATE_SOFTPLUS;
  s.g_dtype = s.beta_dtype = KDAJIT_DTYPE_F32;
  s.in_place = true;
  s.seed = 9701;
  check_key("kda_chunk.h2.state_bf16.conv_sd.t64.gate_softplus.route_rowcta.sm_90", s);
}

TEST_CASE("emulated chunk kernel: the bounded programs serve bf16 state too, split4 and split8", "[emulation][chunk]") {
  for (const char* route : {"split4", "split8"}) {
    ChunkSpec s;
    s.heads = 2;
    s.lengths = {65, 0, 3};
    s.rows_after = 3;
    s.state = KDAJIT_DTYPE_BF16;
    s.seed = 9704;
    check_key(std::string("kda_chunk.h2.state_bf16.conv_sd.t64.gate_bounded.route_") + route + ".sm_90", s);
  }
}

TEST_CASE("emulated chunk kernel: malformed and empty ranges, every sequence through one CTA", "[emulation][chunk]") {
  // [3, 70) live, [70, 60) malformed (zero rows, final state untouched),
  // [60, 80) live over rows the malformed one names, [80, 80) empty, rows
  // [0, 3) and [80, 84) outside every sequence; one CTA per head and rank walks all.
  ChunkSpec s;
  s.heads = 2;
  s.cu = {3, 70, 60, 80, 80};
  s.rows = 84;
  s.seed = 9702;
  check_key("kda_chunk.h2.state_f32.conv_sd.t64.gate_bounded.route_rowcta.sm_90", s, 1);
  check_key("kda_chunk.h2.state_f32.conv_sd.t64.gate_bounded.route_split2.sm_90", s, 1);
}

TEST_CASE("emulated chunk kernel: a strong decay (the per-element path for A and M), rowcta and split4", "[emulation][chunk]") {
  // lower_bound -20: half a sub-chunk decays by up to 160, past the factored
  // pass's limit of 60, so the diagonal blocks take one exponential per element.
  ChunkSpec s;
  s.heads = 2;
  s.lengths = {65, 3};
  s.lower_bound = -20.f;
  s.seed = 9703;
  for (const char* route : {"rowcta", "split4"})
    check_key(std::string("kda_chunk.h2.state_f32.conv_sd.t64.gate_bounded.route_") + route + ".sm_90", s);
}

// test_gpu_chunk's first case (H = 16, lengths 65, 0, 1000, 1, 64, 63, seed
// 9100) on the H2 programs, which serve every H: to replay on the CPU what a
// GPU run of that case shows. About 8 minutes a route on one core: not in CI.
TEST_CASE("emulated chunk kernel: test_gpu_chunk's first case, rowcta and split4", "[.][emulation][chunk][long]") {
  ChunkSpec s;
  s.seed = 9100;
  for (const char* route : {"rowcta", "split4"})
    check_key(std::string("kda_chunk.h2.state_f32.conv_sd.t64.gate_bounded.route_") + route + ".sm_90", s);
}

TEST_CASE("emulated chunk kernel: route twopass, ragged batch, one workspace over three calls", "[emulation][chunk]") {
  // The intra-chunk kernel's units for every chunk, then the state pass from
  // them; the same workspace, with the units of the call before, serves the
  // next call (every unit's tag is rewritten). The second call walks units
  // and sequences with CTAs of several each; the third splits the state pass
  // over 2 CTAs per (sequence, head) instead of 8 (N x H = 12 on 24 SMs).
  ChunkSpec s;
  s.heads = 2;
  s.lengths = {65, 0, 130, 1, 64, 63};
  s.seed = 9801;
  const std::string key = "kda_chunk.h2.state_f32.conv_sd.t64.gate_bounded.route_twopass.sm_90";
  emu::Workspace ws(static_cast<int64_t>(s.lengths.size()), 65 + 130 + 1 + 64 + 63 + s.rows_after, 2);
  check_key(key, s, 0, &ws);
  s.seed = 9802;
  check_key(key, s, 2, &ws);
  s.seed = 9806;
  check_key(key, s, 0, &ws, 24);
  // And over 1 (12 SMs), with a weak decay, so that S W^T and S Qg^T weigh on
  // every token row of a chunk (on sm_90, P <= 2 runs step 5 on wgmma).
  s.seed = 9807;
  s.lower_bound = -0.1f;
  check_key(key, s, 0, &ws, 12);
  s.lower_bound = -5.f;
  // bf16 state in FLA's layout, in place, without an initial state for none: the bounded program serves it.
  s.state = KDAJIT_DTYPE_BF16;
  s.in_place = true;
  s.seed = 9803;
  check_key("kda_chunk.h2.state_bf16.conv_sd.t64.gate_bounded.route_twopass.sm_90", s, 0, &ws);
}

TEST_CASE("emulated chunk kernel: step 1 by 16-byte copies with f32 g and beta, and element-wise for odd row strides",
          "[emulation][chunk]") {
  // The intra-chunk kernel copies q, k, v and g into shared memory when they
  // allow 16-byte copies (f32 g fills all of the stage), the fused kernels q,
  // k and v; a row stride that is not a whole 16 bytes (row pad 3) takes the
  // element-wise loads.
  ChunkSpec s = ragged(9808);
  s.g_dtype = s.beta_dtype = KDAJIT_DTYPE_F32;
  check_key("kda_chunk.h2.state_f32.conv_sd.t64.gate_bounded.route_twopass.sm_90", s);
  s.g_dtype = s.beta_dtype = KDAJIT_DTYPE_BF16;
  s.seed = 9809;
  s.row_pad = 3;
  check_key("kda_chunk.h2.state_f32.conv_sd.t64.gate_bounded.route_twopass.sm_90", s);
  // And the fused kernels' load_chunk on both of its paths.
  for (int pad : {3, 8}) {
    s.row_pad = pad;
    check_key("kda_chunk.h2.state_f32.conv_sd.t64.gate_bounded.route_rowcta.sm_90", s);
    check_key("kda_chunk.h2.state_f32.conv_sd.t64.gate_bounded.route_split4.sm_90", s);
  }
}

TEST_CASE("emulated chunk kernel: route twopass, sequences out of row order, malformed ranges", "[emulation][chunk]") {
  // [70, 140) live, [140, 0) malformed, [0, 70) live: the second live
  // sequence's first chunk has no unit of its own (unit_base is 1, 3, 2:
  // unit 2 holds the first sequence's second chunk), so the state pass
  // computes it itself. The rows of both fall in the zero rows before qsl[0]
  // or from qsl[N] on, which the contract leaves undefined: compare_chunk
  // skips them and checks the other rows and the final states. Then the
  // malformed case above, every sequence through one CTA.
  ChunkSpec s;
  s.heads = 2;
  s.cu = {70, 140, 0, 70};
  s.rows = 143;
  s.seed = 9804;
  check_key("kda_chunk.h2.state_f32.conv_sd.t64.gate_bounded.route_twopass.sm_90", s, 1);
  s.cu = {3, 70, 60, 80, 80};
  s.rows = 84;
  s.seed = 9805;
  check_key("kda_chunk.h2.state_f32.conv_sd.t64.gate_bounded.route_twopass.sm_90", s, 1);
}
