#include "kdajit/runtime/compiler.hpp"

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

KernelResources parse_ptxas_log(const std::string& log) {
  // Lines of the form (one kernel per program):
  //   ptxas info    : Used 96 registers, used 1 barriers, 1600 bytes smem, ...
  //   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
  static const std::regex regs(R"(Used (\d+) registers)");
  static const std::regex smem(R"((\d+) bytes smem)");
  static const std::regex stack(R"((\d+) bytes stack frame)");
  static const std::regex stores(R"((\d+) bytes spill stores)");
  static const std::regex loads(R"((\d+) bytes spill loads)");
  KernelResources r;
  std::smatch m;
  r.registers = std::regex_search(log, m, regs) ? std::stoi(m[1].str()) : -1;
  r.smem_bytes = first_int(log, smem);
  r.stack_bytes = first_int(log, stack);
  r.spill_bytes = first_int(log, stores) + first_int(log, loads);
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
  out.resources = parse_ptxas_log(out.log);
  out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace kdajit
