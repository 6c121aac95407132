// Key -> source: deterministic, self-contained, naming its key.
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "catch.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/source_generator.hpp"

using namespace kdajit;

namespace {

std::string run(const std::string& cmd) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  REQUIRE(pipe);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe.get())) > 0) out.append(buf, n);
  return out;
}

}  // namespace

TEST_CASE("generated source starts with its key name and holds the holes", "[generator]") {
  for (const KernelKey& k : {KernelKey{Op::single, 5, StateDtype::bf16, ConvLayout::ds, 1, Gate::softplus, Route::rowcta, Arch::sm_90a},
                             KernelKey{Op::packed, 96, StateDtype::f32, ConvLayout::sd, 7, Gate::bounded, Route::rowcta, Arch::sm_100a}}) {
    auto src = generate_source(k);
    REQUIRE(src.ok());
    const std::string first_line = src->substr(0, src->find('\n'));
    CHECK(first_line == "// kdajit kernel " + program_name(k));
    // H is a hole only of an op compiled per head count; else it is read at run time.
    CHECK((src->find("#define KDA_HEADS " + std::to_string(k.heads) + "\n") != std::string::npos) ==
          heads_in_program(k.op, k.route));
    CHECK(src->find("#define KDA_T " + std::to_string(k.tokens) + "\n") != std::string::npos);
    CHECK(src->find("#define KDA_STATE_BF16 " + std::string(k.state == StateDtype::bf16 ? "1" : "0")) != std::string::npos);
    CHECK(src->find("#define KDA_CONV_DS " + std::string(k.conv == ConvLayout::ds ? "1" : "0")) != std::string::npos);
    CHECK(src->find("#define KDA_GATE_SOFTPLUS " + std::string(k.gate == Gate::softplus ? "1" : "0")) != std::string::npos);
    CHECK(src->find(std::string("__global__")) != std::string::npos);
    CHECK(src->find(std::string(entry_name(k.op))) != std::string::npos);
    // Self-contained: the local includes are inlined and no toolkit header is named
    // (kda_params.h includes <stdint.h> only for host compilers, outside __CUDACC_RTC__).
    CHECK(src->find("#include \"") == std::string::npos);
    CHECK(src->find("#include <cuda") == std::string::npos);
  }
}

TEST_CASE("generation is deterministic within a process", "[generator]") {
  const KernelKey k{Op::packed, 16, StateDtype::bf16, ConvLayout::ds, 4, Gate::bounded, Route::rowcta, Arch::sm_90};
  auto a = generate_source(k), b = generate_source(k);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(*a == *b);
  KernelKey other = k;
  other.tokens = 3;
  CHECK(*generate_source(other) != *a);
}

TEST_CASE("generation is deterministic across two processes", "[generator]") {
  const std::string key = "kda_packed.h24.state_f32.conv_sd.t3.gate_softplus.route_rowcta.sm_90";
  const std::string cmd = std::string(KDAJIT_CLI_PATH) + " show " + key;
  const std::string first = run(cmd), second = run(cmd);
  REQUIRE(first.size() > 1000);
  CHECK(first == second);
  auto in_process = generate_source(*parse_key(key));
  REQUIRE(in_process.ok());
  CHECK(first == *in_process);
}

TEST_CASE("an invalid key generates nothing", "[generator]") {
  KernelKey k{Op::single, 0, StateDtype::f32, ConvLayout::sd, 1, Gate::bounded, Route::rowcta, Arch::sm_90};
  auto src = generate_source(k);
  REQUIRE_FALSE(src.ok());
  CHECK(src.error().message.find("heads") != std::string::npos);
  k.heads = 8;
  k.tokens = 2;  // single with T = 2
  src = generate_source(k);
  REQUIRE_FALSE(src.ok());
  CHECK(src.error().message.find("'t'") != std::string::npos);
}

