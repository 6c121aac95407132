#include "kdajit/runtime/jit/nvrtc_api.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "kdajit/dl_symbol.hpp"
#include "kdajit/log.hpp"

namespace kdajit {

namespace {

std::mutex g_mu;
std::vector<std::string> g_candidates;  // step 2
bool g_loaded = false;

// Binds every entry point of `lib`; false if one is missing.
bool bind_all(void* lib, NvrtcApi& a) {
  return bind_symbol(lib, a.nvrtcGetErrorString, "nvrtcGetErrorString") && bind_symbol(lib, a.nvrtcVersion, "nvrtcVersion") &&
         bind_symbol(lib, a.nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs") &&
         bind_symbol(lib, a.nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs") &&
         bind_symbol(lib, a.nvrtcCreateProgram, "nvrtcCreateProgram") &&
         bind_symbol(lib, a.nvrtcDestroyProgram, "nvrtcDestroyProgram") &&
         bind_symbol(lib, a.nvrtcCompileProgram, "nvrtcCompileProgram") &&
         bind_symbol(lib, a.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize") &&
         bind_symbol(lib, a.nvrtcGetProgramLog, "nvrtcGetProgramLog") && bind_symbol(lib, a.nvrtcGetCUBINSize, "nvrtcGetCUBINSize") &&
         bind_symbol(lib, a.nvrtcGetCUBIN, "nvrtcGetCUBIN");
}

// One attempt: the loaded API, or why not (appended to `tried`).
std::optional<NvrtcApi> try_load(const std::string& path, const char* chosen_by, std::vector<std::string>& tried) {
  // Never dlclose: the library stays for the life of the process.
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    tried.push_back(fmt::format("{} ({})", path, why ? why : "not found"));
    return std::nullopt;
  }
  NvrtcApi api{};
  if (!bind_all(lib, api)) {
    tried.push_back(fmt::format("{} (an entry point is missing: not NVRTC 12 or newer)", path));
    return std::nullopt;
  }
  int major = 0, minor = 0;
  api.nvrtcVersion(&major, &minor);
  api.version = fmt::format("{}.{}", major, minor);
  Dl_info info{};
  api.path = dladdr(reinterpret_cast<void*>(api.nvrtcVersion), &info) && info.dli_fname ? info.dli_fname : path;
  api.chosen_by = chosen_by;
  return api;
}

Result<NvrtcApi> load() {
  std::vector<std::string> tried;
  if (const char* env = std::getenv("KDAJIT_NVRTC"); env && *env) {
    if (auto api = try_load(env, "KDAJIT_NVRTC", tried)) return *api;
    return Error(ErrorCode::unsupported,
                 fmt::format("NVRTC: KDAJIT_NVRTC={} could not be loaded: {}", env, tried.back()));
  }
  std::vector<std::string> candidates;
  {
    std::lock_guard lock(g_mu);
    candidates = g_candidates;
  }
  for (const auto& c : candidates)
    if (auto api = try_load(c, "embedder", tried)) return *api;
  for (const char* soname : {"libnvrtc.so.13", "libnvrtc.so.12"})
    if (auto api = try_load(soname, "system", tried)) return *api;
#ifdef KDAJIT_TOOLKIT_NVRTC
  if (auto api = try_load(KDAJIT_TOOLKIT_NVRTC, "system", tried)) return *api;
#endif
  return Error(ErrorCode::unsupported,
               fmt::format("NVRTC: no usable libnvrtc was found (tried {}); install the CUDA toolkit or the nvidia "
                           "NVRTC pip package, or set KDAJIT_NVRTC to its path. Cached kernels still load without it",
                           fmt::join(tried, "; ")));
}

}  // namespace

Result<const NvrtcApi*> nvrtc() {
  static const Result<NvrtcApi> loaded = [] {
    auto r = load();
    // Every compile's log line names the NVRTC version; its path (and what chose
    // it) is here at debug level and in `kdajit env`.
    if (r) log_debug("NVRTC {} from {} ({})", r->version, r->path, r->chosen_by);
    std::lock_guard lock(g_mu);
    g_loaded = true;
    return r;
  }();
  if (!loaded) return loaded.error();
  return &*loaded;
}

bool nvrtc_add_candidate(std::string_view path) {
  std::lock_guard lock(g_mu);
  if (g_loaded) return false;
  g_candidates.emplace_back(path);
  return true;
}

Status nvrtc_check(const NvrtcApi& api, nvrtcResult r, std::string_view what) {
  if (r == NVRTC_SUCCESS) return {};
  return Error(ErrorCode::compile_failed, fmt::format("{} failed: {}", what, api.nvrtcGetErrorString(r)));
}

}  // namespace kdajit
