// GPU tests of the chunk op (docs/CONTRACT.md §11: the prefill's delta rule on
// FLA chunk_kda's tensors) against the f64 reference ref::chunk: every route on
// fresh random data with poisoned outputs and final states (ref::ChunkProblem),
// ragged batches with empty and malformed sequences, both state dtypes, layouts
// and gates, bf16 and f32 g and beta, the flags off, no initial state, no final
// state, in place, and a sequence split over two calls (the first call's final
// state the second's initial one) equal to one call.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dynamic_tests.hpp"
#include "gpu_harness.hpp"
#include "kdajit/chunk_problem.hpp"
#include "kdajit/reference.hpp"
#include "kdajit/routes.hpp"

using namespace kdajit;
using namespace kdajit::test;
using ref::ChunkProblem;
using ref::ChunkSpec;

namespace {

// The chunk op's routes, by name: every row of the route table that serves it.
const std::vector<std::string_view> kRoutes = route_names(Op::chunk);

std::string key_for(const ChunkSpec& s, std::string_view route) {
  return fmt::format("kda_chunk.h{}.state_{}.conv_sd.t{}.gate_{}.route_{}.{}", s.heads,
                     s.state == KDAJIT_DTYPE_F32 ? "f32" : "bf16", route_chunk(*parse_field<Route>(route)),
                     s.gate == KDAJIT_GATE_BOUNDED ? "bounded" : "softplus", route, to_string(device_arch()));
}

std::unique_ptr<ref::DeviceChunk> upload(ChunkProblem& p) {
  auto d = ref::DeviceChunk::upload(p);
  if (!d) FAIL("upload: " << d.error().message);
  return std::move(d).value();
}

void check(const ChunkProblem& expected, const ChunkProblem& got, const std::string& what) {
  const ref::ChunkReport r = ref::compare_chunk(expected, got);
  INFO(what << ": " << r.summary());
  CHECK(r.pass);
}

// One problem, the reference once, then each route forced: the key it names, then the call.
void check_routes(const ChunkSpec& s, const std::vector<std::string_view>& routes) {
  const ChunkProblem input = ChunkProblem::make(s);
  ChunkProblem expected = input;
  Status r = ref::chunk(expected.args);
  INFO((r ? std::string() : r.error().message));
  REQUIRE(r.ok());
  for (std::string_view route : routes) {
    INFO("route " << route);
    Runtime& rt = runtime_for(route);
    ChunkProblem got = input;
    auto dev = upload(got);
    const auto st = reinterpret_cast<kdajit_stream_t>(stream());
    std::string key;
    Outcome k = rt.selected_chunk_key(dev->args(), st, &key);
    INFO(k.message);
    REQUIRE(k.ok());
    CHECK(key == key_for(s, route));
    Outcome o = rt.chunk(dev->args(), st);
    INFO(o.message);
    REQUIRE(o.ok());
    KDAJIT_CUDA_CHECK(cudaStreamSynchronize(stream()));
    Status d = dev->download(got);
    REQUIRE(d.ok());
    check(expected, got, s.name() + ", route " + std::string(route));
  }
}

const bool registered = [] {
  uint64_t seed = 9100;
  for (auto st : {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16})
    for (auto g : {KDAJIT_GATE_BOUNDED, KDAJIT_GATE_SOFTPLUS}) {
      ChunkSpec s;
      s.state = st;
      s.gate = g;
      s.seed = seed++;
      test::register_test(s.name() + ", every route", "[gpu][chunk]",
                          [s] { check_routes(s, kRoutes); });
    }
  for (int h : {8, 32, 64, 12, 96}) {
    ChunkSpec s;
    s.heads = h;
    s.seed = seed++;
    test::register_test(s.name() + ", rowcta", "[gpu][chunk]", [s] { check_routes(s, {"rowcta"}); });
  }
  return true;
}();

}  // namespace

TEST_CASE("chunk: f32 g and beta, beta as given, no L2 norm, state_v_first, every route", "[gpu][chunk]") {
  ChunkSpec s;
  s.g_dtype = s.beta_dtype = KDAJIT_DTYPE_F32;
  s.beta_sigmoid = false;
  s.qk_l2norm = false;
  s.state_v_first = true;
  s.seed = 9200;
  check_routes(s, {"rowcta", "split2", "split4", "split8", "twopass"});
}

