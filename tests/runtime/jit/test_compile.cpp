// NVRTC on a machine without a GPU: a covering set of keys compiles for sm_90
// and sm_100a with no spills and no stack, and a broken source gives an error
// value that names the key and carries the log and the failing line.
#include <set>
#include <thread>

#include <fmt/format.h>

#include "catch.hpp"
#include "kdajit/parallel.hpp"
#include "kdajit/presets.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/runtime/jit/compile.hpp"
#include "kdajit/source_generator.hpp"
#include "kdajit/templates.hpp"

using namespace kdajit;

namespace {

// The prefill op's keys compile once its kernel template is in the build.
bool prefill_template_embedded() { return !template_text(route_spec(Route::rowcta).template_file(Op::prefill)).empty(); }

// Every value of every key field at least once, and every (H, op) pair of the
// `full` preset; dtype, layout, gate, T and route vary across the list; every
// route with both state dtypes at 64 heads.
std::vector<KernelKey> covering_set(Arch arch) {
  std::vector<KernelKey> keys;
  const std::vector<std::string_view> single_routes = route_names(Op::single);
  static constexpr int kPackedT[] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 16};
  int i = 0, p = 0;
  for (int h : {1, 8, 12, 16, 24, 32, 48, 64, 96, 128}) {
    for (Op op : {Op::single, Op::packed}) {
      KernelKey k;
      k.op = op;
      k.heads = h;
      k.state = i % 2 ? StateDtype::bf16 : StateDtype::f32;
      k.conv = (i / 2) % 2 ? ConvLayout::ds : ConvLayout::sd;
      k.gate = (i / 4) % 2 ? Gate::softplus : Gate::bounded;
      k.tokens = op == Op::single ? 1 : kPackedT[p++];
      k.route = op == Op::single ? *parse_field<Route>(single_routes[(i / 2) % single_routes.size()]) : Route::rowcta;
      k.arch = arch;
      keys.push_back(k);
      ++i;
    }
  }
  // Odd head counts and the T extremes.
  keys.push_back({Op::packed, 5, StateDtype::bf16, ConvLayout::ds, 7, Gate::softplus, Route::rowcta, arch});
  keys.push_back({Op::single, 40, StateDtype::f32, ConvLayout::ds, 1, Gate::softplus, Route::rowcta, arch});
  // Packed f32 split2 spilled at two CTAs per SM (T = 1 conv ds, T = 6..8);
  // the route table gives it one (split2_occupancy).
  keys.push_back({Op::packed, 1, StateDtype::f32, ConvLayout::ds, 1, Gate::bounded, Route::split2, arch});
  keys.push_back({Op::packed, 1, StateDtype::f32, ConvLayout::sd, 6, Gate::bounded, Route::split2, arch});
  keys.push_back({Op::packed, 12, StateDtype::f32, ConvLayout::ds, 8, Gate::softplus, Route::split2, arch});
  for (const RouteSpec& r : route_table())
    for (Op op : kDecodeOps)
      for (StateDtype st : all_values<StateDtype>())
        if (r.serves(op)) keys.push_back({op, 64, st, ConvLayout::sd, op == Op::single ? 1 : 4, Gate::bounded, r.route, arch});
  if (prefill_template_embedded()) {
    // Prefill: every H of the full preset, every route with both state dtypes.
    int j = 0;
    for (int h : {1, 8, 12, 16, 24, 32, 48, 64, 96, 128}) {
      ++j;
      const Route route =
          *parse_field<Route>(route_names(Op::prefill)[static_cast<size_t>(j) % route_names(Op::prefill).size()]);
      keys.push_back({Op::prefill, h, j % 2 ? StateDtype::bf16 : StateDtype::f32, (j / 2) % 2 ? ConvLayout::ds : ConvLayout::sd,
                      route_chunk(route), (j / 4) % 2 ? Gate::softplus : Gate::bounded, route, arch});
    }
    for (const RouteSpec& r : route_table())
      for (StateDtype st : all_values<StateDtype>())
        if (r.serves(Op::prefill))
          keys.push_back({Op::prefill, 64, st, ConvLayout::sd, route_chunk(r.route), Gate::bounded, r.route, arch});
    // The chunk op (the same template with KDA_CHUNK): both dtypes and gates, a split and rowcta.
    keys.push_back({Op::chunk, 16, StateDtype::f32, ConvLayout::sd, kPrefillChunk, Gate::bounded, Route::rowcta, arch});
    keys.push_back({Op::chunk, 32, StateDtype::bf16, ConvLayout::sd, kPrefillChunk, Gate::softplus, Route::split4, arch});
  }
  return keys;
}

