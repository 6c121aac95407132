// NVRTC, loaded with dlopen on the first compile (libkdajit.so does not link
// it): a cache hit needs no NVRTC at all, and an engine whose NVRTC comes from
// a pip package (libnvrtc.so.12 of the cu12 wheels, no toolkit) still works.
//
// Search order, first that loads wins:
//   1. KDAJIT_NVRTC (a path; when set and it does not load, that is the error);
//   2. a candidate the embedder registered with nvrtc_add_candidate() (the
//      Python package registers the NVRTC of its environment's nvidia package);
//   3. the system: libnvrtc.so.13, libnvrtc.so.12 (the loader's search path),
//      then the toolkit this build was configured with.
#pragma once

#include <nvrtc.h>

#include <string>
#include <string_view>

#include "kdajit/error.hpp"

namespace kdajit {

struct NvrtcApi {
  const char* (*nvrtcGetErrorString)(nvrtcResult);
  nvrtcResult (*nvrtcVersion)(int*, int*);
  nvrtcResult (*nvrtcGetNumSupportedArchs)(int*);
  nvrtcResult (*nvrtcGetSupportedArchs)(int*);
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                    const char* const*);
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*);
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*);

  std::string version;  // "13.0"
  std::string path;     // the file that was loaded
  std::string chosen_by;  // "KDAJIT_NVRTC", "embedder", "system"
};

// The loaded NVRTC, or Error{unsupported} listing every place that was tried.
Result<const NvrtcApi*> nvrtc();

// Registers a candidate path for step 2; only before the first nvrtc() call has
// effect. Returns false once NVRTC has been loaded.
bool nvrtc_add_candidate(std::string_view path);

// Error{compile_failed} "<what> failed: <NVRTC's message>" when r is not success.
Status nvrtc_check(const NvrtcApi& api, nvrtcResult r, std::string_view what);

}  // namespace kdajit