TEST_CASE("chunk: no initial state and no dt_bias; no final state; in place", "[gpu][chunk]") {
  ChunkSpec a;
  a.initial = false;
  a.dt_bias = false;
  a.seed = 9300;
  check_routes(a, {"rowcta", "split4", "twopass"});
  ChunkSpec b;
  b.final_state = false;
  b.state = KDAJIT_DTYPE_BF16;
  b.seed = 9301;
  check_routes(b, {"rowcta", "split2"});
  ChunkSpec c;
  c.in_place = true;
  c.state_v_first = true;
  c.seed = 9302;
  check_routes(c, {"rowcta", "split8", "twopass"});
}

TEST_CASE("chunk: q, k and output rows not 16-byte aligned (route twopass's step 1 unstaged), every route", "[gpu][chunk]") {
  ChunkSpec s;
  s.row_pad = 3;
  s.lengths = {65, 0, 200, 1};
  s.seed = 9303;
  check_routes(s, {"rowcta", "split2", "split4", "split8", "twopass"});
}

TEST_CASE("chunk: route twopass at P = 8, 4, 2 and 1 state pass CTAs per (sequence, head)", "[gpu][chunk]") {
  // The default 6 sequences at H = 2, 4, 8 and 16: the largest P with
  // P x N x H <= 132 SMs is 8, 4, 2, 1 (state_pass_shared at P = 8 and 4,
  // on Hopper step 5 on wgmma at 2 and 1); a weak decay.
  uint64_t seed = 9310;
  for (int h : {2, 4, 8, 16}) {
    ChunkSpec s;
    s.heads = h;
    s.lower_bound = -0.1f;
    s.seed = seed++;
    check_routes(s, {"twopass"});
  }
}

TEST_CASE("chunk: malformed cu_seqlens ranges give zero rows and leave their final state", "[gpu][chunk]") {
  ChunkSpec s;
  // [3, 70) live, [70, 60) malformed, [60, 200) live, [200, 200) empty,
  // [200, 1100) live, [1100, 1300) past T_total = 1250; rows [0, 3) before cu[0].
  s.cu = {3, 70, 60, 200, 200, 1100, 1300};
  s.rows = 1250;
  s.seed = 9400;
  check_routes(s, {"rowcta", "split4", "twopass"});
}

TEST_CASE("chunk: one sequence of 8192 tokens, rowcta, split4 and twopass", "[gpu][chunk][long]") {
  ChunkSpec s;
  s.lengths = {8192};
  s.rows_after = 0;
  s.seed = 9450;
  check_routes(s, {"rowcta", "split4", "twopass"});
}

// Half a sub-chunk decays past the factored pass's limit: the diagonal blocks
// of A and M take one exponential per element (docs/DESIGN.md "Prefill").
TEST_CASE("chunk: a strong decay (the per-element path for A and M), every route", "[gpu][chunk]") {
  ChunkSpec s;
  s.lower_bound = -20.f;
  s.seed = 9460;
  check_routes(s, {"rowcta", "split2", "split4", "split8", "twopass"});
}

