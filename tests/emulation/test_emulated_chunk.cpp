// The chunk op's kernel (templates/kda_prefill.cu with KDA_CHUNK 1, the source
// `kdajit show` prints for the key) emulated on the CPU (cuda_on_cpu.hpp)
// against the f64 reference, on every route: the call validated and laid out
// by the runtime's own code (validate_chunk, launch_plan), every CTA of the
// grid run with its shared memory poisoned (NaN bytes) first, the outputs and
// final states poisoned, then compared like test_gpu_chunk. No GPU: this runs
// in CI and catches a wrong index, a missing barrier that reorders a read, or
// a shared-memory read before its write, in every route.
#include <string>

#include "catch.hpp"
#include "emulated_launch.hpp"
#include "kdajit/chunk_problem.hpp"
#include "kdajit/reference.hpp"

using namespace kdajit;
using ref::ChunkProblem;
using ref::ChunkSpec;

namespace {

void check_key(const std::string& key_name, const ChunkSpec& s, unsigned max_wave = 0) {
  const ChunkProblem input = ChunkProblem::make(s);
  ChunkProblem expected = input;
  REQUIRE(ref::chunk(expected.args).ok());
  ChunkProblem got = input;
  auto call = validate_chunk(got.args);
  INFO(key_name << ": " << (call ? std::string() : call.error().message));
  REQUIRE(call.ok());
  REQUIRE_NOTHROW(emu::emulate_call(key_name, *call, max_wave));
  const ref::ChunkReport r = ref::compare_chunk(expected, got);
  INFO(key_name << ": " << r.summary());
  CHECK(r.pass);
}

}  // namespace

TEST_CASE("emulated chunk kernel: ragged batch, every route, f32 state, bounded gate", "[emulation][chunk]") {
  for (const char* route : {"rowcta", "split2", "split4", "split8"}) {
    ChunkSpec s;
    s.heads = 2;
    s.lengths = {65, 0, 3};  // two chunks (the second of one row), an empty sequence, a short one
    s.rows_after = 3;
    s.seed = 9700;
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
