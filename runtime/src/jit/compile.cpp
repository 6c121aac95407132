#include "kdajit/runtime/jit/compile.hpp"

#include <chrono>
#include <cstring>
#include <regex>

#include <fmt/format.h>
#include "kdajit/runtime/jit/nvrtc_api.hpp"
#include "kdajit/source_generator.hpp"

namespace kdajit {

namespace {

constexpr const char* kProgramName = "kernel.cu";

// nvrtc_check() with the key in front of the message.
Status check_for(const NvrtcApi& api, nvrtcResult r, std::string_view what, const KernelKey& key) {
  Status s = nvrtc_check(api, r, what);
  if (s) return s;
  Error e = std::move(s).error();
  e.message = fmt::format("compile {}: {}", key_name(key), e.message);
  return e;
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
  KDAJIT_TRY_ASSIGN(const NvrtcApi* api, nvrtc());
  return BuildInputs{key, std::move(source), canonical_options(key), api->version};
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
  KDAJIT_TRY_ASSIGN(const NvrtcApi* nv, nvrtc());
  const NvrtcApi& api = *nv;
  if (api.version != in.nvrtc_version)
    return Error(ErrorCode::internal, fmt::format("compile {}: inputs were made for NVRTC {}, the loaded one is {}",
                                                  key_name(in.key), in.nvrtc_version, api.version));
  nvrtcProgram prog = nullptr;
  KDAJIT_TRY(check_for(api, api.nvrtcCreateProgram(&prog, in.source.c_str(), kProgramName, 0, nullptr, nullptr),
                       "nvrtcCreateProgram", in.key));
  struct Destroy {
    const NvrtcApi& api;
    nvrtcProgram* p;
    ~Destroy() { api.nvrtcDestroyProgram(p); }
  } destroy{api, &prog};

  std::vector<const char*> opts;
  for (const auto& o : in.options) opts.push_back(o.c_str());
  const nvrtcResult cr = api.nvrtcCompileProgram(prog, static_cast<int>(opts.size()), opts.data());

  CompiledKernel out;
  size_t log_size = 0;
  if (api.nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    out.log.resize(log_size);
    if (api.nvrtcGetProgramLog(prog, out.log.data()) != NVRTC_SUCCESS) out.log.clear();
    else out.log.resize(std::strlen(out.log.c_str()));  // the text up to its first NUL, never a NUL itself
  }
  if (cr != NVRTC_SUCCESS) {
    std::string detail = fmt::format("options: {}\nNVRTC {} ({})\n", fmt::join(in.options, " "), api.version, api.path);
    if (auto line = failing_source_line(out.log, in.source); !line.empty()) detail += line + "\n";
    detail += "NVRTC log:\n" + out.log;
    return Error(ErrorCode::compile_failed,
                 fmt::format("compile {}: NVRTC failed ({})", key_name(in.key), api.nvrtcGetErrorString(cr)),
                 std::move(detail));
  }
  size_t cubin_size = 0;
  KDAJIT_TRY(check_for(api, api.nvrtcGetCUBINSize(prog, &cubin_size), "nvrtcGetCUBINSize", in.key));
  out.cubin.resize(cubin_size);
  KDAJIT_TRY(check_for(api, api.nvrtcGetCUBIN(prog, out.cubin.data()), "nvrtcGetCUBIN", in.key));
  out.resources = parse_ptxas_log(out.log);
  out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

const std::vector<int>& nvrtc_compute_capabilities() {
  // Read once: a newer arch than the NVRTC knows is unsupported, not a compile error.
  static const std::vector<int> ccs = [] {
    std::vector<int> v;
    auto api = nvrtc();
    int n = 0;
    if (api && (*api)->nvrtcGetNumSupportedArchs(&n) == NVRTC_SUCCESS && n > 0) {
      v.resize(static_cast<size_t>(n));
      if ((*api)->nvrtcGetSupportedArchs(v.data()) != NVRTC_SUCCESS) v.clear();
    }
    return v;
  }();
  return ccs;
}

Status check_arch_target(Arch arch) {
  KDAJIT_TRY_ASSIGN(const NvrtcApi* api, nvrtc());
  const auto& ccs = nvrtc_compute_capabilities();
  const int cc = arch_compute_capability(arch);
  for (int c : ccs)
    if (c == cc) return {};
  return Error(ErrorCode::unsupported,
               fmt::format("arch: {} (compute capability {}) is not a target of NVRTC {} ({}); it supports [{}]",
                           to_string(arch), cc, api->version, api->path, fmt::join(ccs, ", ")));
}

}  // namespace kdajit
