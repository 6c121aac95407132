// `kdajit show KEY` and `kdajit compile KEY... | --preset NAME`: the generator
// and NVRTC without any cache.
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "commands.hpp"
#include "kdajit/presets.hpp"
#include "kdajit/source_generator.hpp"
#include "kdajit/parallel.hpp"
#include "kdajit/runtime/build/compile.hpp"

namespace kdajit::cli {

namespace {

struct CompileRow {
  KernelKey key;
  std::optional<CompiledKernel> result;
  std::string error;
};

}  // namespace

void add_compile_commands(CLI::App& app) {
  auto* show = app.add_subcommand("show", "Print the generated CUDA source of a kernel key");
  auto show_key = std::make_shared<std::string>();
  show->add_option("KEY", *show_key, "kernel key name")->required();
  show->callback([show_key] {
    KernelKey key = unwrap(parse_key(*show_key));
    fmt::print("{}", unwrap(generate_source(key)));
  });

  auto* cmd = app.add_subcommand("compile", "Compile kernel keys with NVRTC (no cache); one line per key");
  struct Opts {
    std::vector<std::string> keys;
    std::string preset;
    std::string arch = "sm_90";
    std::string out;
    unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("KEY", o->keys, "kernel key names");
  cmd->add_option("--preset", o->preset, "compile every key of a preset instead");
  cmd->add_option("--arch", o->arch, "arch for --preset")->capture_default_str();
  cmd->add_option("--out", o->out, "write <name>.cubin and <name>.cu into this directory");
  cmd->add_option("-j,--jobs", o->jobs, "parallel compiles")->capture_default_str()->check(CLI::Range(1u, 1024u));
  cmd->callback([o] {
    std::vector<CompileRow> rows;
    for (const auto& k : o->keys) rows.push_back({unwrap(parse_key(k)), {}, {}});
    if (!o->preset.empty())
      for (const auto& k : unwrap(preset_keys(o->preset, unwrap(parse_arch(o->arch))))) rows.push_back({k, {}, {}});
    if (rows.empty()) throw Failure("compile: expected at least one KEY or --preset NAME");
    if (!o->out.empty()) std::filesystem::create_directories(o->out);

    std::mutex print_mu;
    parallel_for(rows.size(), o->jobs, [&](size_t i) {
      CompileRow& row = rows[i];
      auto in = make_build_inputs(row.key);
      auto ck = in ? compile(*in) : Result<CompiledKernel>(in.error());
      std::lock_guard lock(print_mu);
      if (!ck) {
        row.error = ck.error().message + "\n" + ck.error().detail;
        fmt::print("{}  FAILED\n{}\n", key_name(row.key), row.error);
        return;
      }
      row.result = std::move(*ck);
      const auto& r = row.result->resources;
      fmt::print("{}  {:.0f} ms  {} registers  {} bytes spilled{}\n", key_name(row.key), row.result->compile_ms,
                 r.registers, r.spill_bytes, r.spill_bytes + r.stack_bytes > 0 ? "  SPILL" : "");
      std::fflush(stdout);
      if (!o->out.empty()) {
        std::ofstream(fmt::format("{}/{}.cubin", o->out, key_name(row.key)), std::ios::binary) << row.result->cubin;
        std::ofstream(fmt::format("{}/{}.cu", o->out, key_name(row.key)), std::ios::binary) << in->source;
      }
    });

    size_t failed = 0, spilled = 0;
    for (const auto& row : rows) {
      if (!row.result) ++failed;
      else if (row.result->resources.spill_bytes + row.result->resources.stack_bytes > 0) ++spilled;
    }
    fmt::print("{} keys: {} compiled, {} failed, {} with spills or stack\n", rows.size(), rows.size() - failed, failed, spilled);
    // A route that spills is a bug, as is a failed compile.
    if (failed || spilled) throw Failure(fmt::format("compile: {} failed, {} spilled", failed, spilled));
  });
}

}  // namespace kdajit::cli
