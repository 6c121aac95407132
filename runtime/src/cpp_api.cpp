#include "kdajit/runtime/runtime_impl.hpp"

namespace kdajit {

DecodeArgs default_decode_args() {
  DecodeArgs a{};
  kdajit_decode_args_init(&a);
  return a;
}

std::string version() { return kdajit_version(); }

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Runtime::~Runtime() = default;

Outcome Runtime::create(const RuntimeOptions& options, std::unique_ptr<Runtime>* out) {
  if (!out) return {KDAJIT_ERROR_INVALID_ARGUMENT, "out: expected a non-null pointer"};
  auto impl = Impl::create(options);
  if (!impl) return to_outcome(std::move(impl).error());
  out->reset(new Runtime(std::move(impl).value()));
  return {};
}

Outcome Runtime::single_decode(const DecodeArgs& args, StreamHandle stream) {
  return to_outcome(impl_->decode(Op::single, args, stream));
}

Outcome Runtime::packed_decode(const DecodeArgs& args, StreamHandle stream) {
  return to_outcome(impl_->decode(Op::packed, args, stream));
}

Outcome Runtime::query_support(const SupportConfig& config) { return to_outcome(kdajit::query_support(config)); }

}  // namespace kdajit
