// The one internal error type. Library code returns Result<T>/Status values;
// only the edges (the C ABI, the CLI) turn them into messages or exit codes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace kdajit {

// Mirrors kdajit_status_t of the public C header (same numbers).
enum class ErrorCode : int32_t {
  ok = 0,
  invalid_argument = 1,  // a caller's argument breaks the contract
  unsupported = 2,       // a valid request this build cannot serve
  compile_failed = 3,    // NVRTC rejected the generated source
  cuda = 4,              // the driver returned an error
  cache = 5,             // the on-disk cache failed in a way that matters
  jit_disabled = 6,      // KDAJIT_DISABLE_JIT=1 and the key is not cached
  capture = 7,           // a compile was needed while the stream is capturing
  io = 8,                // file system
  internal = 9,
};

const char* to_string(ErrorCode code);

// An error is data: a code, a one-line message that names the argument, the
// expected and the given value, and an optional multi-line detail (a compile
// log, the options, the failing source line).
struct Error {
  ErrorCode code = ErrorCode::internal;
  std::string message;
  std::string detail;

  Error() = default;
  Error(ErrorCode c, std::string msg, std::string det = {})
      : code(c), message(std::move(msg)), detail(std::move(det)) {}
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}
  Result(Error err) : v_(std::in_place_index<1>, std::move(err)) {}

  explicit operator bool() const { return v_.index() == 0; }
  bool ok() const { return v_.index() == 0; }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const& { return std::get<1>(v_); }
  Error&& error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, Error> v_;
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error err) : err_(std::move(err)) {}
  static Status success() { return {}; }

  explicit operator bool() const { return !err_.has_value(); }
  bool ok() const { return !err_.has_value(); }
  const Error& error() const& { return *err_; }
  Error&& error() && { return std::move(*err_); }

 private:
  std::optional<Error> err_;
};

inline Error invalid_argument(std::string msg) { return {ErrorCode::invalid_argument, std::move(msg)}; }

}  // namespace kdajit

#define KDAJIT_CONCAT_INNER(a, b) a##b
#define KDAJIT_CONCAT(a, b) KDAJIT_CONCAT_INNER(a, b)

// Propagates the error of a Status or Result expression.
#define KDAJIT_TRY(expr)                                          \
  do {                                                            \
    auto&& kdajit_try_r_ = (expr);                                \
    if (!kdajit_try_r_) return std::move(kdajit_try_r_).error();  \
  } while (0)

// Declares/assigns lhs from a Result expression, or propagates its error.
#define KDAJIT_TRY_ASSIGN(lhs, expr)                                              \
  auto KDAJIT_CONCAT(kdajit_try_v_, __LINE__) = (expr);                           \
  if (!KDAJIT_CONCAT(kdajit_try_v_, __LINE__))                                    \
    return std::move(KDAJIT_CONCAT(kdajit_try_v_, __LINE__)).error();             \
  lhs = std::move(KDAJIT_CONCAT(kdajit_try_v_, __LINE__)).value()
