#include "kdajit/runtime/compiler.hpp"

#include <algorithm>
#include <chrono>
#include <regex>

#include <fmt/format.h>
#include <nvrtc.h>

#include "kdajit/generator.hpp"

namespace kdajit {

namespace {

constexpr const char* kProgramName = "kernel.cu";

Error nvrtc_error(nvrtcResult r, std::string_view what, const KernelKey& key) {
  return Error(ErrorCode::compile_failed,
               fmt::format("compile {}: {} failed: {}", key_name(key), what, nvrtcGetErrorString(r)));
}

// "kernel.cu(123): error: ..." -> the source line 123, for the error detail.
std::string failing_source_line(const std::string& log, const std::string& source) {
  static const std::regex re(R"(kernel\.cu\((\d+)\): error)");
  std::smatch m;
  if (!std::regex_search(log, m, re)) return {};
  const long target = std::stol(m[1].str());
  long line = 1;
  size_t pos = 0;
  while (line < target && pos != std::string::npos) {
    pos = source.find('\n', pos);
    if (pos != std::string::npos) ++pos;
    ++line;
  }
  if (pos == std::string::npos || pos >= source.size()) return {};
  size_t end = source.find('\n', pos);
  return fmt::format("kernel.cu:{}: {}", target, source.substr(pos, end == std::string::npos ? end : end - pos));
}

int first_int(const std::string& log, const std::regex& re) {
  std::smatch m;
  return std::regex_search(log, m, re) ? std::stoi(m[1].str()) : 0;
}

}  // namespace

std::string nvrtc_version() {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  return fmt::format("{}.{}", major, minor);
}

std::vector<std::string> canonical_options(const KernelKey& key) {
  // Fixed order: the options are part of the cache hash. No fast-math: the
  // numerics are specified against an f64 reference.
  return {
      fmt::format("--gpu-architecture={}", to_string(key.arch)),
      "--std=c++17",
      "-default-device",
      "--fmad=true",
      "-lineinfo",
      "--ptxas-options=-v",
      // NVRTC 12.9+ also caches in the driver's compute cache when a driver is
      // present; kdajit has its own cache, and a cached NVRTC result has no
      // ptxas report, so the register/spill check would go blind.
      "--no-cache",
  };
}

Result<BuildInputs> make_build_inputs(const KernelKey& key) {
  KDAJIT_TRY_ASSIGN(std::string source, generate_source(key));
  return BuildInputs{key, std::move(source), canonical_options(key), nvrtc_version()};
}

KernelResources parse_ptxas_log(const std::string& log, std::string_view entry) {
  // One section per kernel of the module:
  //   ptxas info    : Compiling entry function 'kda_single_decode' for 'sm_90'
  //   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
  //   ptxas info    : Used 96 registers, used 1 barriers, 1600 bytes smem, ...
  static const std::regex section(R"(Compiling entry function '([^']+)')");
  static const std::regex regs(R"(Used (\d+) registers)");
  static const std::regex smem(R"((\d+) bytes smem)");
  static const std::regex stack(R"((\d+) bytes stack frame)");
  static const std::regex stores(R"((\d+) bytes spill stores)");
  static const std::regex loads(R"((\d+) bytes spill loads)");
  std::vector<std::pair<std::string, size_t>> starts;  // (entry, offset)
  for (auto it = std::sregex_iterator(log.begin(), log.end(), section); it != std::sregex_iterator(); ++it)
    starts.emplace_back((*it)[1].str(), static_cast<size_t>(it->position()));
  if (starts.empty()) starts.emplace_back(std::string(entry), 0);  // a log without sections: one kernel
  KernelResources r;
  bool found = false;
  for (size_t i = 0; i < starts.size(); ++i) {
    const size_t end = i + 1 < starts.size() ? starts[i + 1].second : log.size();
    const std::string part = log.substr(starts[i].second, end - starts[i].second);
    std::smatch m;
    const int part_regs = std::regex_search(part, m, regs) ? std::stoi(m[1].str()) : -1;
    // A spill or a stack frame anywhere in the module counts.
    r.spill_bytes += first_int(part, stores) + first_int(part, loads);
    r.stack_bytes = std::max(r.stack_bytes, first_int(part, stack));
    if (!found && (starts[i].first == entry || i + 1 == starts.size())) {
      // Registers and shared memory of the launch-path kernel.
      found = starts[i].first == entry;
      r.registers = part_regs;
      r.smem_bytes = first_int(part, smem);
    }
  }
  return r;
}

Result<CompiledKernel> compile(const BuildInputs& in) {
  const auto t0 = std::chrono::steady_clock::now();
  nvrtcProgram prog = nullptr;
  nvrtcResult r = nvrtcCreateProgram(&prog, in.source.c_str(), kProgramName, 0, nullptr, nullptr);
  if (r != NVRTC_SUCCESS) return nvrtc_error(r, "nvrtcCreateProgram", in.key);
  struct Destroy {
    nvrtcProgram* p;
    ~Destroy() { nvrtcDestroyProgram(p); }
  } destroy{&prog};

  std::vector<const char*> opts;
  for (const auto& o : in.options) opts.push_back(o.c_str());
  const nvrtcResult cr = nvrtcCompileProgram(prog, static_cast<int>(opts.size()), opts.data());

  CompiledKernel out;
  size_t log_size = 0;
  if (nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    out.log.resize(log_size);
    nvrtcGetProgramLog(prog, out.log.data());
    out.log.resize(log_size - 1);  // drop the NUL
  }
  if (cr != NVRTC_SUCCESS) {
    std::string detail = fmt::format("options: {}\n", fmt::join(in.options, " "));
    if (auto line = failing_source_line(out.log, in.source); !line.empty()) detail += line + "\n";
    detail += "NVRTC log:\n" + out.log;
    return Error(ErrorCode::compile_failed,
                 fmt::format("compile {}: NVRTC failed ({})", key_name(in.key), nvrtcGetErrorString(cr)),
                 std::move(detail));
  }
  size_t cubin_size = 0;
  if (auto e = nvrtcGetCUBINSize(prog, &cubin_size); e != NVRTC_SUCCESS)
    return nvrtc_error(e, "nvrtcGetCUBINSize", in.key);
  out.cubin.resize(cubin_size);
  if (auto e = nvrtcGetCUBIN(prog, out.cubin.data()); e != NVRTC_SUCCESS) return nvrtc_error(e, "nvrtcGetCUBIN", in.key);
  out.resources = parse_ptxas_log(out.log, route_config(in.key).entry);
  out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace kdajit
