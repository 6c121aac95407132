#include "kdajit/runtime/jit/compile.hpp"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include "kdajit/routes.hpp"
#include "kdajit/runtime/jit/nvrtc_api.hpp"
#include "kdajit/source_generator.hpp"

namespace kdajit {

namespace {

constexpr const char* kProgramName = "kernel.cu";

// nvrtc_check() with `what` in front of the message.
Status check_for(const NvrtcApi& api, nvrtcResult r, std::string_view call, std::string_view what) {
  Status s = nvrtc_check(api, r, call);
  if (s) return s;
  Error e = std::move(s).error();
  e.message = fmt::format("{}: {}", what, e.message);
  return e;
}

// "kernel.cu(123): error: ..." -> the source line 123, for the error detail.
std::string failing_source_line(const std::string& log, const std::string& program_name, const std::string& source) {
  const std::regex re(std::regex_replace(program_name, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
                      R"(\((\d+)\): error)");
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
  return fmt::format("{}:{}: {}", program_name, target,
                     source.substr(pos, end == std::string::npos ? end : end - pos));
}

// Every match of `re`'s first group in `log` (one per kernel of the program), as ints.
std::vector<int> all_ints(const std::string& log, const std::regex& re) {
  std::vector<int> out;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back(std::stoi((*it)[1].str()));
  return out;
}
int max_of(const std::vector<int>& v, int none) { return v.empty() ? none : *std::max_element(v.begin(), v.end()); }
int sum_of(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0); }

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// A private, empty file for NVRTC's `--time` table (NVRTC appends to it), removed
// when this goes out of scope. Empty path when none could be made: the compile
// then runs without the phase figures rather than fail.
struct PhaseTimeFile {
  std::string path;
  PhaseTimeFile() {
    std::error_code ec;
    std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
    if (ec) dir = "/tmp";
    std::string tmpl = (dir / "kdajit-nvrtc-time-XXXXXX").string();
    int fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd < 0) return;
    ::close(fd);
    path = tmpl;
  }
  ~PhaseTimeFile() {
    if (!path.empty()) ::unlink(path.c_str());
  }
  std::string read() const {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
};

}  // namespace

void parse_phase_times(const std::string& csv, CompilePhases& phases) {
  // NVRTC 12.x/13 phase names; a phase that shows up twice is summed.
  std::istringstream in(csv);
  std::string line;
  auto add = [](double& slot, double ms) { slot = slot < 0 ? ms : slot + ms; };
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ls(line);
    std::string cell;
    while (std::getline(ls, cell, ',')) {
      const size_t b = cell.find_first_not_of(' '), e = cell.find_last_not_of(" \r");
      cells.push_back(b == std::string::npos ? std::string() : cell.substr(b, e - b + 1));
    }
    if (cells.size() < 4 || cells[3] != "ms") continue;
    char* end = nullptr;
    const double ms = std::strtod(cells[2].c_str(), &end);
    if (end == cells[2].c_str()) continue;
    if (cells[1] == "CUDA C++ Frontend") add(phases.frontend_ms, ms);
    else if (cells[1] == "NVVM Optimizer") add(phases.nvvm_ms, ms);
    else if (cells[1] == "PTX Translation") add(phases.ptxas_ms, ms);
  }
}

std::vector<std::string> frontend_only_options() { return {"-minimal"}; }

nlohmann::json phases_to_json(const CompilePhases& p) {
  nlohmann::json j = nlohmann::json::object();
  auto put = [&](const char* name, double ms) {
    if (ms >= 0) j[name] = ms;
  };
  put("frontend_ms", p.frontend_ms);
  put("nvvm_ms", p.nvvm_ms);
  put("ptxas_ms", p.ptxas_ms);
  put("cpu_ms", p.cpu_ms);
  j["source_bytes"] = p.source_bytes;
  return j;
}