// `in` with `code` inserted just before the kernel's entry point, compiled:
// how the tests below break a generated source on purpose.
auto compile_with_code_before_kernel(BuildInputs in, const std::string& code) {
  const size_t at = in.source.find("extern \"C\" __global__");
  REQUIRE(at != std::string::npos);
  in.source.insert(at, code);
  return compile(in);
}

}  // namespace

TEST_CASE("the covering set covers every field value and every (H, op) of the full preset", "[compile]") {
  auto keys = covering_set(Arch::sm_90);
  std::set<int> heads, tokens;
  std::set<std::pair<int, Op>> h_op;
  std::set<StateDtype> dtypes;
  std::set<ConvLayout> layouts;
  std::set<Gate> gates;
  std::set<Route> routes;
  for (const auto& k : keys) {
    routes.insert(k.route);
    heads.insert(k.heads);
    if (k.op == Op::packed) tokens.insert(k.tokens);
    h_op.insert({k.heads, k.op});
    dtypes.insert(k.state);
    layouts.insert(k.conv);
    gates.insert(k.gate);
  }
  auto full = preset_keys("full", Arch::sm_90);
  REQUIRE(full.ok());
  const bool prefill = prefill_template_embedded();
  if (!prefill) WARN("templates/kda_prefill.cu is not embedded: the covering set has no prefill keys");
  for (const auto& k : *full)
    if (prefill || k.op != Op::prefill) CHECK(h_op.count({k.heads, k.op}) == 1);
  CHECK(dtypes.size() == 2);
  CHECK(layouts.size() == 2);
  CHECK(gates.size() == 2);
  size_t compilable_routes = 0;
  for (const RouteSpec& r : route_table())
    if (r.serves(Op::single) || r.serves(Op::packed) || (prefill && r.serves(Op::prefill))) ++compilable_routes;
  CHECK(routes.size() == compilable_routes);
  CHECK(tokens.size() >= 10);
  CHECK(tokens.count(1) == 1);
  CHECK(tokens.count(16) == 1);
}

TEST_CASE("a covering set compiles for sm_90 and sm_100a with zero spills", "[compile]") {
  std::vector<KernelKey> keys = covering_set(Arch::sm_90);
  for (const auto& k : covering_set(Arch::sm_100a)) keys.push_back(k);
  // The remaining archs once each.
  for (Arch a : {Arch::sm_90a, Arch::sm_103a, Arch::sm_120a})
    keys.push_back({Op::packed, 64, StateDtype::bf16, ConvLayout::sd, 4, Gate::bounded, Route::rowcta, a});

  struct Row {
    Result<CompiledKernel> result = Error();
  };
  std::vector<Row> rows(keys.size());
  parallel_for(keys.size(), std::max(2u, std::thread::hardware_concurrency()), [&](size_t i) {
    auto in = make_build_inputs(keys[i]);
    rows[i].result = in ? compile(*in) : Result<CompiledKernel>(in.error());
  });

  for (size_t i = 0; i < keys.size(); ++i) {
    INFO(key_name(keys[i]));
    const auto& r = rows[i].result;
    if (!r) FAIL(r.error().message << "\n" << r.error().detail);
    CHECK(r->cubin.size() > 1000);
    CHECK(r->resources.registers > 0);  // the ptxas report was read (so spills are known)
    const RouteSpec& route = route_spec(keys[i].route);
    CHECK(r->resources.registers <= 65536 / (route.ctas_per_sm(keys[i]) * route.threads(keys[i])));  // the route's CTAs per SM
    CHECK(r->resources.spill_bytes == 0);
    CHECK(r->resources.stack_bytes == 0);
  }
}

