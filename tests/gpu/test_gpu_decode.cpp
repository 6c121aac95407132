// GPU tests on the device: every specialization against the f64 reference
// (docs/CONTRACT.md §8), plus graph capture, determinism, layouts and slot rules.
// One test case per kernel key, named by the key.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>

#include <fmt/format.h>

#include "dynamic_tests.hpp"
#include "gpu_harness.hpp"
#include "kdajit/kernel_key.hpp"
#include "kdajit/presets.hpp"
#include "kdajit/routes.hpp"

using namespace kdajit;
using kdajit::ref::Problem;
using kdajit::ref::ProblemSpec;
using kdajit::ref::Tensor;
// The harness: make_runtime, runtime, runtime_for, stream, device_arch, DeviceProblem.
using namespace kdajit::test;

namespace {

Problem make(const ProblemSpec& spec) {
  auto p = Problem::make(spec);
  if (!p) FAIL("Problem::make: " << p.error().message);
  return std::move(p).value();
}

// Runs `got` on the device (in place) and the reference on `expected`; checks.
void run_and_compare(Problem& expected, Problem& got, Runtime& rt = runtime()) {
  REQUIRE(expected.run_reference().ok());
  DeviceProblem dev(got);
  Outcome o = test::run_op(rt, got.op(), dev.args(), stream());
  INFO(o.message);
  REQUIRE(o.ok());
  dev.download(got);
  auto rep = ref::compare(expected, got);
  INFO(rep.summary());
  INFO(rep.message);
  REQUIRE(rep.pass);
}

void check_problem(const ProblemSpec& spec, Runtime& rt = runtime()) {
  Problem p = make(spec);
  Problem expected = p, got = std::move(p);  // p is not used again
  run_and_compare(expected, got, rt);
}

// Packed: window 1, then window 2 reading the checkpoints window 1 wrote on the
// device (a' accepted in [1, L1]), checked against the reference from the same state.
void check_chained(const ProblemSpec& spec, Runtime& rt) {
  Problem p = make(spec);
  Problem expected = p, got = std::move(p);  // p is not used again
  run_and_compare(expected, got, rt);
  // The second window starts from the device's state after window 1.
  Problem second = std::move(got);  // got is not used again
  auto& acc = second.bytes(Tensor::num_accepted_tokens);
  const auto* qsl = reinterpret_cast<const int32_t*>(second.bytes(Tensor::query_start_loc).data());
  auto* a = reinterpret_cast<int32_t*>(acc.data());
  for (int64_t n = 0; n < second.num_seqs(); ++n) {
    const int32_t len = qsl[n + 1] - qsl[n];
    a[n] = len >= 1 ? 1 + static_cast<int32_t>((n * 7 + 3) % len) : 1;
  }
  second.poison_outputs();  // also snapshots the before-state
  Problem expected2 = second, got2 = std::move(second);
  run_and_compare(expected2, got2, rt);
}

ProblemSpec spec_for(const KernelKey& key, uint64_t seed) { return ref::default_spec(key, seed); }

// The key's route runs it (a runtime forced to that route), so every route is
// checked on every shape of the list whatever the selector would pick.
void check_key(const KernelKey& key, int index) {
  const uint64_t seed = 1000 + static_cast<uint64_t>(index) * 17;
  const float eps = index % 2 ? 1e-6f : 1e-5f;
  Runtime& rt = runtime_for(key.route);
  if (key.op == Op::single) {
    static constexpr int kRows[] = {1, 3, 33, 257};
    for (int rows : {kRows[index % 4], 33}) {
      ProblemSpec s = spec_for(key, seed + rows);
      s.rows = rows;
      s.null_rows = rows >= 3 ? 1 : 0;
      s.oob_rows = rows >= 3 ? 1 : 0;
      s.norm_eps = eps;
      DYNAMIC_SECTION("rows " << rows) { check_problem(s, rt); }
    }
    if (key.route == Route::sequential) {
      // Its reason to exist: repeated slots, applied in row order.
      ProblemSpec s = spec_for(key, seed + 5);
      s.rows = 11;
      s.mode = KDAJIT_INDICES_REPEATED_POSITIVE;
      s.null_rows = s.oob_rows = 0;  // the mode promises positive slots
      s.norm_eps = eps;
      DYNAMIC_SECTION("repeated slots") { check_problem(s, rt); }
    }
  } else {
    // Every accepted count 1..T, ragged and empty sequences, rows beyond qsl[N].
    ProblemSpec s = spec_for(key, seed);
    const int T = key.tokens;
    s.seq_lens.clear();
    s.num_accepted.clear();
    for (int n = 0; n < T + 3; ++n) {
      s.seq_lens.push_back(n == 1 ? 0 : (n % 3 == 2 ? std::max(1, T - 1) : T));
      s.num_accepted.push_back(1 + n % T);
    }
    s.extra_rows = 2;
    s.norm_eps = eps;
    check_chained(s, rt);
  }
}

std::vector<KernelKey> test_keys() {
  const Arch arch = device_arch();
  std::vector<KernelKey> keys;
  std::set<KernelKey> seen;
  auto add = [&](const KernelKey& k) {
    if (seen.insert(k).second) keys.push_back(k);
  };
  for (auto preset : {"glm-5.3-flash", "kimi-k3"}) {
    auto preset_list = preset_keys(preset, arch);
    if (!preset_list) std::abort();
    for (const auto& k : *preset_list)
      if (k.op != Op::prefill) add(k);  // the decode ops; prefill keys have tests of their own
  }
  // Odd head counts, both gates, both ops, every route, dtypes and layouts alternating.
  int i = 0;
  for (int h : {1, 5, 40, 128})
    for (auto op : {Op::single, Op::packed})
      for (auto g : {Gate::bounded, Gate::softplus})
        for (const RouteSpec& r : route_table()) {
          if (!r.serves(op)) continue;
          ++i;
          add({op, h, i % 2 ? StateDtype::bf16 : StateDtype::f32, (i / 2) % 2 ? ConvLayout::ds : ConvLayout::sd,
               op == Op::single ? 1 : 3, g, r.route, arch});
        }
  // Packed T 1..8 beyond the presets' 2..4, every packed route.
  for (int t : {1, 5, 6, 7, 8})
    for (const RouteSpec& r : route_table()) {
      if (!r.serves(Op::packed)) continue;
      ++i;
      add({Op::packed, 16, i % 2 ? StateDtype::bf16 : StateDtype::f32, i % 3 ? ConvLayout::ds : ConvLayout::sd, t,
           t % 2 ? Gate::softplus : Gate::bounded, r.route, arch});
    }
  // bf16 state at T = 1 (phase B on the tensor cores where the tile allows it,
  // kMmaDots in kda_head.cuh): both ops, both layouts, every route.
  for (auto op : {Op::single, Op::packed})
    for (auto cv : {ConvLayout::sd, ConvLayout::ds})
      for (const RouteSpec& r : route_table())
        if (r.serves(op)) add({op, 24, StateDtype::bf16, cv, 1, Gate::bounded, r.route, arch});
  // Softplus on a preset shape, both dtypes, every single-op route.
  for (auto st : {StateDtype::f32, StateDtype::bf16})
    for (const RouteSpec& r : route_table())
      if (r.serves(Op::single)) add({Op::single, 64, st, ConvLayout::sd, 1, Gate::softplus, r.route, arch});
  return keys;
}

const bool registered = [] {
  int index = 0;
  for (const auto& key : test_keys()) {
    const int i = index++;
    test::register_test(key_name(key), "[gpu][key]", [key, i] { check_key(key, i); });
  }
  return true;
}();

KernelKey key_of(Op op, int h, StateDtype st, ConvLayout cv, int t, Gate g = Gate::bounded) {
  return {op, h, st, cv, t, g, Route::rowcta, device_arch()};
}

// Enough items (rows or sequences x heads) that each CTA of route stream's
// grid (<= 2 x SMs) walks several, with null and out-of-range slots (single)
// or empty, short and non-live sequences (packed) spread among them.
void walk_several_items(ProblemSpec& s) {
  const int64_t target = 4 * 2 * 132;  // items
  if (s.op == KDAJIT_OP_SINGLE) {
    s.rows = static_cast<int>(std::max<int64_t>(s.rows, (target + s.heads - 1) / s.heads));
    s.null_rows = s.rows / 9;
    s.oob_rows = s.rows / 13;
  } else {
    const std::vector<int> base = s.seq_lens;
    std::vector<int> lens;
    while (static_cast<int64_t>(lens.size()) * s.heads < target) lens.insert(lens.end(), base.begin(), base.end());
    s.seq_lens = lens;
    s.null_rows = static_cast<int>(lens.size()) / 11;
    s.oob_rows = static_cast<int>(lens.size()) / 17;
  }
}

// Every route that serves `op`.
std::vector<Route> routes_of(Op op) {
  std::vector<Route> out;
  for (const RouteSpec& r : route_table())
    if (r.serves(op)) out.push_back(r.route);
  return out;
}

}  // namespace

