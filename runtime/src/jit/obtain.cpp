#include "kdajit/runtime/jit/obtain.hpp"

#include <future>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kdajit/routes.hpp"
#include "kdajit/runtime/jit/nvrtc_api.hpp"
#include "kdajit/sha256.hpp"
#include "kdajit/source_generator.hpp"

namespace kdajit {

namespace {

// The metadata fields of a build that describe its compile (the rest are the
// key's own, or the cache's).
constexpr const char* kCompileFields[] = {"registers", "spill_bytes", "stack_bytes", "smem_bytes",
                                          "compile_ms", "phases",      "nvrtc_log"};

// The cache's record of one compile (cubin, options, resources, log, entry name).
CacheBuild to_cache_build(const BuildInputs& in, CompiledKernel ck) {
  CacheBuild b;
  b.source = in.source;
  b.cubin = std::move(ck.cubin);
  b.options = in.options;
  b.nvrtc_version = in.nvrtc_version;
  b.meta = {{"entry", entry_name(in.key.op)},
            {"threads", route_spec(in.key.route).threads(in.key)},
            {"registers", ck.resources.registers},
            {"spill_bytes", ck.resources.spill_bytes},
            {"stack_bytes", ck.resources.stack_bytes},
            {"smem_bytes", ck.resources.smem_bytes},
            {"compile_ms", ck.compile_ms},
            {"phases", phases_to_json(ck.phases)},
            {"nvrtc_log", std::move(ck.log)}};
  return b;
}

// The entry of `in.key` made from the cubin of a program compiled for another
// key with the same build inputs (so the same hash): its compile's figures and
// log, and the key it was compiled for.
CacheBuild reused_cache_build(const BuildInputs& in, std::string cubin, const nlohmann::json& program_meta,
                              const std::string& compiled_for) {
  CacheBuild b = to_cache_build(in, CompiledKernel{});
  b.cubin = std::move(cubin);
  for (const char* f : kCompileFields)
    if (auto it = program_meta.find(f); it != program_meta.end()) b.meta[f] = *it;
  b.meta[kProgramCompiledForField] = compiled_for;
  return b;
}

// One compile of a program and the key it ran for (null result: it failed).
struct CompiledProgram {
  CacheBuild build;
  std::string compiled_for;
};
using ProgramFuture = std::shared_future<std::shared_ptr<const CompiledProgram>>;

// The programs of this process by build hash. Keys whose generated source and
// options are identical (the prefill op's head counts) have one hash; the first
// to build compiles, the others make their entries from its cubin. Process-wide
// because the cubin of a hash is the same whichever cache holds it; an entry is
// held weakly (its cache owns it), a compile in flight until its entry exists.
class ProgramIndex {
 public:
  // Where a build of `hash` takes its cubin from: a loaded entry, a compile in
  // flight to wait for, or (`leader` set) a compile of its own that the caller
  // then reports with finish().
  struct Claim {
    std::shared_ptr<const CacheEntry> entry;
    ProgramFuture compiling;
    std::shared_ptr<std::promise<std::shared_ptr<const CompiledProgram>>> leader;
  };
  Claim claim(const std::string& hash) {
    std::lock_guard<std::mutex> g(mu_);
    Program& p = programs_[hash];
    if (auto e = p.entry.lock()) return {std::move(e), {}, nullptr};
    if (p.compiling.valid()) return {nullptr, p.compiling, nullptr};
    auto promise = std::make_shared<std::promise<std::shared_ptr<const CompiledProgram>>>();
    p.compiling = promise->get_future().share();
    return {nullptr, {}, std::move(promise)};
  }
  // A compile claimed with claim() ended (`program` null: it failed, and the
  // next build of this hash compiles again).
  void finish(const std::string& hash, Claim& claim, std::shared_ptr<const CompiledProgram> program) {
    std::lock_guard<std::mutex> g(mu_);
    if (!program) programs_[hash].compiling = {};
    claim.leader->set_value(std::move(program));
  }
  // `entry` (any key) holds the program of its hash: later builds copy it, and
  // a finished compile of that hash is no longer needed.
  void record(const std::shared_ptr<const CacheEntry>& entry) {
    std::lock_guard<std::mutex> g(mu_);
    Program& p = programs_[entry->hash];
    if (!p.entry.lock()) p.entry = entry;
    if (p.compiling.valid() && p.compiling.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
      p.compiling = {};
  }

 private:
  struct Program {
    std::weak_ptr<const CacheEntry> entry;
    ProgramFuture compiling;
  };
  std::mutex mu_;
  std::unordered_map<std::string, Program> programs_;
};

ProgramIndex& program_index() {
  static ProgramIndex* index = new ProgramIndex();  // never destroyed: builds may run at exit
  return *index;
}

// The build of `in` (whose hash is `hash`): from a program of that hash this
// process already has, else one NVRTC compile that other keys of the hash share.
Result<CacheBuild> build_program(const BuildInputs& in, const std::string& hash) {
  ProgramIndex::Claim claim = program_index().claim(hash);
  if (claim.entry) {
    // The key whose compile made the cubin: the entry's own, unless it was made from another's.
    const nlohmann::json& meta = claim.entry->meta;
    auto of = meta.find(kProgramCompiledForField);
    return reused_cache_build(in, claim.entry->cubin, meta,
                              of != meta.end() && of->is_string() ? of->get<std::string>() : claim.entry->name);
  }
  if (claim.compiling.valid()) {
    if (auto done = claim.compiling.get())
      return reused_cache_build(in, done->build.cubin, done->build.meta, done->compiled_for);
    // That compile failed: this key's own compile reports its error.
    KDAJIT_TRY_ASSIGN(CompiledKernel ck, compile(in));
    return to_cache_build(in, std::move(ck));
  }
  Result<CompiledKernel> ck = Error(ErrorCode::internal, "");
  try {
    ck = compile(in);
  } catch (...) {
    program_index().finish(hash, claim, nullptr);  // a waiter must not wait forever
    throw;
  }
  if (!ck) {
    program_index().finish(hash, claim, nullptr);
    return std::move(ck).error();
  }
  CacheBuild b = to_cache_build(in, std::move(*ck));
  program_index().finish(hash, claim, std::make_shared<const CompiledProgram>(CompiledProgram{b, key_name(in.key)}));
  return b;
}

}  // namespace

Result<BuildPlan> plan_build(const KernelKey& key) {
  KDAJIT_TRY_ASSIGN(BuildInputs in, make_build_inputs(key));
  std::string hash = current_build_hash(in.source, in.options, in.key.arch, in.nvrtc_version);
  return BuildPlan{std::move(in), std::move(hash)};
}

// Without NVRTC the build hash cannot be formed (its version is an input), but a
// cached entry still serves: one of this key whose stored inputs are today's
// (schema, library version, source, options) and whose hash recomputes from them
// with the NVRTC version it records. The newest such entry, loaded verified.
Result<CacheLookup> find_without_nvrtc(KernelCache& cache, const KernelKey& key, const Error& no_nvrtc) {
  KDAJIT_TRY_ASSIGN(std::string source, generate_source(key));
  const std::vector<std::string> options = canonical_options(key);
  const std::string source_sha = sha256_hex(source);
  std::optional<std::string> best_hash;
  int64_t best_used = -1;
  for (const CacheEntryInfo& e : cache.list_entries()) {
    if (!e.key || *e.key != key || !e.meta || e.stale || !e.untrusted.empty()) continue;
    const nlohmann::json& m = *e.meta;
    auto text = [&](const char* f) { return m.contains(f) && m[f].is_string() ? m[f].get<std::string>() : std::string(); };
    if (text("source_sha256") != source_sha || !m.contains("options") || m["options"] != options) continue;
    const std::string hash = current_build_hash(source, options, key.arch, text("nvrtc_version"));
    if (hash != text("hash") || e.last_used_ns <= best_used) continue;
    // Only an entry that loads (every check of a load, e.g. the stored key parses)
    // is a candidate: a broken one is simply not in the cache.
    if (cache.probe(key, hash).state != CacheProbe::State::present) continue;
    best_hash = hash;
    best_used = e.last_used_ns;
  }
  if (!best_hash)
    return Error(no_nvrtc.code, fmt::format("{} (kernel {} is not in the cache either)", no_nvrtc.message, key_name(key)),
                 no_nvrtc.detail);
  auto found = cache.lookup(key, *best_hash, BuildFn(), /*allow_build=*/false);
  // Gone or broken since the probe: still the missing NVRTC, never a capture error.
  if (!found && found.error().code == ErrorCode::capture)
    return Error(no_nvrtc.code,
                 fmt::format("{} (kernel {} is not in the cache either: its entry became unusable)", no_nvrtc.message,
                             key_name(key)),
                 no_nvrtc.detail);
  return found;
}

Result<CacheLookup> obtain(KernelCache& cache, const KernelKey& key, bool allow_build) {
  // Another context of this process may have it already: no source generation then.
  if (auto entry = cache.find_loaded(key)) {
    CacheLookup hit;
    hit.entry = std::move(entry);
    hit.source = CacheSource::memory;
    return hit;
  }
  if (auto api = nvrtc(); !api) return find_without_nvrtc(cache, key, api.error());
  KDAJIT_TRY_ASSIGN(BuildPlan plan, plan_build(key));
  BuildFn build = [&plan]() { return build_program(plan.inputs, plan.hash); };
  auto found = cache.lookup(key, plan.hash, build, allow_build);
  if (found) program_index().record(found->entry);
  return found;
}

bool compiled_now(const CacheLookup& found) {
  return found.source == CacheSource::built && !found.entry->meta.contains(kProgramCompiledForField);
}

Result<std::shared_ptr<KernelCache>> open_kernel_cache(const std::string& root) {
  KDAJIT_TRY_ASSIGN(Environment env, read_environment());
  CacheOptions opts;
  opts.root = root;
  return std::make_shared<KernelCache>(opts, env);
}

}  // namespace kdajit