std::vector<std::string> canonical_options(const KernelKey& key) {
  // Fixed order: the options are part of the cache hash. No fast-math: the
  // numerics are specified against an f64 reference.
  return {
      fmt::format("--gpu-architecture={}{}", to_string(key.arch),
                  key.arch == Arch::sm_90 && wgmma_state_pass(key) ? "a" : ""),
      "--std=c++17",
      "-default-device",
      "--fmad=true",
      "-lineinfo",
      "--ptxas-options=-v",
      // Front end only: no texture/surface types, no cudadevrt declarations, no
      // device-side launch, none of which the templates use. Halves the front
      // end's time; the SASS is identical (test_sass_identity).
      "-minimal",
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
  // Lines of the form, once per kernel of the program (route twopass's
  // programs hold two or three; the figures are the largest kernel's, the
  // spills all of theirs):
  //   ptxas info    : Used 96 registers, used 1 barriers, 1600 bytes smem, ...
  //   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
  static const std::regex regs(R"(Used (\d+) registers)");
  static const std::regex smem(R"((\d+) bytes smem)");
  static const std::regex stack(R"((\d+) bytes stack frame)");
  static const std::regex stores(R"((\d+) bytes spill stores)");
  static const std::regex loads(R"((\d+) bytes spill loads)");
  KernelResources r;
  r.registers = max_of(all_ints(log, regs), -1);
  r.smem_bytes = max_of(all_ints(log, smem), 0);
  r.stack_bytes = max_of(all_ints(log, stack), 0);
  r.spill_bytes = sum_of(all_ints(log, stores)) + sum_of(all_ints(log, loads));
  return r;
}

Result<CompiledKernel> compile_program(std::string_view what, const std::string& program_name,
                                       const std::string& source, const std::vector<std::string>& options) {
  const auto t0 = std::chrono::steady_clock::now();
  KDAJIT_TRY_ASSIGN(const NvrtcApi* nv, nvrtc());
  const NvrtcApi& api = *nv;
  nvrtcProgram prog = nullptr;
  KDAJIT_TRY(check_for(api, api.nvrtcCreateProgram(&prog, source.c_str(), program_name.c_str(), 0, nullptr, nullptr),
                       "nvrtcCreateProgram", what));
  struct Destroy {
    const NvrtcApi& api;
    nvrtcProgram* p;
    ~Destroy() { api.nvrtcDestroyProgram(p); }
  } destroy{api, &prog};

  std::vector<const char*> opts;
  for (const auto& o : options) opts.push_back(o.c_str());
  // The phase table is a measurement, not a build input: it stays out of
  // the options (and so out of the cache hash) and does not change the cubin.
  PhaseTimeFile time_file;
  const std::string time_option = "--time=" + time_file.path;
  if (!time_file.path.empty()) opts.push_back(time_option.c_str());
  const double cpu0 = thread_cpu_ms();
  const nvrtcResult cr = api.nvrtcCompileProgram(prog, static_cast<int>(opts.size()), opts.data());
  const double cpu1 = thread_cpu_ms();

  CompiledKernel out;
  size_t log_size = 0;
  if (api.nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    out.log.resize(log_size);
    if (api.nvrtcGetProgramLog(prog, out.log.data()) != NVRTC_SUCCESS) out.log.clear();
    else out.log.resize(std::strlen(out.log.c_str()));  // the text up to its first NUL, never a NUL itself
  }
  if (cr != NVRTC_SUCCESS) {
    std::string detail = fmt::format("options: {}\nNVRTC {} ({})\n", fmt::join(options, " "), api.version, api.path);
    if (auto line = failing_source_line(out.log, program_name, source); !line.empty()) detail += line + "\n";
    detail += "NVRTC log:\n" + out.log;
    return Error(ErrorCode::compile_failed, fmt::format("{}: NVRTC failed ({})", what, api.nvrtcGetErrorString(cr)),
                 std::move(detail));
  }
  size_t cubin_size = 0;
  KDAJIT_TRY(check_for(api, api.nvrtcGetCUBINSize(prog, &cubin_size), "nvrtcGetCUBINSize", what));
  out.cubin.resize(cubin_size);
  KDAJIT_TRY(check_for(api, api.nvrtcGetCUBIN(prog, out.cubin.data()), "nvrtcGetCUBIN", what));
  out.resources = parse_ptxas_log(out.log);
  if (!time_file.path.empty()) parse_phase_times(time_file.read(), out.phases);
  out.phases.cpu_ms = cpu1 - cpu0;
  out.phases.source_bytes = source.size();
  out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

Result<CompiledKernel> compile(const BuildInputs& in) {
  KDAJIT_TRY_ASSIGN(const NvrtcApi* api, nvrtc());
  const std::string what = fmt::format("compile {}", key_name(in.key));
  if (api->version != in.nvrtc_version)
    return Error(ErrorCode::internal, fmt::format("{}: inputs were made for NVRTC {}, the loaded one is {}", what,
                                                  in.nvrtc_version, api->version));
  return compile_program(what, kProgramName, in.source, in.options);
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