TEST_CASE("repeated_positive applies rows in row order (the selector picks sequential)", "[gpu]") {
  for (auto st : {StateDtype::f32, StateDtype::bf16}) {
    ProblemSpec s = ref::default_spec(key_of(Op::single, 8, st, ConvLayout::ds, 1), 77 + static_cast<int>(st));
    s.rows = 12;
    s.null_rows = 0;  // the mode promises positive slots
    s.oob_rows = 0;
    s.mode = KDAJIT_INDICES_REPEATED_POSITIVE;
    DYNAMIC_SECTION("state " << to_string(st)) { check_problem(s); }
  }
}

TEST_CASE("out-of-range slots are counted in the diagnostics counter, on every route", "[gpu]") {
  for (Route route : routes_of(Op::single)) {
    DYNAMIC_SECTION("route " << to_string(route)) {
      ProblemSpec s = ref::default_spec(key_of(Op::single, 4, StateDtype::f32, ConvLayout::sd, 1), 5);
      s.rows = 9;
      s.null_rows = 2;
      s.oob_rows = 3;
      Problem p = make(s);
      Problem expected = p, got = p;
      REQUIRE(expected.run_reference().ok());
      DeviceProblem dev(got);
      int32_t* counter = nullptr;
      KDAJIT_CUDA_CHECK(cudaMalloc(&counter, sizeof(int32_t)));
      KDAJIT_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(int32_t), stream()));  // ordered before the launch
      dev.args().oob_counter = counter;
      REQUIRE(test::run_op(runtime_for(route), got.op(), dev.args(), stream()).ok());
      dev.download(got);
      int32_t count = -1;
      KDAJIT_CUDA_CHECK(cudaMemcpy(&count, counter, sizeof(int32_t), cudaMemcpyDeviceToHost));
      cudaFree(counter);
      CHECK(count == 3);
      auto rep = ref::compare(expected, got);
      INFO(rep.message);
      CHECK(rep.pass);
    }
  }
}

