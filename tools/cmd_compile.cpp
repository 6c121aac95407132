// `kdajit show KEY` and `kdajit compile KEY... | --preset NAME`: the generator
// and NVRTC without any cache.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_env.hpp"
#include "cli_output.hpp"
#include "commands.hpp"
#include "key_selection.hpp"
#include "kdajit/presets.hpp"
#include "kdajit/source_generator.hpp"
#include "kdajit/parallel.hpp"
#include "kdajit/runtime/jit/compile.hpp"

namespace kdajit::cli {

namespace {

struct CompileRow {
  KernelKey key;
  std::optional<CompiledKernel> result;
  std::string error;
};

std::string errno_text(int e) { return std::generic_category().message(e); }

// mkdir -p where every directory it creates is 0700 whatever the umask: the
// binaries of a compile are nobody else's to read or replace. Existing
// directories are left as they are.
Status create_private_dirs(const std::string& path) {
  std::filesystem::path prefix;
  for (const auto& part : std::filesystem::path(path)) {
    prefix /= part;
    if (::mkdir(prefix.c_str(), 0700) == 0) {
      if (::chmod(prefix.c_str(), 0700) != 0)
        return Error(ErrorCode::io, fmt::format("--out: cannot set the mode of {}: {}", quote(prefix.string()), errno_text(errno)));
    } else if (errno != EEXIST) {
      return Error(ErrorCode::io, fmt::format("--out: cannot create {}: {}", quote(prefix.string()), errno_text(errno)));
    }
  }
  return {};
}

// Writes `bytes` as `name` in the open directory `dir_fd`: into a new file of its
// own (O_CREAT|O_EXCL|O_NOFOLLOW: never an existing file, never through a link
// someone planted), flushed, then renamed over `name`, which replaces a planted
// link itself and never writes to its target. Every step checked: a compile whose
// files could not be written has failed.
Status write_output(int dir_fd, const std::string& dir, const std::string& name, std::string_view bytes) {
  const std::string path = dir + "/" + name;
  auto fail = [&](std::string_view what, int e) {
    return Error(ErrorCode::io, fmt::format("--out: cannot {} {}: {}", what, quote(path), errno_text(e)));
  };
  static std::atomic<unsigned> counter{0};
  const std::string tmp = fmt::format(".{}.{}.{}.tmp", name, ::getpid(), counter++);
  int fd = ::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return fail("write", errno);
  auto drop = [&](std::string_view what, int e) {
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    return fail(what, e);
  };
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return drop("write", e);
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    return drop("write", e);
  }
  if (::close(fd) != 0) return drop("write", errno);
  if (::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) return drop("write", errno);
  return {};
}

// "front end 116, NVVM 325, ptxas 354; CPU 550 ms; 78 KB source": where the
// compile's time went (NVRTC's --time table; figures NVRTC did not give are left out).
std::string phases_text(const CompilePhases& p) {
  std::vector<std::string> parts;
  if (p.frontend_ms >= 0) parts.push_back(fmt::format("front end {:.0f}", p.frontend_ms));
  if (p.nvvm_ms >= 0) parts.push_back(fmt::format("NVVM {:.0f}", p.nvvm_ms));
  if (p.ptxas_ms >= 0) parts.push_back(fmt::format("ptxas {:.0f}", p.ptxas_ms));
  std::string out = fmt::format("{}", fmt::join(parts, ", "));
  if (p.cpu_ms >= 0) out += fmt::format("{}CPU {:.0f} ms", out.empty() ? "" : "; ", p.cpu_ms);
  return out + fmt::format("; {} KB source", (p.source_bytes + 512) / 1024);
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

void add_compile_commands(CLI::App& app) {
  auto* show = app.add_subcommand("show", "Print the generated CUDA source of a kernel key");
  auto show_key = std::make_shared<std::string>();
  show->add_option("KEY", *show_key, "kernel key name")->required();
  show->callback([show_key] {
    KernelKey key = unwrap(parse_key_text(*show_key));
    fmt::print("{}", unwrap(generate_source(key)));
  });

  auto* cmd = app.add_subcommand("compile", "Compile kernel keys with NVRTC (no cache); one line per key");
  struct Opts {
    std::vector<std::string> keys;
    std::string preset;
    std::string arch;
    std::string out;
    unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("KEY", o->keys, "kernel key names");
  cmd->add_option("--preset", o->preset, "compile every key of a preset instead");
  cmd->add_option("--arch", o->arch, fmt::format("arch for --preset (default: KDAJIT_ARCH, else the local GPU's, else {})",
                              to_string(kDefaultArch)));
  cmd->add_option("--out", o->out, "write <name>.cubin and <name>.cu into this directory");
  cmd->add_option("-j,--jobs", o->jobs, "parallel compiles")->capture_default_str()->check(CLI::Range(1u, 1024u));
  cmd->add_flag("--json", o->json, "one JSON object: per key ms, phases, registers, spills; median and max ms");
  cmd->callback([o] {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<CompileRow> rows;
    for (const auto& k : o->keys) rows.push_back({unwrap(parse_key_text(k)), {}, {}});
    if (!o->preset.empty())
      for (const auto& k : unwrap(preset_keys(o->preset, choose_arch(o->arch).arch))) rows.push_back({k, {}, {}});
    if (rows.empty()) throw Failure("compile: expected at least one KEY or --preset NAME", kExitUsage);
    std::set<Arch> archs;
    for (const auto& r : rows) archs.insert(r.key.arch);
    warn_if_not_runtime_arch("compile", archs);
    int out_fd = -1;
    if (!o->out.empty()) {
      Status made = create_private_dirs(o->out);
      out_fd = made ? ::open(o->out.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
      if (out_fd < 0)
        throw Failure(fmt::format("--out: expected a directory that can be created, got '{}' ({})", quote(o->out),
                                  made ? errno_text(errno) : made.error().message),
                      kExitUsage);
    }
    struct CloseOut {
      int fd;
      ~CloseOut() {
        if (fd >= 0) ::close(fd);
      }
    } close_out{out_fd};

    std::mutex print_mu;
    parallel_for(rows.size(), o->jobs, [&](size_t i) {
      CompileRow& row = rows[i];
      auto in = make_build_inputs(row.key);
      auto ck = in ? compile(*in) : Result<CompiledKernel>(in.error());
      Status written;
      if (ck && !o->out.empty()) {
        written = write_output(out_fd, o->out, key_name(row.key) + ".cubin", ck->cubin);
        if (written) written = write_output(out_fd, o->out, key_name(row.key) + ".cu", in->source);
      }
      std::lock_guard lock(print_mu);
      if (!ck || !written) {
        const Error& e = !ck ? ck.error() : written.error();
        row.error = e.message;
        if (!o->json) fmt::print("{}  FAILED: {}\n", key_name(row.key), printable(e.message, 400));
        std::fflush(stdout);
        if (!e.detail.empty()) print_error(fmt::format("{}: {}", key_name(row.key), e.message), e.detail);
        return;
      }
      row.result = std::move(*ck);
      if (o->json) return;
      const auto& r = row.result->resources;
      fmt::print("{}  {:.0f} ms  {} registers  {} bytes spilled{}  ({})\n", key_name(row.key), row.result->compile_ms,
                 r.registers, r.spill_bytes, r.spill_bytes + r.stack_bytes > 0 ? "  SPILL" : "",
                 phases_text(row.result->phases));
      std::fflush(stdout);
    });
    const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    size_t failed = 0, spilled = 0;
    for (const auto& row : rows) {
      if (!row.result) ++failed;
      else if (row.result->resources.spill_bytes + row.result->resources.stack_bytes > 0) ++spilled;
    }
    std::vector<double> ms;
    for (const auto& row : rows)
      if (row.result) ms.push_back(row.result->compile_ms);
    const double max_ms = ms.empty() ? 0 : *std::max_element(ms.begin(), ms.end());
    if (o->json) {
      nlohmann::json out = {{"keys", rows.size()},  {"compiled", rows.size() - failed}, {"failed", failed},
                            {"spilled", spilled},   {"jobs", o->jobs},                  {"wall_s", wall_s},
                            {"median_ms", median_of(ms)}, {"max_ms", max_ms},          {"results", nlohmann::json::array()}};
      for (const auto& row : rows) {
        nlohmann::json j = {{"key", key_name(row.key)}};
        if (row.result) {
          const auto& r = row.result->resources;
          j["ms"] = row.result->compile_ms;
          j["registers"] = r.registers;
          j["spill_bytes"] = r.spill_bytes;
          j["stack_bytes"] = r.stack_bytes;
          j["cubin_bytes"] = row.result->cubin.size();
          j["phases"] = phases_to_json(row.result->phases);
        } else {
          j["error"] = json_text(row.error);
        }
        out["results"].push_back(j);
      }
      fmt::print("{}\n", dump_json(out));
    } else {
      fmt::print("{} keys: {} compiled, {} failed, {} with spills or stack; median {:.0f} ms, max {:.0f} ms a key, "
                 "{:.1f} s with {} jobs\n",
                 rows.size(), rows.size() - failed, failed, spilled, median_of(ms), max_ms, wall_s, o->jobs);
    }
    // A route that spills is a bug, as is a failed compile or an unwritten file.
    if (failed || spilled) throw Failure(fmt::format("compile: {} failed, {} spilled", failed, spilled));
  });
}

}  // namespace kdajit::cli