TEST_CASE("a broken source gives an error value with the key, the options, the log and the line", "[compile]") {
  const KernelKey key{Op::single, 8, StateDtype::f32, ConvLayout::sd, 1, Gate::bounded, Route::rowcta, Arch::sm_90};
  auto in = make_build_inputs(key);
  REQUIRE(in.ok());
  // Break the template body: an undeclared identifier inside the kernel.
  auto r = compile_with_code_before_kernel(*in, "static_assert(kdajit_broken_template_marker, \"boom\");\n");
  REQUIRE_FALSE(r.ok());
  const Error& e = r.error();
  CHECK(e.code == ErrorCode::compile_failed);
  CHECK(e.message.find(key_name(key)) != std::string::npos);
  CHECK(e.detail.find("--gpu-architecture=sm_90") != std::string::npos);
  CHECK(e.detail.find("kdajit_broken_template_marker") != std::string::npos);  // log and source line
  CHECK(e.detail.find("NVRTC log:") != std::string::npos);
  CHECK(e.detail.find("kernel.cu:") != std::string::npos);  // the failing source line, numbered
}

// The prefill template serves every head count, state dtype and conv layout: a
// use of the compile-time head count in it, or a KDA_HEADS, KDA_STATE_BF16 or
// KDA_CONV_DS define for it, stops the compile with a message that says why
// (kda_primitives.cuh). Both fail in the front end, so they are quick.
TEST_CASE("a head-count constant in the prefill program is a compile error", "[compile][program]") {
  const KernelKey key{Op::prefill, 16, StateDtype::f32, ConvLayout::sd, kPrefillChunk, Gate::bounded, Route::rowcta,
                      Arch::sm_90};
  auto in = make_build_inputs(key);
  REQUIRE(in.ok());
  const BuildInputs clean = *in;
  for (const char* use : {"kHeads", "kHidden", "kQkv"}) {
    INFO(use);
    auto r = compile_with_code_before_kernel(
        clean, fmt::format("__device__ int kdajit_uses_heads(int j) {{ return j * kda::{}; }}\n", use));
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == ErrorCode::compile_failed);
    CHECK(r.error().detail.find("head_count_is_gridDim_x_in_this_program") != std::string::npos);
  }
  const size_t holes = clean.source.find("#define KDA_T ");
  REQUIRE(holes != std::string::npos);
  BuildInputs defined = clean;
  defined.source.insert(holes, "#define KDA_HEADS 16\n");
  auto r = compile(defined);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().detail.find("KDA_HEADS is defined for a template that reads the head count from the launch grid") !=
        std::string::npos);
  // Likewise the state dtype and conv layout, which it reads from KdaParams.
  for (const char* hole : {"#define KDA_STATE_BF16 1\n", "#define KDA_CONV_DS 0\n"}) {
    INFO(hole);
    BuildInputs storage = clean;
    storage.source.insert(holes, hole);
    auto s = compile(storage);
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().detail.find("KDA_STATE_BF16 or KDA_CONV_DS is defined for a template that reads them from "
                                "KdaParams") != std::string::npos);
  }
}