// The packed op counts every referenced position of state_indices[n, :] whose
// slot is >= S (docs/CONTRACT.md §4): conv slot, source slot and checkpoints.
TEST_CASE("packed: out-of-range slots are counted per referenced position", "[gpu]") {
  ProblemSpec s = ref::default_spec(key_of(Op::packed, 4, StateDtype::bf16, ConvLayout::ds, 3), 6);
  s.seq_lens = {3, 3, 2, 0, 3};
  s.num_accepted = {1, 2, 3, 1, 2};
  Problem p = make(s);
  // Plant out-of-range values where the op reads them and where it does not.
  auto* si = reinterpret_cast<int32_t*>(p.bytes(Tensor::state_indices).data());
  const int32_t S = static_cast<int32_t>(p.num_slots());
  si[0 * 3 + 0] = S;      // seq 0: conv slot (t = 0, also a-1 = 0): one position
  si[1 * 3 + 2] = S + 7;  // seq 1: checkpoint t = 2 < L = 3
  si[2 * 3 + 2] = S;      // seq 2: t = 2 >= L = 2 and != a-1 = 2? a = 3: a-1 = 2 is the source: counted
  si[3 * 3 + 0] = S;      // seq 3: empty: nothing counted
  p.snapshot();
  Problem expected = p, got = p;
  REQUIRE(expected.run_reference().ok());
  DeviceProblem dev(got);
  int32_t* counter = nullptr;
  KDAJIT_CUDA_CHECK(cudaMalloc(&counter, sizeof(int32_t)));
  KDAJIT_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(int32_t), stream()));  // ordered before the launch
  dev.args().oob_counter = counter;
  REQUIRE(test::run_op(runtime(), got.op(), dev.args(), stream()).ok());
  dev.download(got);
  int32_t count = -1;
  KDAJIT_CUDA_CHECK(cudaMemcpy(&count, counter, sizeof(int32_t), cudaMemcpyDeviceToHost));
  cudaFree(counter);
  CHECK(count == 3);
  auto rep = ref::compare(expected, got);
  INFO(rep.message);
  CHECK(rep.pass);
}