TEST_CASE("chunk: a sequence in two calls equals one call, every route", "[gpu][chunk]") {
  ChunkSpec whole;
  whole.lengths = {1000};
  whole.rows_after = 0;
  whole.seed = 9500;
  const ChunkProblem input = ChunkProblem::make(whole);
  ChunkProblem expected = input;
  REQUIRE(ref::chunk(expected.args).ok());
  for (std::string_view route : kRoutes) {
    INFO("route " << route);
    // Call A: rows [0, 437) into the state M; call B: rows [437, 1000) from M
    // into the final state, its output into a second buffer (each call zeroes
    // the rows outside its sequences).
    ChunkProblem got = input;
    auto dev = upload(got);
    const int64_t H = got.H, D = 128, slice = D * D;
    const std::vector<int32_t> cu = {0, 437, 437, 1000};
    int32_t* dcu = nullptr;
    void* mid = nullptr;
    void* out_b = nullptr;
    const size_t state_bytes = static_cast<size_t>(H * slice) * ref::dtype_size(whole.state);
    KDAJIT_CUDA_CHECK(cudaMalloc(&dcu, cu.size() * sizeof(int32_t)));
    KDAJIT_CUDA_CHECK(cudaMemcpy(dcu, cu.data(), cu.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    KDAJIT_CUDA_CHECK(cudaMalloc(&mid, state_bytes));
    KDAJIT_CUDA_CHECK(cudaMalloc(&out_b, got.output.bytes.size()));
    // Call B's buffer starts poisoned like the problem's output (its padding is compared).
    KDAJIT_CUDA_CHECK(cudaMemcpy(out_b, got.output.bytes.data(), got.output.bytes.size(), cudaMemcpyHostToDevice));
    KDAJIT_CUDA_CHECK(cudaDeviceSynchronize());  // the legacy-stream copies land before the calls
    const kdajit_tensor_t mid_view = tensor_view(mid, whole.state, {1, H, D, D}, {H * slice, slice, D, 1});
    kdajit_chunk_args_t a = dev->args(), b = dev->args();
    a.cu_seqlens = dense_tensor_view(dcu, KDAJIT_DTYPE_INT32, {2});
    a.final_state = mid_view;
    b.cu_seqlens = dense_tensor_view(dcu + 2, KDAJIT_DTYPE_INT32, {2});
    b.initial_state = mid_view;
    b.output.data = out_b;
    Runtime& rt = runtime_for(route);
    const auto st = reinterpret_cast<kdajit_stream_t>(stream());
    Outcome oa = rt.chunk(a, st);
    INFO(oa.message);
    REQUIRE(oa.ok());
    Outcome ob = rt.chunk(b, st);
    INFO(ob.message);
    REQUIRE(ob.ok());
    KDAJIT_CUDA_CHECK(cudaStreamSynchronize(stream()));
    REQUIRE(dev->download(got).ok());
    // Rows [437, 1000) come from call B's buffer (the last row ends the buffer: no padding after it).
    const int64_t row_bytes = got.output.view.strides[0] * 2;
    const size_t tail = got.output.bytes.size() - static_cast<size_t>(437 * row_bytes);
    KDAJIT_CUDA_CHECK(cudaMemcpy(got.output.bytes.data() + 437 * row_bytes, static_cast<std::byte*>(out_b) + 437 * row_bytes,
                                 tail, cudaMemcpyDeviceToHost));
    cudaFree(dcu);
    cudaFree(mid);
    cudaFree(out_b);
    check(expected, got, "two calls, route " + std::string(route));
  }
}

TEST_CASE("chunk: the same call repeated writes the same bytes, every route", "[gpu][chunk]") {
  // No atomics and no order-dependent sums: a call is a pure function of its
  // inputs. Each repetition starts from the poisoned output and final state.
  ChunkSpec s;
  s.seed = 9100;  // the shape and data of the first "every route" case
  const ChunkProblem input = ChunkProblem::make(s);
  for (std::string_view route : kRoutes) {
    INFO("route " << route);
    Runtime& rt = runtime_for(route);
    std::vector<std::byte> first_out, first_state;
    for (int rep = 0; rep < 4; ++rep) {
      INFO("repetition " << rep);
      ChunkProblem got = input;
      auto dev = upload(got);
      Outcome o = rt.chunk(dev->args(), reinterpret_cast<kdajit_stream_t>(stream()));
      INFO(o.message);
      REQUIRE(o.ok());
      KDAJIT_CUDA_CHECK(cudaStreamSynchronize(stream()));
      REQUIRE(dev->download(got).ok());
      if (rep == 0) {
        first_out = got.output.bytes;
        first_state = got.final_state.bytes;
        continue;
      }
      const auto differ = std::mismatch(first_out.begin(), first_out.end(), got.output.bytes.begin()).first;
      INFO("the first output row that differs from the first call's: "
           << (differ - first_out.begin()) / (got.output.view.strides[0] * 2));
      CHECK(differ == first_out.end());
      CHECK(got.final_state.bytes == first_state);
    }
  }
}

TEST_CASE("chunk: small ragged batches under the sanitizers, every route, both state layouts", "[gpu][chunk][sanitize]") {
  ChunkSpec a;
  a.heads = 4;
  a.lengths = {65, 0, 130, 1};
  a.rows_after = 3;
  a.seed = 9600;
  check_routes(a, {"rowcta", "split2", "split4", "split8", "rowcta16", "pipe16"});
  ChunkSpec b = a;
  b.state = KDAJIT_DTYPE_BF16;
  b.in_place = true;
  b.state_v_first = true;
  b.g_dtype = b.beta_dtype = KDAJIT_DTYPE_F32;
  b.seed = 9601;
  check_routes(b, {"rowcta", "split2", "split4", "split8", "rowcta16", "pipe16"});
}
