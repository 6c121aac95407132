// The compile-time levers keep the kernels' code: keys of every route and op
// compile with the canonical options and with the front-end-only options taken
// out, and the cubins' code sections (.text.<kernel>) are byte-identical.
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <string_view>

#include "catch.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/runtime/jit/compile.hpp"
#include "kdajit/templates.hpp"

using namespace kdajit;

namespace {

template <typename T>
T read_at(std::string_view elf, size_t off) {
  T v{};
  REQUIRE(off + sizeof(T) <= elf.size());
  std::memcpy(&v, elf.data() + off, sizeof(T));
  return v;
}

// The contents of every section whose name starts with ".text" (the SASS),
// by name, from an ELF64 little-endian cubin.
std::map<std::string, std::string> code_sections(std::string_view elf) {
  REQUIRE(elf.size() > 64);
  REQUIRE(elf.substr(0, 4) == std::string_view("\x7f" "ELF", 4));
  REQUIRE(elf[4] == 2);  // ELFCLASS64
  const auto shoff = read_at<uint64_t>(elf, 0x28);
  const auto shentsize = read_at<uint16_t>(elf, 0x3A);
  const auto shnum = read_at<uint16_t>(elf, 0x3C);
  const auto shstrndx = read_at<uint16_t>(elf, 0x3E);
  auto header = [&](size_t i) { return shoff + i * shentsize; };
  const auto names_off = read_at<uint64_t>(elf, header(shstrndx) + 0x18);
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < shnum; ++i) {
    const auto name_at = read_at<uint32_t>(elf, header(i));
    const auto type = read_at<uint32_t>(elf, header(i) + 0x04);
    const auto off = read_at<uint64_t>(elf, header(i) + 0x18);
    const auto size = read_at<uint64_t>(elf, header(i) + 0x20);
    const size_t name_start = names_off + name_at;
    REQUIRE(name_start < elf.size());
    const std::string name(elf.data() + name_start, strnlen(elf.data() + name_start, elf.size() - name_start));
    if (name.rfind(".text", 0) != 0) continue;
    REQUIRE(type != 8);  // SHT_NOBITS: code always has bytes
    REQUIRE(off + size <= elf.size());
    out[name] = std::string(elf.substr(off, size));
  }
  return out;
}

}  // namespace

TEST_CASE("the front-end-only options leave every route's SASS identical", "[compile][sass]") {
  const auto frontend_only = frontend_only_options();
  REQUIRE_FALSE(frontend_only.empty());
  std::vector<KernelKey> keys;
  for (const RouteSpec& r : route_table())
    for (Op op : all_values<Op>()) {
      // The prefill op's routes once its kernel template is in the build.
      if (!r.serves(op) || template_text(r.template_file(op)).empty()) continue;
      // The chunk op is the prefill template with KDA_CHUNK: one route of it.
      if (op == Op::chunk && r.route != Route::rowcta) continue;
      const int t = op == Op::single ? 1 : chunked(op) ? route_chunk(r.route) : 3;
      keys.push_back({op, op == Op::single ? 64 : 8, op == Op::single ? StateDtype::f32 : StateDtype::bf16,
                      op == Op::single || op == Op::chunk ? ConvLayout::sd : ConvLayout::ds, t, Gate::bounded, r.route,
                      Arch::sm_90});
    }
  keys.push_back({Op::packed, 64, StateDtype::f32, ConvLayout::sd, 4, Gate::softplus, Route::stream, Arch::sm_100a});

  for (const KernelKey& key : keys) {
    INFO(key_name(key));
    auto canonical = make_build_inputs(key);
    if (!canonical) FAIL(canonical.error().message);
    BuildInputs without = *canonical;
    for (const auto& o : frontend_only) {
      auto it = std::find(without.options.begin(), without.options.end(), o);
      REQUIRE(it != without.options.end());  // still canonical: the test covers it
      without.options.erase(it);
    }
    auto a = compile(*canonical);
    auto b = compile(without);
    if (!a) FAIL(a.error().message << "\n" << a.error().detail);
    if (!b) FAIL(b.error().message << "\n" << b.error().detail);
    const auto code_a = code_sections(a->cubin), code_b = code_sections(b->cubin);
    // One kernel per program; route twopass adds its intra-chunk kernel and,
    // for the prefill op, its norm kernel.
    const bool pre = route_spec(key.route).pre_grid != nullptr;
    const bool post = route_spec(key.route).post_grid != nullptr && !post_entry_name(key.op).empty();
    REQUIRE(code_a.size() == 1u + (pre ? 1u : 0u) + (post ? 1u : 0u));
    CHECK(code_a.count(std::string(".text.") + std::string(entry_name(key.op))) == 1);
    if (pre) CHECK(code_a.count(std::string(".text.") + std::string(pre_entry_name(key.op))) == 1);
    if (post) CHECK(code_a.count(std::string(".text.") + std::string(post_entry_name(key.op))) == 1);
    for (const auto& [name, code] : code_a) CHECK(code.size() > 1000);
    CHECK(code_a == code_b);
    CHECK(a->resources.registers == b->resources.registers);
  }
}

TEST_CASE("NVRTC's phase table is read into the compile's phases", "[compile]") {
  CompilePhases p;
  parse_phase_times(
      "kernel.cu, CUDA C++ Frontend, 48, ms\n"
      "kernel.cu, NVVM Optimizer, 321, ms\n"
      "kernel.cu, PTX Translation, 328, ms\n"
      "garbage line\n",
      p);
  CHECK(p.frontend_ms == 48);
  CHECK(p.nvvm_ms == 321);
  CHECK(p.ptxas_ms == 328);
  CompilePhases none;
  parse_phase_times("", none);
  CHECK(none.frontend_ms == -1);

  // A real compile reports every phase, its CPU time and its source size.
  const KernelKey key{Op::single, 8, StateDtype::f32, ConvLayout::sd, 1, Gate::bounded, Route::rowcta, Arch::sm_90};
  auto in = make_build_inputs(key);
  if (!in) FAIL(in.error().message);
  auto r = compile(*in);
  if (!r) FAIL(r.error().message);
  CHECK(r->phases.frontend_ms >= 0);
  CHECK(r->phases.nvvm_ms > 0);
  CHECK(r->phases.ptxas_ms > 0);
  CHECK(r->phases.cpu_ms > 0);
  CHECK(r->phases.source_bytes == in->source.size());
}