// The decode programs that serve every head count (heads_in_program() false:
// the packed op's grid routes read H from the launch grid): a use of the
// compile-time head count in one stops the compile with a message that names
// head_count(p).
TEST_CASE("a head-count constant in a decode program is a compile error", "[compile][program]") {
  for (const KernelKey& key :
       {KernelKey{Op::packed, 16, StateDtype::f32, ConvLayout::sd, 2, Gate::bounded, Route::rowcta, Arch::sm_90},
        KernelKey{Op::packed, 16, StateDtype::bf16, ConvLayout::ds, 4, Gate::bounded, Route::split4, Arch::sm_90}}) {
    INFO(key_name(key));
    REQUIRE_FALSE(heads_in_program(key.op, key.route));
    auto in = make_build_inputs(key);
    REQUIRE(in.ok());
    auto r = compile_with_code_before_kernel(*in, "__device__ int kdajit_uses_heads(int j) { return j * kda::kHidden; }\n");
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == ErrorCode::compile_failed);
    CHECK(r.error().detail.find("head_count_is_head_count_p_in_this_program") != std::string::npos);
  }
}

TEST_CASE("routes twopass's and rowcta's chunked programs on Hopper compile for sm_90a with step 5 on wgmma, no other",
          "[compile]") {
  auto key = [](Op op, Route route, Arch arch) {
    return KernelKey{op, 16, StateDtype::f32, ConvLayout::sd, kPrefillChunk, Gate::bounded, route, arch};
  };
  auto arch_option = [](const KernelKey& k) { return canonical_options(k).front(); };
  for (Op op : {Op::prefill, Op::chunk}) {
    CHECK(arch_option(key(op, Route::twopass, Arch::sm_90)) == "--gpu-architecture=sm_90a");
    CHECK(arch_option(key(op, Route::twopass, Arch::sm_90a)) == "--gpu-architecture=sm_90a");
    CHECK(arch_option(key(op, Route::twopass, Arch::sm_100a)) == "--gpu-architecture=sm_100a");
    CHECK(arch_option(key(op, Route::rowcta, Arch::sm_90)) == "--gpu-architecture=sm_90a");
    CHECK(arch_option(key(op, Route::rowcta, Arch::sm_100a)) == "--gpu-architecture=sm_100a");
    CHECK(arch_option(key(op, Route::split2, Arch::sm_90)) == "--gpu-architecture=sm_90");
    for (Arch arch : {Arch::sm_90, Arch::sm_90a, Arch::sm_100a})
      for (Route route : {Route::twopass, Route::rowcta}) {
        const KernelKey k = key(op, route, arch);
        auto src = generate_source(k);
        REQUIRE(src.ok());
        INFO(key_name(k));
        CHECK((src->find("#define KDA_WGMMA 1") != std::string::npos) ==
              (arch != Arch::sm_100a));
      }
  }
  CHECK(arch_option(KernelKey{Op::single, 8, StateDtype::f32, ConvLayout::sd, 1, Gate::bounded, Route::rowcta,
                              Arch::sm_90}) == "--gpu-architecture=sm_90");
}

TEST_CASE("the ptxas report parser reads registers, spills, stack and smem", "[compile]") {
  const std::string log =
      "ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
      "ptxas info    : Used 96 registers, used 1 barriers, 1600 bytes smem, 400 bytes cmem[0]\n"
      "ptxas         .     8 bytes stack frame, 12 bytes spill stores, 4 bytes spill loads\n";
  auto r = parse_ptxas_log(log);
  CHECK(r.registers == 96);
  CHECK(r.smem_bytes == 1600);
  CHECK(r.stack_bytes == 8);
  CHECK(r.spill_bytes == 16);
  CHECK(parse_ptxas_log("").registers == -1);
  // Two kernels (route twopass): the larger figures, the spills of both.
  const std::string two = log +
                          "ptxas info    : Compiling entry function 'k_pre' for 'sm_90'\n"
                          "ptxas info    : Used 128 registers, used 1 barriers, 0 bytes smem, 400 bytes cmem[0]\n"
                          "ptxas         .     0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n";
  r = parse_ptxas_log(two);
  CHECK(r.registers == 128);
  CHECK(r.smem_bytes == 1600);
  CHECK(r.stack_bytes == 8);
  CHECK(r.spill_bytes == 32);
}
