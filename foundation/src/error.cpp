#include "kdajit/error.hpp"

namespace kdajit {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::ok: return "ok";
    case ErrorCode::invalid_argument: return "invalid argument";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::compile_failed: return "compile failed";
    case ErrorCode::cuda: return "CUDA error";
    case ErrorCode::cache: return "cache error";
    case ErrorCode::jit_disabled: return "JIT disabled";
    case ErrorCode::capture: return "stream capture";
    case ErrorCode::io: return "I/O error";
    case ErrorCode::internal: return "internal error";
  }
  return "unknown error";
}

}  // namespace kdajit