// Captured once, replayed with other slots, query_start_loc and accepted counts
// (the same shapes): metadata must be read on the device at replay time.
TEST_CASE("CUDA graph capture, then replay with changed metadata", "[gpu]") {
  for (auto op : {Op::single, Op::packed}) {
    const KernelKey key = key_of(op, 16, StateDtype::bf16, ConvLayout::sd, op == Op::single ? 1 : 4);
    ProblemSpec s = ref::default_spec(key, 4242);
    if (op == Op::single) s.rows = 20;
    Problem a = make(s);
    s.seed = 4343;  // new data, new slot permutation, new accepted counts, same shapes
    if (op == Op::packed) {
      std::rotate(s.seq_lens.begin(), s.seq_lens.begin() + 1, s.seq_lens.end());  // other qsl, same R
    }
    Problem b = make(s);
    REQUIRE(a.rows() == b.rows());

    DeviceProblem dev(a);
    // Warm: load the kernel outside the capture.
    REQUIRE(test::run_op(runtime(), a.op(), dev.args(), stream()).ok());
    KDAJIT_CUDA_CHECK(cudaStreamSynchronize(stream()));
    dev.upload(a);

    cudaGraph_t graph = nullptr;
    KDAJIT_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeGlobal));
    Outcome o = test::run_op(runtime(), a.op(), dev.args(), stream());
    KDAJIT_CUDA_CHECK(cudaStreamEndCapture(stream(), &graph));
    INFO(o.message);
    REQUIRE(o.ok());
    cudaGraphExec_t exec = nullptr;
    KDAJIT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

    for (Problem* p : {&a, &b}) {
      DYNAMIC_SECTION(to_string(op) << (p == &a ? " replay of the captured batch" : " replay with another batch")) {
        Problem expected = *p, got = *p;
        REQUIRE(expected.run_reference().ok());
        dev.upload(got);
        KDAJIT_CUDA_CHECK(cudaGraphLaunch(exec, stream()));
        dev.download(got);
        auto rep = ref::compare(expected, got);
        INFO(rep.summary());
        INFO(rep.message);
        CHECK(rep.pass);
      }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

TEST_CASE("a compile needed during capture fails fast and leaves the capture intact", "[gpu]") {
  // A runtime on an empty cache: nothing is cached, so nothing may be built.
  auto dir = std::filesystem::temp_directory_path() / fmt::format("kdajit-capture-{}", ::getpid());
  std::filesystem::remove_all(dir);
  std::unique_ptr<Runtime> rt;
  RuntimeOptions opts;
  opts.cache_dir = dir.string();
  REQUIRE(Runtime::create(opts, &rt).ok());
  ProblemSpec s = ref::default_spec(key_of(Op::single, 3, StateDtype::f32, ConvLayout::sd, 1, Gate::softplus), 9);
  Problem p = make(s);
  DeviceProblem dev(p);
  cudaGraph_t graph = nullptr;
  KDAJIT_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeGlobal));
  Outcome o = test::run_op(*rt, p.op(), dev.args(), stream());
  KDAJIT_CUDA_CHECK(cudaStreamEndCapture(stream(), &graph));
  cudaGraphDestroy(graph);
  CHECK(o.code == KDAJIT_ERROR_CAPTURE);
  CHECK(o.message.find("pre-warm") != std::string::npos);
  CHECK(o.message.find("kda_single.h3.") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("bitwise deterministic over 5 runs", "[gpu]") {
  for (auto op : {Op::single, Op::packed})
    for (auto st : {StateDtype::f32, StateDtype::bf16}) {
      DYNAMIC_SECTION(to_string(op) << " " << to_string(st)) {
        ProblemSpec s = ref::default_spec(key_of(op, 32, st, ConvLayout::ds, op == Op::single ? 1 : 3), 31);
        if (op == Op::single) s.rows = 40;
        Problem p = make(s);
        DeviceProblem dev(p);
        Problem first = p;
        for (int run = 0; run < 5; ++run) {
          Problem got = p;
          dev.upload(p);
          REQUIRE(test::run_op(runtime(), p.op(), dev.args(), stream()).ok());
          dev.download(got);
          if (run == 0) first = got;
          else CHECK(ref::bitwise_equal(first, got));
        }
      }
    }
}

// A thread's repeated call (the same args bytes) reuses its last validation and
// launch, but only for the runtime and context that made it: another runtime
// with the same args decides again (here: its forced route cannot run T = 10
// and says so), and the first runtime's next call is still right.
TEST_CASE("a repeated call reuses the launch of its own runtime only", "[gpu]") {
  ProblemSpec s = ref::default_spec(key_of(Op::packed, 4, StateDtype::f32, ConvLayout::sd, 10), 1010);
  Problem p = make(s);
  // Two calls of the same window in place: the reference applied twice.
  Problem expected = p, got = p;
  REQUIRE(expected.run_reference().ok());
  REQUIRE(expected.run_reference().ok());
  DeviceProblem dev(got);
  Runtime& rowcta = runtime_for(Route::rowcta);
  Runtime& stream_rt = runtime_for(Route::stream);
  REQUIRE(test::run_op(rowcta, got.op(), dev.args(), stream()).ok());
  REQUIRE(test::run_op(rowcta, got.op(), dev.args(), stream()).ok());  // the remembered launch
  for (int i = 0; i < 2; ++i) {  // enqueue nothing
    Outcome o = test::run_op(stream_rt, got.op(), dev.args(), stream());
    CHECK(o.code == KDAJIT_ERROR_UNSUPPORTED);
    CHECK(o.message.find("stream cannot run this call exactly") != std::string::npos);
  }
  dev.download(got);
  auto rep = ref::compare(expected, got);
  INFO(rep.message);
  CHECK(rep.pass);
}

TEST_CASE("sd and ds give bit-identical outputs and states", "[gpu]") {
  for (auto op : {Op::single, Op::packed})
    for (auto st : {StateDtype::f32, StateDtype::bf16}) {
      DYNAMIC_SECTION(to_string(op) << " " << to_string(st)) {
        std::vector<Problem> results;
        for (auto cv : {ConvLayout::sd, ConvLayout::ds}) {
          ProblemSpec s = ref::default_spec(key_of(op, 24, st, cv, op == Op::single ? 1 : 4), 555);
          if (op == Op::single) s.rows = 33;
          Problem p = make(s);
          DeviceProblem dev(p);
          REQUIRE(test::run_op(runtime(), p.op(), dev.args(), stream()).ok());
          dev.download(p);
          results.push_back(std::move(p));
        }
        // Values are drawn per logical index, so both problems hold the same numbers.
        CHECK(results[0].bytes(Tensor::output) == results[1].bytes(Tensor::output));
        CHECK(results[0].bytes(Tensor::state) == results[1].bytes(Tensor::state));
      }
    }
}

// Beyond the 65535 limit of grid y: single rows and the split routes' packed
// items loop, rowcta's packed items spill into grid z.
TEST_CASE("more than 65535 rows", "[gpu]") {
  for (Route route : routes_of(Op::single)) {
    if (route == Route::sequential) continue;  // one CTA per head walks all rows: no grid limit to cross
    DYNAMIC_SECTION("single, route " << to_string(route)) {
      ProblemSpec s = ref::default_spec(key_of(Op::single, 2, StateDtype::f32, ConvLayout::sd, 1), 65);
      s.rows = 70001;
      s.null_rows = 69980;  // keeps the state pool small; live rows are spread over the batch
      s.oob_rows = 5;
      s.row_pad = 0;
      check_problem(s, runtime_for(route));
    }
  }
  for (Route route : routes_of(Op::packed)) {
    DYNAMIC_SECTION("packed, route " << to_string(route)) {
      ProblemSpec s = ref::default_spec(key_of(Op::packed, 2, StateDtype::bf16, ConvLayout::ds, 2), 66);
      s.seq_lens = {2, 1, 0, 2};
      // Rows beyond qsl[N]: zeros. 140005 rows make 70003 items (ceil(R / T)):
      // rowcta's grid spills into z, the split clusters loop.
      s.extra_rows = 140000;
      s.row_pad = 0;
      check_problem(s, runtime_for(route));
    }
  }
}

TEST_CASE("a runtime pinned to a device through options.device", "[gpu]") {
  std::unique_ptr<Runtime> rt;
  RuntimeOptions opts;
  opts.device = 0;
  REQUIRE(Runtime::create(opts, &rt).ok());
  ProblemSpec s = ref::default_spec(key_of(Op::packed, 8, StateDtype::f32, ConvLayout::sd, 3), 808);
  Problem p = make(s);
  Problem expected = p, got = p;
  REQUIRE(expected.run_reference().ok());
  DeviceProblem dev(got);
  Outcome o = test::run_op(*rt, got.op(), dev.args(), stream());
  INFO(o.message);
  REQUIRE(o.ok());
  dev.download(got);
  auto rep = ref::compare(expected, got);
  INFO(rep.message);
  CHECK(rep.pass);
  // An ordinal that does not exist is an argument error.
  opts.device = 4096;
  std::unique_ptr<Runtime> bad;
  Outcome e = Runtime::create(opts, &bad);
  CHECK(e.code == KDAJIT_ERROR_INVALID_ARGUMENT);
  CHECK(e.message.find("options.device") != std::string::npos);
}

// Small cases for compute-sanitizer (memcheck, racecheck, synccheck): every
// route of each op, per state dtype. Run with the tag [sanitize].
TEST_CASE("sanitizer cases", "[sanitize]") {
  for (auto op : {Op::single, Op::packed})
    for (Route route : routes_of(op))
      for (auto st : {StateDtype::f32, StateDtype::bf16}) {
        DYNAMIC_SECTION(to_string(op) << " " << to_string(route) << " " << to_string(st)) {
          ProblemSpec s = ref::default_spec(key_of(op, 4, st, op == Op::single ? ConvLayout::sd : ConvLayout::ds,
                                                   op == Op::single ? 1 : 3),
                                            99);
          if (route == Route::sequential) {
            s.mode = KDAJIT_INDICES_REPEATED_POSITIVE;
            s.null_rows = s.oob_rows = 0;  // the mode promises positive slots
          }
          if (route == Route::stream) walk_several_items(s);
          check_problem(s, runtime_for(route));
        }
      }
}

// Route stream: every CTA walks several items (its grid is at most two CTAs per
// SM), with null, out-of-range, empty and dead items between live ones, so
// stages are passed on without a copy and reused after one.
TEST_CASE("stream: CTAs walk several items, with items that need no state among them", "[gpu]") {
  for (auto op : {Op::single, Op::packed})
    for (auto st : {StateDtype::f32, StateDtype::bf16})
      for (int heads : {3, 16}) {
        DYNAMIC_SECTION(to_string(op) << " " << to_string(st) << " H " << heads) {
          ProblemSpec s = ref::default_spec(key_of(op, heads, st, ConvLayout::sd, op == Op::single ? 1 : 4),
                                            555 + heads + static_cast<int>(st));
          walk_several_items(s);
          check_problem(s, runtime_for(Route::stream));
        }
      }
}

// Route stream copies each item's row inputs ahead with cp.async in the widest
// unit the row's address allows: row pads of 1, 2 and 4 elements put rows at
// every alignment validation accepts (2, 4, 8 and 16 bytes), and with H = 3 the
// last head's raw_beta sits at both halves of its 4-byte word.
TEST_CASE("stream: row tensors at every alignment", "[gpu]") {
  for (auto op : {Op::single, Op::packed})
    for (int pad : {1, 2, 4}) {
      DYNAMIC_SECTION(to_string(op) << " row_pad " << pad) {
        ProblemSpec s = ref::default_spec(key_of(op, 3, StateDtype::f32, ConvLayout::sd, op == Op::single ? 1 : 3),
                                          777 + pad);
        s.row_pad = pad;
        walk_several_items(s);
        check_problem(s, runtime_for(Route::stream));
      }
    }
}

// PDL: a call launched with programmatic stream serialization waits on the grid
// dependency before reading what the previous call wrote, so a chain of
// dependent calls (window 2 reads window 1's checkpoints and conv history; a
// single row reads the state the previous call wrote) still matches the reference.
TEST_CASE("PDL launches: chained dependent calls match the reference", "[gpu]") {
  RuntimeOptions opts;
  opts.pdl = true;
  opts.use_tuning = false;
  auto rt = make_runtime(opts);
  SECTION("packed, two windows") {
    ProblemSpec s = ref::default_spec(key_of(Op::packed, 8, StateDtype::bf16, ConvLayout::ds, 3), 4711);
    check_chained(s, *rt);
  }
  SECTION("packed, two windows, route split4") {
    RuntimeOptions ro = opts;
    ro.route = "split4";
    auto forced = make_runtime(ro);
    ProblemSpec s = ref::default_spec(key_of(Op::packed, 8, StateDtype::f32, ConvLayout::sd, 3), 4713);
    check_chained(s, *forced);
  }
  SECTION("single, the same slots twice in a row on one stream") {
    for (Route route : {Route::rowcta, Route::split2}) {
      RuntimeOptions ro = opts;
      ro.route = std::string(to_string(route));
      auto forced = make_runtime(ro);
      ProblemSpec s = ref::default_spec(key_of(Op::single, 8, StateDtype::f32, ConvLayout::sd, 1), 4712);
      s.rows = 6;
      Problem p = make(s);
      // The reference applied twice in place is the chain's expected result.
      Problem expected = p, got = p;
      REQUIRE(expected.run_reference().ok());
      REQUIRE(expected.run_reference().ok());
      DeviceProblem dev(got);
      for (int call = 0; call < 2; ++call) REQUIRE(test::run_op(*forced, got.op(), dev.args(), stream()).ok());
      dev.download(got);
      auto rep = ref::compare(expected, got);
      INFO(to_string(route) << ": " << rep.summary());
      INFO(rep.message);
      CHECK(rep.pass);
    }
  }
}

// Two CUDA contexts on one GPU in one process: the registry keeps loaded
// kernels per context, and each call launches in its stream's context.
TEST_CASE("two CUDA contexts on one GPU, calls interleaved", "[gpu]") {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  using CreateV4 = CUresult (*)(CUcontext*, void*, unsigned, CUdevice);  // CUDA >= 12.5 drivers
  using CreateV2 = CUresult (*)(CUcontext*, unsigned, CUdevice);
  using Push = CUresult (*)(CUcontext);
  using Pop = CUresult (*)(CUcontext*);
  using Destroy = CUresult (*)(CUcontext);
  auto create_v4 = reinterpret_cast<CreateV4>(dlsym(lib, "cuCtxCreate_v4"));
  auto create_v2 = reinterpret_cast<CreateV2>(dlsym(lib, "cuCtxCreate_v2"));
  auto push = reinterpret_cast<Push>(dlsym(lib, "cuCtxPushCurrent_v2"));
  auto pop = reinterpret_cast<Pop>(dlsym(lib, "cuCtxPopCurrent_v2"));
  auto destroy = reinterpret_cast<Destroy>(dlsym(lib, "cuCtxDestroy_v2"));
  REQUIRE(((create_v4 || create_v2) && push && pop && destroy));
  auto create = [&](CUcontext* ctx) { return create_v4 ? create_v4(ctx, nullptr, 0, 0) : create_v2(ctx, 0, 0); };

  KDAJIT_CUDA_CHECK(cudaSetDevice(0));
  KDAJIT_CUDA_CHECK(cudaFree(nullptr));  // the primary context is current: context A
  CUcontext b = nullptr;
  REQUIRE(create(&b) == CUDA_SUCCESS);  // context B, now current
  CUcontext popped = nullptr;
  REQUIRE(pop(&popped) == CUDA_SUCCESS);

  auto spec = [](Op op, uint64_t seed) {
    ProblemSpec s = ref::default_spec(key_of(op, 6, StateDtype::bf16, ConvLayout::sd, op == Op::single ? 1 : 2), seed);
    if (op == Op::single) s.rows = 7;
    return s;
  };
  struct Side {
    Problem expected, got;
  };
  std::vector<Side> a, bside;
  for (int i = 0; i < 2; ++i) {
    Problem pa = make(spec(i ? Op::packed : Op::single, 900 + i)), pb = make(spec(i ? Op::single : Op::packed, 950 + i));
    a.push_back({pa, pa});
    bside.push_back({pb, pb});
  }
  cudaStream_t sa = nullptr, sb = nullptr;
  KDAJIT_CUDA_CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  REQUIRE(push(b) == CUDA_SUCCESS);
  KDAJIT_CUDA_CHECK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));  // in context B
  REQUIRE(pop(&popped) == CUDA_SUCCESS);
  {
    std::vector<std::unique_ptr<DeviceProblem>> da, db;
    for (int i = 0; i < 2; ++i) {
      da.push_back(std::make_unique<DeviceProblem>(a[i].got));
      REQUIRE(push(b) == CUDA_SUCCESS);
      db.push_back(std::make_unique<DeviceProblem>(bside[i].got));  // allocated in context B
      REQUIRE(pop(&popped) == CUDA_SUCCESS);
    }
    // A, B, A, B: each launch goes to its stream's context, with no context switch by the caller.
    for (int i = 0; i < 2; ++i) {
      Outcome oa = test::run_op(runtime(), a[i].got.op(), da[i]->args(), sa);
      INFO(oa.message);
      REQUIRE(oa.ok());
      Outcome ob = test::run_op(runtime(), bside[i].got.op(), db[i]->args(), sb);
      INFO(ob.message);
      REQUIRE(ob.ok());
    }
    for (int i = 0; i < 2; ++i) {
      da[i]->download(a[i].got);
      REQUIRE(push(b) == CUDA_SUCCESS);
      db[i]->download(bside[i].got);
      REQUIRE(pop(&popped) == CUDA_SUCCESS);
    }
    REQUIRE(push(b) == CUDA_SUCCESS);
    db.clear();  // freed in context B
    KDAJIT_CUDA_CHECK(cudaStreamDestroy(sb));
    REQUIRE(pop(&popped) == CUDA_SUCCESS);
  }
  KDAJIT_CUDA_CHECK(cudaStreamDestroy(sa));
  for (auto* side : {&a, &bside})
    for (auto& [expected, got] : *side) {
      REQUIRE(expected.run_reference().ok());
      auto rep = ref::compare(expected, got);
      INFO(rep.summary());
      INFO(rep.message);
      CHECK(rep.pass);
    }
  // Context B's modules stay loaded until B dies (the registry never unloads).
  CHECK(destroy(b) == CUDA_SUCCESS);
}
