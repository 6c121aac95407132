// `kdajit selfcheck`: on a GPU, runs every cached kernel of the local arch on
// fresh random data and checks it against the f64 reference (docs/CONTRACT.md
// §8; prefill and chunk keys: a few sequences of random lengths, §10's and §11's tolerances).
#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "kdajit/cache.hpp"
#include "kdajit/device_problem.hpp"
#include "kdajit/problem.hpp"
#include "kdajit/runtime/api/runtime_impl.hpp"
#include "kdajit/runtime/device/driver_api.hpp"
#include "selfcheck_prefill.hpp"

namespace kdajit::cli {

namespace {

// Runs `got` on the device through the runtime; downloads what the call writes.
Status run_on_device(Runtime::Impl& rt, ref::Problem& got) {
  KDAJIT_TRY_ASSIGN(auto dev, ref::DeviceProblem::upload(got));
  KDAJIT_TRY(rt.decode(got.op() == KDAJIT_OP_SINGLE ? Op::single : Op::packed, dev->args(), nullptr));
  return dev->download(got);
}

}  // namespace

void add_selfcheck_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("selfcheck", "Run every cached kernel of the local GPU against the f64 reference");
  struct Opts {
    std::string cache_dir;
    bool json = false;
    uint64_t seed = 2026;
    int device = 0;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--cache-dir", o->cache_dir, "cache root (default: KDAJIT_CACHE_DIR, XDG, ~/.cache/kdajit)");
  cmd->add_option("--seed", o->seed, "random seed of the test data")->capture_default_str();
  cmd->add_option("--device", o->device, "CUDA device ordinal the kernels run on")->capture_default_str();
  cmd->add_flag("--json", o->json, "print a JSON report");
  cmd->callback([o] {
    // Under --json every outcome is one JSON object; a run that could not check
    // anything here exits 77 (skipped), as the GPU tests do.
    auto skip = [&](const std::string& reason) {
      if (o->json) fmt::print("{}\n", nlohmann::json({{"status", "skipped"}, {"reason", reason}}).dump(2));
      else fmt::print("kdajit selfcheck: {}; skipped\n", reason);
      std::fflush(stdout);
      throw Failure("", kExitSkipped);
    };
    if (!gpu_available()) skip("no CUDA GPU on this machine");
    const int ordinal = unwrap(checked_device_ordinal(o->device, "--device"));
    const DriverApi& api = *unwrap(driver());
    const CUdevice dev = unwrap(device_for(api, ordinal));
    CUcontext ctx = nullptr;
    if (CUresult r = api.cuDevicePrimaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS)
      unwrap(Status(cuda_error(api, r, "cuDevicePrimaryCtxRetain")));
    api.cuCtxSetCurrent(ctx);
    const Arch arch = unwrap(local_arch(ordinal));

    // One runtime per route: each cached key runs with its own route.
    std::map<Route, std::unique_ptr<Runtime::Impl>> runtimes;
    auto runtime_for = [&](Route route) -> Runtime::Impl& {
      auto& rt = runtimes[route];
      if (!rt) {
        RuntimeOptions ro;
        ro.cache_dir = o->cache_dir;
        ro.route = std::string(to_string(route));
        ro.device = ordinal;
        rt = unwrap(Runtime::Impl::create(ro));
      }
      return *rt;
    };
    Runtime::Impl& any = runtime_for(Route::rowcta);
    std::set<KernelKey> keys;
    for (const auto& e : any.cache->list_entries())
      if (e.key && e.key->arch == arch) keys.insert(*e.key);
    if (keys.empty()) {
      std::string why = fmt::format("no cached kernels for {} in {}; run `kdajit prewarm` first", to_string(arch),
                                    any.cache->root());
      if (o->json) fmt::print("{}\n", nlohmann::json({{"status", "failed"}, {"reason", why}}).dump(2));
      std::fflush(stdout);
      throw Failure("selfcheck: " + why);
    }

    auto report = nlohmann::json::array();
    size_t failed = 0, width = 0;
    for (const auto& k : keys) width = std::max(width, key_name(k).size());
    if (!o->json) fmt::print("{:<{}}  {:>10}  {:>10}  {}\n", "key", width, "output err", "state err", "pass");
    uint64_t seed = o->seed;
    for (const auto& key : keys) {
      if (chunked(key.op)) {
        auto checked = key.op == Op::chunk ? check_chunk(runtime_for(key.route), key, seed++)
                                           : check_prefill(runtime_for(key.route), key, seed++);
        const std::string error = checked ? checked->message : checked.error().message;
        const bool pass = checked && checked->pass;
        const double out_err = checked ? checked->output_rel_l2 : 0, state_err = checked ? checked->state_rel_l2 : 0;
        failed += pass ? 0 : 1;
        report.push_back({{"key", key_name(key)}, {"output_rel_l2", out_err}, {"state_rel_l2", state_err},
                          {"pass", pass}, {"error", error}});
        if (!o->json) {
          fmt::print("{:<{}}  {:>10.2e}  {:>10.2e}  {}\n", key_name(key), width, out_err, state_err, pass ? "pass" : "FAIL");
          if (!pass) fmt::print("    {}\n", error);
        }
        continue;
      }
      ref::ProblemSpec spec = ref::default_spec(key, seed++);
      // The sequential route exists for repeated slots: check it on them.
      if (key.route == Route::sequential) {
        spec.mode = KDAJIT_INDICES_REPEATED_POSITIVE;
        spec.null_rows = spec.oob_rows = 0;  // the mode promises positive slots
      }
      auto made = ref::Problem::make(spec);
      std::string error;
      ref::CompareReport rep;
      if (!made) {
        error = made.error().message;
      } else {
        ref::Problem expected = *made, got = std::move(*made);
        Status ref_st = expected.run_reference();
        Status dev_st = ref_st ? run_on_device(runtime_for(key.route), got) : ref_st;
        if (!dev_st) error = dev_st.error().message;
        else rep = ref::compare(expected, got);
      }
      const bool pass = error.empty() && rep.pass;
      failed += pass ? 0 : 1;
      report.push_back({{"key", key_name(key)}, {"output_rel_l2", rep.output_rel_l2}, {"state_rel_l2", rep.state_rel_l2},
                        {"pass", pass}, {"error", error.empty() ? rep.message : error}});
      if (!o->json) {
        fmt::print("{:<{}}  {:>10.2e}  {:>10.2e}  {}\n", key_name(key), width, rep.output_rel_l2, rep.state_rel_l2,
                   pass ? "pass" : "FAIL");
        if (!pass) fmt::print("    {}\n", error.empty() ? rep.message : error);
      }
    }
    if (o->json)
      fmt::print("{}\n", nlohmann::json({{"status", failed ? "failed" : "passed"},
                                         {"arch", to_string(arch)},
                                         {"keys", keys.size()},
                                         {"failed", failed},
                                         {"results", report}})
                             .dump(2));
    else fmt::print("selfcheck: {} keys, {} passed, {} failed\n", keys.size(), keys.size() - failed, failed);
    if (failed) throw Failure(fmt::format("selfcheck: {} of {} kernels failed", failed, keys.size()));
  });
}

}  // namespace kdajit::cli
