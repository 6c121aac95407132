#include "nvrtc_build.hpp"

#include <fmt/format.h>
#include <nvrtc.h>

#include <chrono>

namespace kdajit::bench {

namespace {

Error nvrtc_error(nvrtcResult r, const std::string& what) {
  return Error(ErrorCode::compile_failed, fmt::format("{}: {}", what, nvrtcGetErrorString(r)));
}

// Owns an nvrtcProgram.
struct Program {
  nvrtcProgram p = nullptr;
  Program() = default;
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  ~Program() {
    if (p) (void)nvrtcDestroyProgram(&p);
  }
};

}  // namespace

std::string arch_of(int major, int minor) { return fmt::format("sm_{}{}", major, minor); }

Result<BuiltCubin> nvrtc_compile(const std::string& name, const std::string& source, const std::string& arch,
                                 const std::vector<std::string>& extra_options) {
  const auto t0 = std::chrono::steady_clock::now();
  Program prog;
  if (nvrtcResult r = nvrtcCreateProgram(&prog.p, source.c_str(), name.c_str(), 0, nullptr, nullptr);
      r != NVRTC_SUCCESS)
    return nvrtc_error(r, fmt::format("nvrtcCreateProgram({})", name));
  std::vector<std::string> opts = {"--gpu-architecture=" + arch, "--std=c++17", "--ptxas-options=-v"};
  opts.insert(opts.end(), extra_options.begin(), extra_options.end());
  std::vector<const char*> argv;
  for (const auto& o : opts) argv.push_back(o.c_str());
  const nvrtcResult compiled = nvrtcCompileProgram(prog.p, static_cast<int>(argv.size()), argv.data());
  BuiltCubin out;
  size_t log_size = 0;
  if (nvrtcGetProgramLogSize(prog.p, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    out.log.resize(log_size);
    if (nvrtcGetProgramLog(prog.p, out.log.data()) != NVRTC_SUCCESS) out.log.clear();
    while (!out.log.empty() && (out.log.back() == '\0' || out.log.back() == '\n')) out.log.pop_back();
  }
  if (compiled != NVRTC_SUCCESS)
    return Error(ErrorCode::compile_failed,
                 fmt::format("NVRTC compile of {} for {} failed: {}\n{}", name, arch, nvrtcGetErrorString(compiled),
                             out.log));
  size_t n = 0;
  if (nvrtcResult r = nvrtcGetCUBINSize(prog.p, &n); r != NVRTC_SUCCESS)
    return nvrtc_error(r, fmt::format("nvrtcGetCUBINSize({})", name));
  out.cubin.resize(n);
  if (nvrtcResult r = nvrtcGetCUBIN(prog.p, out.cubin.data()); r != NVRTC_SUCCESS)
    return nvrtc_error(r, fmt::format("nvrtcGetCUBIN({})", name));
  out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace kdajit::bench