TEST_CASE("keys of different head counts are one source, every op and route; chunked keys of different state dtypes and conv layouts too",
          "[generator][program]") {
  const KernelKey prefill{Op::prefill, 8, StateDtype::bf16, ConvLayout::ds, kPrefillChunk, Gate::bounded, Route::split2, Arch::sm_90};
  for (Op op : {Op::prefill, Op::chunk}) {
    INFO(to_string(op));
    KernelKey key = prefill;
    key.op = op;
    if (op == Op::chunk) key.conv = ConvLayout::sd;  // the chunk op's keys carry sd only
    auto a = generate_source(key);
    REQUIRE(a.ok());
    for (int variant = 0; variant < (op == Op::chunk ? 2 : 3); ++variant) {
      KernelKey other = key;
      if (variant == 0) other.heads = 64;
      if (variant == 1) other.state = StateDtype::f32;
      if (variant == 2) other.conv = ConvLayout::sd;
      auto b = generate_source(other);
      REQUIRE(b.ok());
      CHECK(*a == *b);
      CHECK(program_name(key) == program_name(other));
    }
    CHECK(a->substr(0, a->find('\n')) == fmt::format("// kdajit kernel kda_{}.h*.state_*.conv_*.t64.gate_bounded.route_split2.sm_90", to_string(op)));
    // None of the three is a hole of this program: the generator defines no
    // KDA_HEADS, KDA_STATE_BF16 or KDA_CONV_DS (the guards in
    // kda_primitives.cuh stop a compile that has one).
    const std::string holes = a->substr(0, a->find("// ---- "));
    CHECK(holes.find("KDA_HEADS") == std::string::npos);
    CHECK(holes.find("KDA_STATE_BF16") == std::string::npos);
    CHECK(holes.find("KDA_CONV_DS") == std::string::npos);
    CHECK(a->find("#define KDA_HEADS_FROM_GRID 1\n") != std::string::npos);
    CHECK(a->find("#define KDA_STORAGE_FROM_PARAMS 1\n") != std::string::npos);
  }
  auto a = generate_source(prefill);
  REQUIRE(a.ok());
  // Another field still makes another program.
  KernelKey split4 = prefill;
  split4.route = Route::split4;
  CHECK(*generate_source(split4) != *a);

  // The decode routes read H at run time where kOpRoutesWithHeadsInProgram
  // says so: from the launch grid (x = head), route stream from the parameter
  // block (its persistent grid is not per head). The others are compiled per H.
  for (Op op : kDecodeOps) {
    for (const RouteSpec& r : route_table()) {
      if (!r.serves(op)) continue;
      INFO(to_string(op) << " " << r.name());
      const KernelKey decode{op, 8, StateDtype::bf16, ConvLayout::sd, op == Op::single ? 1 : 4, Gate::bounded, r.route,
                             Arch::sm_90};
      KernelKey wider = decode;
      wider.heads = 64;
      auto d8 = generate_source(decode), d64 = generate_source(wider);
      REQUIRE(d8.ok());
      REQUIRE(d64.ok());
      const std::string head = d8->substr(0, d8->find("// ---- "));
      if (heads_in_program(op, r.route)) {
        CHECK(program_name(decode) != program_name(wider));
        CHECK(program_name(decode).find(".h8.") != std::string::npos);
        CHECK(*d8 != *d64);
        CHECK(head.find("#define KDA_HEADS 8\n") != std::string::npos);
      } else {
        CHECK(program_name(decode) == program_name(wider));
        CHECK(program_name(decode).find(".h*.") != std::string::npos);
        CHECK(*d8 == *d64);
        CHECK(head.find("KDA_HEADS") == std::string::npos);
      }
      CHECK((d8->find("#define KDA_HEADS_FROM_PARAMS 1\n") != std::string::npos) == (r.route == Route::stream));
      CHECK(d8->find("#define KDA_HEADS_FROM_GRID") == std::string::npos);
    }
    // The state dtype and conv layout are holes of a decode program.
    CHECK(storage_in_program(op));
    const KernelKey bf16{op, 8, StateDtype::bf16, ConvLayout::ds, op == Op::single ? 1 : 4, Gate::bounded, Route::rowcta,
                         Arch::sm_90};
    KernelKey f32 = bf16;
    f32.state = StateDtype::f32;
    auto b16 = generate_source(bf16);
    REQUIRE(b16.ok());
    CHECK(*generate_source(f32) != *b16);
    CHECK(b16->find("#define KDA_STATE_BF16 1\n#define KDA_CONV_DS 1\n") != std::string::npos);
  }
  for (Route r : all_values<Route>()) {
    CHECK_FALSE(heads_in_program(Op::prefill, r));
    CHECK_FALSE(heads_in_program(Op::chunk, r));
  }
  CHECK_FALSE(storage_in_program(Op::prefill));
}
