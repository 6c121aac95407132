// What both grids of kdajit_bench share around their cells: the exit codes,
// the watchdog, opening and describing the device (the L2 flush buffer), the
// kernels and the prewarm, the baselines (the copy roofline, the host cost of a
// memset), and the frame of a run (GridRun: the deadline, the exit code, the
// JSON, the failures, the end).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "compile_kernels.hpp"
#include "measure.hpp"
#include "report.hpp"

namespace kdajit::bench {

// Exit codes (README): 0 all measured, 1 a kdajit or CUDA call failed,
// 2 usage error or no usable CUDA device, 3 time limit hit (partial results),
// 4 the GPU hung (a wait or the watchdog ran out of time).
enum ExitCode : int { kExitOk = 0, kExitFailed = 1, kExitUsage = 2, kExitTimeLimit = 3, kExitHung = 4 };

// Kills the process if the run outlives its hard limit: the last guard against
// a hang inside a CUDA call that no timeout of ours covers.
class Watchdog {
 public:
  explicit Watchdog(double seconds)
      : thread_([this, seconds] {
          std::unique_lock<std::mutex> l(m_);
          if (!cv_.wait_for(l, std::chrono::duration<double>(seconds), [this] { return done_; })) {
            std::fprintf(stderr, "kdajit_bench: watchdog: still running after %.0f s (a hung GPU or call); exiting\n",
                         seconds);
            std::fflush(nullptr);
            std::_Exit(kExitHung);
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> l(m_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

// Opens the device; a machine without one is a usage error (exit 2), not a crash.
Status open_device(int device);
// Fills b.gpu, b.sms, b.smem_per_sm, b.arch and allocates the L2 flush buffer.
Status describe_device(Bench& b);
// D2D copy bandwidth, read + write bytes counted: the roofline. Then the host
// cost of a 4-byte cudaMemsetAsync, a launch-like baseline for the host column.
Status measure_baselines(Bench& b);

// A usage error: "kdajit_bench: MSG" on stderr; returns kExitUsage.
int usage_error(const std::string& msg);

// Compiles the bench's kernels (`compile`, on one thread) while the kdajit keys
// of the grid (`keys`, from the runtimes' route selection) build in the cache on
// the other threads (--jobs), then reports the prewarm; the caller loads the cubins.
Result<BenchCubins> compile_while_prewarming(Bench& b, const std::function<Result<BenchCubins>()>& compile,
                                             const std::function<std::vector<std::string>()>& keys);

// Everything of a run before its cells, after the device is open: describe it,
// bind the driver, the stream, `event_pairs` event pairs, the timing context,
// the runtimes, the kernels (`prepare`), and the baselines.
Status set_up_run(Bench& b, int event_pairs, const std::function<Status()>& prepare);

// The device data of a family / cell (`what`) when `need` bytes fit with 1 GiB
// to spare: `create()` makes it.
template <class Data, class Create>
Result<std::unique_ptr<Data>> create_device_data(size_t need, const char* what, Create&& create) {
  size_t free_b = 0, total_b = 0;
  KDAJIT_TRY(cuda_status(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo"));
  if (need + (size_t{1} << 30) > free_b)
    return Error(ErrorCode::cuda, fmt::format("the {} needs {:.2f} GiB of device memory, {:.2f} GiB free", what,
                                              need / 1073741824.0, free_b / 1073741824.0));
  return create();
}

// --list's "routes timed": the --routes names, or "selector only".
std::string routes_timed_text(const std::vector<std::string>& routes);
// The end of --list: the estimate, the count of cells whose arguments failed;
// returns the exit code (kExitFailed when any did).
int finish_list(double estimated_seconds, size_t bad_args);

// Runs a grid under the watchdog on a fresh Bench of `o` (`run` sets the rest of
// it and returns the exit code); a hung GPU exits at once.
int run_guarded(const Options& o, const std::function<int(Bench&)>& run);

// The frame of one grid's run: a `Record` (CellResult, PrefillResult) per cell,
// the exit code, the status the JSON says, the deadline, and `report`, which
// builds the JSON from the results, the status and the seconds so far.
template <class Record>
class GridRun {
 public:
  using Report = std::function<nlohmann::json(const std::vector<Record>&, const std::string&, double)>;

  GridRun(Bench& b, size_t cells, Clock::time_point t_start, Report report)
      : results(cells),
        deadline(t_start + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(b.opt.time_limit_s))),
        b_(b),
        t_start_(t_start),
        report_(std::move(report)) {}

  std::vector<Record> results;
  int rc = kExitOk;
  std::string run_status = "running";  // what a JSON written mid-run (or left by a killed run) says
  bool stopped = false;                // a failure left the CUDA context unusable
  const Clock::time_point deadline;

  double elapsed() const { return seconds_since(t_start_); }

  // Opens --device; false (rc: usage) when there is none.
  bool open() {
    if (Status st = open_device(b_.opt.device); !st) {
      fmt::print(stderr, "kdajit_bench: {}\n", st.error().message);
      rc = kExitUsage;
      return false;
    }
    return true;
  }

  // Runs the setup; a failure fails every cell, writes the JSON and returns false.
  bool set_up(const std::function<Status()>& setup) {
    Status st = setup();
    if (st) return true;
    fmt::print(stderr, "kdajit_bench: setup: {}\n", st.error().message);
    rc = gpu_hung() ? kExitHung : kExitFailed;
    run_status = gpu_hung() ? "gpu_hung" : "failed";
    for (Record& m : results) m.error = "setup failed: " + st.error().message;
    save();
    return false;
  }

  // Writes the JSON (--json) as it stands.
  void save() {
    if (b_.opt.json_path.empty()) return;
    if (Status st = write_json(b_.opt.json_path, report_(results, run_status, elapsed())); !st) {
      fmt::print(stderr, "kdajit_bench: {}\n", st.error().message);
      if (rc == kExitOk) rc = kExitFailed;
    }
  }

  // A failure that leaves the context unusable (a sticky error, a hang) stops the run.
  bool context_usable() {
    if (gpu_hung()) return false;
    (void)cudaGetLastError();  // clears a non-sticky error; a sticky one shows in the wait
    return wait_stream(b_.stream, b_.opt.gpu_timeout_s, "stream after a failure").ok();
  }

  // The device data of these cells could not be made: they fail.
  void data_failed(const std::vector<size_t>& cells, const Error& e) {
    for (size_t ci : cells) {
      results[ci].status = "failed";
      results[ci].error = "device data: " + e.message;
    }
    rc = gpu_hung() ? kExitHung : kExitFailed;
    if (!context_usable()) stopped = true;
  }

  // The measurement of cell `name` (the `done`th) failed; true when it stopped the run.
  bool measure_failed(Record& m, const Error& e, size_t done, const std::string& name) {
    m.status = "failed";
    m.error = e.message;
    rc = gpu_hung() ? kExitHung : kExitFailed;
    fmt::print(stderr, "[{}/{}] {}: FAILED: {}\n", done, results.size(), name, m.error);
    if (!context_usable()) {
      run_status = gpu_hung() ? "gpu_hung" : "cuda_context_lost";
      stopped = true;
    }
    return stopped;
  }

  // A measured cell: a failed sub-measurement fails the run.
  void measured(const Record& m) {
    if (m.sub_failures > 0 && rc == kExitOk) rc = kExitFailed;
  }

  // After the cells: why the unmeasured ones were skipped, the time limit, the
  // final status, the tables (`print_tables`), the JSON; returns the exit code.
  int finish(const std::function<void(const std::vector<Record>&)>& print_tables) {
    for (Record& m : results)
      if (m.status == "skipped" && m.error.empty())
        m.error = gpu_hung() ? "the GPU hung" : stopped ? "stopped after an earlier failure" : "time limit";
    const bool timed_out =
        std::any_of(results.begin(), results.end(), [](const Record& m) { return m.error == "time limit"; });
    if (timed_out && rc == kExitOk) {
      rc = kExitTimeLimit;
      run_status = "time_limit";
    }
    if (run_status == "running") run_status = rc == kExitOk ? "ok" : "failed";
    if (timed_out)
      fmt::print(stderr, "kdajit_bench: time limit of {:.0f} s reached: partial results\n", b_.opt.time_limit_s);
    print_tables(results);
    save();
    if (!b_.opt.json_path.empty()) fmt::print("json: {}\n", b_.opt.json_path);
    fmt::print("total: {:.1f} s, exit {}\n", elapsed(), rc);
    return rc;
  }

 private:
  Bench& b_;
  Clock::time_point t_start_;
  Report report_;
};

}  // namespace kdajit::bench
