// The C++ API over Runtime::Impl. The C structs it takes (DecodeArgs,
// SupportConfig) are read through their struct_size, as the C ABI reads them.
#include <fmt/format.h>

#include "kdajit/kdajit_version.h"
#include "kdajit/presets.hpp"
#include "kdajit/runtime/api/runtime_impl.hpp"
#include "kdajit/runtime/api/sized_struct.hpp"
#include "kdajit/runtime/call/support.hpp"

namespace kdajit {

namespace {

Status decode_sized(Runtime::Impl& impl, Op op, const DecodeArgs& given, StreamHandle stream) {
  DecodeArgs scratch;
  KDAJIT_TRY_ASSIGN(const DecodeArgs* args, read_sized(given, scratch, default_decode_args, kDecodeArgsStruct));
  return impl.decode(op, *args, stream);
}

Status prefill_sized(Runtime::Impl& impl, const PrefillArgs& given, StreamHandle stream) {
  PrefillArgs scratch;
  KDAJIT_TRY_ASSIGN(const PrefillArgs* args, read_sized(given, scratch, default_prefill_args, kPrefillArgsStruct));
  return impl.prefill(*args, stream);
}

Status chunk_sized(Runtime::Impl& impl, const ChunkArgs& given, StreamHandle stream) {
  ChunkArgs scratch;
  KDAJIT_TRY_ASSIGN(const ChunkArgs* args, read_sized(given, scratch, default_chunk_args, kChunkArgsStruct));
  return impl.chunk(*args, stream);
}

}  // namespace

PrefillArgs default_prefill_args() {
  PrefillArgs a{};
  kdajit_prefill_args_init(&a);
  return a;
}

ChunkArgs default_chunk_args() {
  ChunkArgs a{};
  kdajit_chunk_args_init(&a);
  return a;
}

DecodeArgs default_decode_args() {
  DecodeArgs a{};
  kdajit_decode_args_init(&a);
  return a;
}

std::string version() { return KDAJIT_VERSION_STRING; }

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Runtime::~Runtime() = default;

Outcome Runtime::create(const RuntimeOptions& options, std::unique_ptr<Runtime>* out) {
  if (!out) return {KDAJIT_ERROR_INVALID_ARGUMENT, "out: expected a non-null pointer", {}};
  auto impl = Impl::create(options);
  if (!impl) return to_outcome(std::move(impl).error());
  out->reset(new Runtime(std::move(impl).value()));
  return {};
}

Outcome Runtime::single_decode(const DecodeArgs& args, StreamHandle stream) {
  return to_outcome(decode_sized(*impl_, Op::single, args, stream));
}

Outcome Runtime::packed_decode(const DecodeArgs& args, StreamHandle stream) {
  return to_outcome(decode_sized(*impl_, Op::packed, args, stream));
}

Outcome Runtime::prefill(const PrefillArgs& args, StreamHandle stream) {
  return to_outcome(prefill_sized(*impl_, args, stream));
}

Outcome Runtime::selected_prefill_key(const PrefillArgs& given, StreamHandle stream, std::string* key_name_out) {
  PrefillArgs scratch;
  auto sized = read_sized(given, scratch, default_prefill_args, kPrefillArgsStruct);
  if (!sized) return to_outcome(std::move(sized).error());
  auto key = impl_->selected_prefill_key(**sized, stream);
  if (!key) return to_outcome(std::move(key).error());
  if (key_name_out) *key_name_out = key_name(*key);
  return {};
}

Outcome Runtime::chunk(const ChunkArgs& args, StreamHandle stream) { return to_outcome(chunk_sized(*impl_, args, stream)); }

Outcome Runtime::selected_chunk_key(const ChunkArgs& given, StreamHandle stream, std::string* key_name_out) {
  ChunkArgs scratch;
  auto sized = read_sized(given, scratch, default_chunk_args, kChunkArgsStruct);
  if (!sized) return to_outcome(std::move(sized).error());
  auto key = impl_->selected_chunk_key(**sized, stream);
  if (!key) return to_outcome(std::move(key).error());
  if (key_name_out) *key_name_out = key_name(*key);
  return {};
}

Outcome Runtime::selected_key(kdajit_op_t op, const DecodeArgs& given, StreamHandle stream, std::string* key_name_out) {
  const int32_t v = enum_value(op);
  if (v == KDAJIT_OP_PREFILL)
    return {KDAJIT_ERROR_INVALID_ARGUMENT,
            "op: expected KDAJIT_OP_SINGLE or KDAJIT_OP_PACKED for kdajit_decode_args_t, got KDAJIT_OP_PREFILL (a "
            "prefill's args are a kdajit_prefill_args_t: Runtime::selected_prefill_key)",
            {}};
  if (v == KDAJIT_OP_CHUNK)
    return {KDAJIT_ERROR_INVALID_ARGUMENT,
            "op: expected KDAJIT_OP_SINGLE or KDAJIT_OP_PACKED for kdajit_decode_args_t, got KDAJIT_OP_CHUNK (a "
            "chunk call's args are a kdajit_chunk_args_t: Runtime::selected_chunk_key)",
            {}};
  if (v != KDAJIT_OP_SINGLE && v != KDAJIT_OP_PACKED)
    return {KDAJIT_ERROR_INVALID_ARGUMENT, "op: expected KDAJIT_OP_SINGLE or KDAJIT_OP_PACKED, got " + std::to_string(v), {}};
  DecodeArgs scratch;
  auto sized = read_sized(given, scratch, default_decode_args, kDecodeArgsStruct);
  if (!sized) return to_outcome(std::move(sized).error());
  auto key = impl_->selected_key(v == KDAJIT_OP_SINGLE ? Op::single : Op::packed, **sized, stream);
  if (!key) return to_outcome(std::move(key).error());
  if (key_name_out) *key_name_out = key_name(*key);
  return {};
}

Outcome Runtime::prewarm(const std::string& name, bool* compiled) {
  auto key = parse_key(name);
  if (!key) {
    Error e = std::move(key).error();
    e.message = "key_name: " + e.message;
    return to_outcome(e);
  }
  auto built = impl_->prewarm(*key);
  if (!built) return to_outcome(std::move(built).error());
  if (compiled) *compiled = *built;
  return {};
}

Outcome Runtime::prewarm_async(const std::vector<std::string>& names, unsigned threads) {
  std::vector<KernelKey> keys;
  for (size_t i = 0; i < names.size(); ++i) {
    auto key = parse_key(names[i]);
    if (!key) {
      Error e = std::move(key).error();
      e.message = fmt::format("key_names[{}]: {}", i, e.message);
      return to_outcome(e);
    }
    keys.push_back(*key);
  }
  impl_->background->submit(keys, threads);
  return {};
}

void Runtime::wait_prewarm() { impl_->background->wait(); }

Outcome Runtime::preset_key_names(const std::string& preset, const std::string& arch_name, std::vector<std::string>* out) {
  if (!out) return {KDAJIT_ERROR_INVALID_ARGUMENT, "out: expected a non-null pointer", {}};
  auto arch = parse_arch(arch_name);
  if (!arch) return to_outcome(invalid_argument("arch: " + arch.error().message));
  auto keys = preset_keys(preset, *arch);
  if (!keys) return to_outcome(std::move(keys).error());
  out->clear();
  for (const auto& k : *keys) out->push_back(key_name(k));
  return {};
}

RuntimeStats Runtime::stats() const {
  const RegistryStats r = impl_->registry->stats();
  RuntimeStats s;
  s.serving_compiles = r.serving_compiles;
  s.serving_compile_ms = r.serving_compile_ms;
  s.disk_loads = r.disk_loads;
  s.memory_loads = r.memory_loads;
  s.prewarm_compiled = impl_->background->compiled();
  s.prewarm_failed = impl_->background->failed();
  s.prewarm_pending = impl_->background->pending();
  return s;
}

Outcome Runtime::query_support(const SupportConfig& given) {
  SupportConfig scratch;
  auto config = read_sized(given, scratch, default_config, kConfigStruct);
  if (!config) return to_outcome(std::move(config).error());
  return to_outcome(kdajit::query_support(**config));
}

}  // namespace kdajit
