#include "compile_kernels.hpp"

#include <fmt/format.h>

#include <sstream>
#include <vector>

#include "device_data.hpp"
#include "floor_kernel.hpp"
#include "mma_rate.hpp"

namespace kdajit::bench {

namespace {

// One line per kernel from ptxas -v: "NAME: N registers, N bytes stack, N bytes spilled".
struct PtxasKernel {
  std::string name;
  int registers = -1, stack = 0, spill_stores = 0, spill_loads = 0;
};

// The number right before `what` in `line` (0 if none).
int number_before(const std::string& line, const char* what) {
  const size_t at = line.find(what);
  if (at == std::string::npos) return 0;
  size_t b = at;
  while (b > 0 && line[b - 1] >= '0' && line[b - 1] <= '9') --b;
  return b < at ? std::stoi(line.substr(b, at - b)) : 0;
}

std::vector<PtxasKernel> parse_resources(const std::string& log) {
  std::vector<PtxasKernel> out;
  std::stringstream ss(log);
  for (std::string line; std::getline(ss, line);) {
    if (const size_t at = line.find("Compiling entry function '"); at != std::string::npos) {
      const size_t from = at + 26, to = line.find('\'', from);
      out.push_back({line.substr(from, to == std::string::npos ? std::string::npos : to - from)});
    } else if (!out.empty()) {
      if (line.find(" bytes stack frame") != std::string::npos) {
        out.back().stack = number_before(line, " bytes stack frame");
        out.back().spill_stores = number_before(line, " bytes spill stores");
        out.back().spill_loads = number_before(line, " bytes spill loads");
      }
      if (line.find("Used ") != std::string::npos) out.back().registers = number_before(line, " registers");
    }
  }
  return out;
}

std::string describe(const PtxasKernel& k) {
  return fmt::format("{}: {} registers, {} bytes stack, {} + {} bytes spilled", k.name, k.registers, k.stack,
                     k.spill_stores, k.spill_loads);
}

bool spills(const PtxasKernel& k) { return k.stack + k.spill_stores + k.spill_loads > 0; }

std::vector<std::string> resource_lines(const std::string& log) {
  std::vector<std::string> out;
  for (const auto& k : parse_resources(log)) out.push_back(describe(k));
  return out;
}

// One of the bench's programs for `arch`, with ptxas -v for the resource lines.
// A failure's message carries its detail (options, NVRTC log): the bench prints messages only.
Result<CompiledKernel> compile_for(const std::string& name, const std::string& source, const std::string& arch) {
  auto built = compile_program(fmt::format("compile {} for {}", name, arch), name, source,
                               {"--gpu-architecture=" + arch, "--std=c++17", "--ptxas-options=-v"});
  if (built || built.error().detail.empty()) return built;
  Error e = built.error();
  e.message += "\n" + e.detail;
  return e;
}

}  // namespace

std::string arch_of(int major, int minor) { return fmt::format("sm_{}{}", major, minor); }

Result<BenchCubins> compile_bench_kernels(const std::string& arch, int max_tokens) {
  BenchCubins c;
  c.arch = arch;
  c.max_tokens = max_tokens;
  KDAJIT_TRY_ASSIGN(c.floor, compile_for("kdajit_bench_floor.cu", floor_source(max_tokens), arch));
  KDAJIT_TRY_ASSIGN(c.fill, compile_for("kdajit_bench_fill.cu", fill_source(), arch));
  return c;
}

Result<BenchCubins> compile_prefill_kernels(const std::string& arch) {
  BenchCubins c;
  c.arch = arch;
  KDAJIT_TRY_ASSIGN(c.fill, compile_for("kdajit_bench_fill.cu", fill_source(), arch));
  if (mma_bf16_supported(arch)) {
    KDAJIT_TRY_ASSIGN(c.mma, compile_for("kdajit_bench_mma.cu", mma_rate_source(), arch));
  }
  return c;
}

nlohmann::json kernels_json(const BenchCubins& c) {
  nlohmann::json j{{"arch", c.arch}, {"fill_compile_ms", c.fill.compile_ms}};
  if (!c.floor.cubin.empty()) {
    j["floor_max_tokens"] = c.max_tokens;
    j["floor_compile_ms"] = c.floor.compile_ms;
    j["floor_ptxas"] = resource_lines(c.floor.log);
  }
  if (!c.mma.cubin.empty()) {
    j["mma_compile_ms"] = c.mma.compile_ms;
    j["mma_ptxas"] = resource_lines(c.mma.log);
  }
  return j;
}

bool compile_only(const std::string& arch) {
  bool ok = true;
  for (int max_t : {8, kFloorMaxTokens}) {
    auto c = compile_bench_kernels(arch, max_t);
    if (!c) {
      fmt::print(stderr, "kdajit_bench: {}\n", c.error().message);
      return false;
    }
    fmt::print("floor kernels (T <= {}) for {}: {} bytes of cubin in {:.0f} ms\n", max_t, arch, c->floor.cubin.size(),
               c->floor.compile_ms);
    for (const auto& k : parse_resources(c->floor.log)) {
      fmt::print("  {}{}\n", describe(k), spills(k) ? "  <- SPILLS" : "");
      if (spills(k) && max_t == 8) ok = false;  // the default grid's build must not spill; the T = 16 limit may
    }
    if (max_t == 8) {
      fmt::print("fill kernels for {}: {} bytes of cubin in {:.0f} ms\n", arch, c->fill.cubin.size(),
                 c->fill.compile_ms);
      for (const auto& line : resource_lines(c->fill.log)) fmt::print("  {}\n", line);
    }
  }
  if (mma_bf16_supported(arch)) {
    auto m = compile_for("kdajit_bench_mma.cu", mma_rate_source(), arch);
    if (!m) {
      fmt::print(stderr, "kdajit_bench: {}\n", m.error().message);
      return false;
    }
    fmt::print("tensor-core rate kernel for {}: {} bytes of cubin in {:.0f} ms\n", arch, m->cubin.size(),
               m->compile_ms);
    for (const auto& k : parse_resources(m->log)) {
      fmt::print("  {}{}\n", describe(k), spills(k) ? "  <- SPILLS" : "");
      if (spills(k)) ok = false;  // spills would put memory traffic into the rate
    }
  } else {
    fmt::print("tensor-core rate kernel: n/a for {} (bf16 mma.sync needs sm_80 or later)\n", arch);
  }
  fmt::print("compile-only: {}\n", ok ? "ok" : "FAILED (spills in the default floor build or in the rate kernel)");
  return ok;
}

}  // namespace kdajit::bench
