// The ABI growth rule (docs/CONTRACT.md §9) in one place: every struct a caller
// passes starts with struct_size, set by its *_init to sizeof the struct of the
// caller's header. The entry points read the struct through read_sized(); the
// *_init functions write through init_sized().
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>

#include <fmt/format.h>

#include "kdajit/error.hpp"
#include "kdajit/kdajit.h"
#include "kdajit/kdajit_version.h"

namespace kdajit {

// What the growth rule needs to know about one struct: the argument name in
// messages, the C type name, and the sizes of every header generation that had
// struct_size, oldest first (a generation appends fields at the previous end,
// never into tail padding, so the sizes grow strictly).
struct SizedStruct {
  const char* arg;
  const char* type;
  std::span<const size_t> sizes;
};

inline constexpr size_t kOptionsSizes[] = {sizeof(kdajit_runtime_options_t)};
inline constexpr size_t kDecodeArgsSizes[] = {sizeof(kdajit_decode_args_t)};
inline constexpr size_t kConfigSizes[] = {sizeof(kdajit_config_t)};
// The prefill and chunk args before their workspace fields, then with them.
inline constexpr size_t kPrefillArgsSizes[] = {offsetof(kdajit_prefill_args_t, workspace),
                                               sizeof(kdajit_prefill_args_t)};
inline constexpr size_t kChunkArgsSizes[] = {offsetof(kdajit_chunk_args_t, workspace), sizeof(kdajit_chunk_args_t)};

inline constexpr SizedStruct kOptionsStruct{"options", "kdajit_runtime_options_t", kOptionsSizes};
inline constexpr SizedStruct kDecodeArgsStruct{"args", "kdajit_decode_args_t", kDecodeArgsSizes};
inline constexpr SizedStruct kConfigStruct{"config", "kdajit_config_t", kConfigSizes};
inline constexpr SizedStruct kPrefillArgsStruct{"args", "kdajit_prefill_args_t", kPrefillArgsSizes};
inline constexpr SizedStruct kChunkArgsStruct{"args", "kdajit_chunk_args_t", kChunkArgsSizes};

// "48" or "48, 56 or 64": the sizes a struct_size may have.
inline std::string known_sizes(const SizedStruct& s) {
  std::string out;
  for (size_t i = 0; i < s.sizes.size(); ++i)
    out += fmt::format("{}{}", i == 0 ? "" : i + 1 == s.sizes.size() ? " or " : ", ", s.sizes[i]);
  return out;
}

// The caller's struct as this library's T: `in` itself when its struct_size is
// this header's; a copy in `scratch` of its struct_size bytes over defaults()
// when it comes from an older header; an error naming the struct otherwise.
template <class T, class Defaults>
Result<const T*> read_sized(const T& in, T& scratch, Defaults defaults, const SizedStruct& s) {
  const size_t size = in.struct_size;
  if (size == sizeof(T)) return &in;
  if (std::find(s.sizes.begin(), s.sizes.end(), size) == s.sizes.end()) {
    const char* hint = size > sizeof(T) ? " (a header newer than this library)"
                       : size == 0      ? " (initialise the struct with its *_init function)"
                                        : "";
    return invalid_argument(fmt::format("{}.struct_size: expected sizeof({}) of a kdajit header that kdajit {} knows "
                                        "({}), got {}{}",
                                        s.arg, s.type, KDAJIT_VERSION_STRING, known_sizes(s), size, hint));
  }
  scratch = defaults();
  std::memcpy(static_cast<void*>(&scratch), &in, size);
  scratch.struct_size = sizeof(T);
  return &scratch;
}

// *_init: `defaults` (struct_size set to `size`) written into the first `size`
// bytes of `out`, zeros past sizeof(T); nothing when out is NULL or size cannot
// hold struct_size. An unknown size is then rejected by every entry point.
template <class T>
void init_sized(T* out, size_t size, T defaults) {
  if (!out || size < sizeof(size_t)) return;
  defaults.struct_size = size;
  const size_t n = std::min(size, sizeof(T));
  std::memcpy(static_cast<void*>(out), &defaults, n);
  if (size > n) std::memset(reinterpret_cast<char*>(out) + n, 0, size - n);
}

}  // namespace kdajit
