// kdajit_bench: device time, effective bandwidth against the copy roofline, and
// host cost per call of kdajit's decode ops (bench/README.md says how to run it
// and what every number means).
//
// Per configuration: one random problem (tests/reference) with every slot live
// and no padding, uploaded once; a warm-up that JIT-compiles the kernel; one
// decode call captured into a CUDA graph and replayed with an L2 flush before
// every replay (flush outside the timing events); then back-to-back replays
// without the flush; then the host cost of plain decode calls.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_cuda.hpp"
#include "device_problem.hpp"
#include "kdajit/kdajit.h"
#include "kdajit/kdajit.hpp"
#include "kdajit/problem.hpp"
#include "problem_pool.hpp"

namespace kdajit::bench {
namespace {

using nlohmann::json;

constexpr int64_t D = 128;

// Exit codes (README): 0 all measured, 1 a decode or CUDA call failed,
// 2 usage error or no usable CUDA device, 3 time limit hit (partial results),
// 4 the GPU hung (a wait or the watchdog ran out of time).
enum ExitCode : int { kExitOk = 0, kExitFailed = 1, kExitUsage = 2, kExitTimeLimit = 3, kExitHung = 4 };

struct Options {
  std::string op = "all";
  std::vector<int> heads, rows;
  std::vector<std::string> states;
  std::string conv = "sd";
  int tokens = 4;
  int iters = 200;
  int host_calls = 1000;
  std::string json_path, commit, cache_dir;
  int device = 0;
  double time_limit_s = 150;
  double gpu_timeout_s = 20;
  int gen_threads = 0;
  int flush_mib = 256;
  int copy_mib = 2048;
  int copy_reps = 20;
  bool list = false;
  bool verbose = false;
};

// One measured configuration. count is R for the single op, N for the packed op.
struct Config {
  kdajit_op_t op = KDAJIT_OP_SINGLE;
  int heads = 0;
  kdajit_dtype_t state = KDAJIT_DTYPE_F32;
  kdajit_conv_layout_t conv = KDAJIT_CONV_SD;
  int tokens = 1;
  int count = 0;
};

const char* op_name(kdajit_op_t op) { return op == KDAJIT_OP_SINGLE ? "single" : "packed"; }
const char* state_name(kdajit_dtype_t t) { return t == KDAJIT_DTYPE_F32 ? "f32" : "bf16"; }
const char* conv_name(kdajit_conv_layout_t c) { return c == KDAJIT_CONV_SD ? "sd" : "ds"; }
int64_t state_bytes_per_elem(kdajit_dtype_t t) { return t == KDAJIT_DTYPE_F32 ? 4 : 2; }

int64_t rows_of(const Config& c) { return c.op == KDAJIT_OP_SINGLE ? c.count : int64_t{c.count} * c.tokens; }

std::string config_name(const Config& c) {
  if (c.op == KDAJIT_OP_SINGLE)
    return fmt::format("single h{} r{} {} {}", c.heads, c.count, state_name(c.state), conv_name(c.conv));
  return fmt::format("packed h{} n{} t{} {} {}", c.heads, c.count, c.tokens, state_name(c.state), conv_name(c.conv));
}

// Bytes one call moves (spec section 7); every sequence of the packed op has L = T.
int64_t bytes_per_call(const Config& c) {
  const int64_t b = state_bytes_per_elem(c.state), H = c.heads;
  if (c.op == KDAJIT_OP_SINGLE) return int64_t{c.count} * H * (2 * D * D * b + 4608 + 1538);
  const int64_t L = c.tokens;
  return int64_t{c.count} * H * (D * D * b * (1 + L) + 2304 + 768 * (2 + L) + 1538 * L);
}

// --- The configurations -------------------------------------------------------

Result<std::vector<Config>> make_configs(const Options& o) {
  std::vector<kdajit_op_t> ops;
  if (o.op == "single" || o.op == "all") ops.push_back(KDAJIT_OP_SINGLE);
  if (o.op == "packed" || o.op == "all") ops.push_back(KDAJIT_OP_PACKED);
  if (ops.empty()) return invalid_argument(fmt::format("--op: expected single, packed or all, got '{}'", o.op));
  std::vector<kdajit_dtype_t> states;
  for (const auto& s : o.states) {
    if (s == "f32")
      states.push_back(KDAJIT_DTYPE_F32);
    else if (s == "bf16")
      states.push_back(KDAJIT_DTYPE_BF16);
    else
      return invalid_argument(fmt::format("--state: expected f32 or bf16, got '{}'", s));
  }
  for (int h : o.heads)
    if (h < 1 || h > 128) return invalid_argument(fmt::format("--heads: expected values in 1..128, got {}", h));
  for (int r : o.rows)
    if (r < 1 || r > 4096) return invalid_argument(fmt::format("--rows: expected values in 1..4096, got {}", r));
  if (o.tokens < 1 || o.tokens > 16) return invalid_argument(fmt::format("--tokens: expected 1..16, got {}", o.tokens));
  kdajit_conv_layout_t conv = KDAJIT_CONV_SD;
  if (o.conv == "ds")
    conv = KDAJIT_CONV_DS;
  else if (o.conv != "sd")
    return invalid_argument(fmt::format("--conv: expected sd or ds, got '{}'", o.conv));

  // A flag replaces that dimension of the default grid; the H = 96 extras belong
  // to the default set only.
  const bool custom = !o.heads.empty() || !o.rows.empty() || !o.states.empty();
  const std::vector<kdajit_dtype_t> all_states =
      states.empty() ? std::vector{KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16} : states;
  std::vector<Config> out;
  for (kdajit_op_t op : ops) {
    const bool single = op == KDAJIT_OP_SINGLE;
    const std::vector<int> hs = !o.heads.empty() ? o.heads : single ? std::vector{8, 16, 32, 64} : std::vector{16, 64};
    const std::vector<int> rs = !o.rows.empty() ? o.rows
                                : single        ? std::vector{1, 8, 32, 128, 512}
                                                : std::vector{1, 8, 32, 128};
    for (int h : hs)
      for (kdajit_dtype_t st : all_states)
        for (int r : rs) out.push_back(Config{op, h, st, conv, single ? 1 : o.tokens, r});
    if (single && !custom)
      for (int r : {1, 128}) out.push_back(Config{op, 96, KDAJIT_DTYPE_F32, conv, 1, r});
  }
  // Duplicates from repeated flag values would only be measured twice.
  std::vector<Config> unique;
  for (const Config& c : out) {
    auto same = [&](const Config& u) {
      return std::tie(u.op, u.heads, u.state, u.conv, u.tokens, u.count) ==
             std::tie(c.op, c.heads, c.state, c.conv, c.tokens, c.count);
    };
    if (std::none_of(unique.begin(), unique.end(), same)) unique.push_back(c);
  }
  return unique;
}

// Configurations sharing (op, H, state dtype) share one problem, built for the
// largest R (or N); a smaller configuration uses its first rows, whose slots
// lie scattered over the larger pool.
struct Family {
  Config shape;  // count = the largest
  std::vector<size_t> configs;
  ref::ProblemSpec spec;
  size_t host_bytes = 0;
};

std::vector<Family> make_families(const std::vector<Config>& configs) {
  std::vector<Family> fams;
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    auto it = std::find_if(fams.begin(), fams.end(), [&](const Family& f) {
      return f.shape.op == c.op && f.shape.heads == c.heads && f.shape.state == c.state && f.shape.conv == c.conv &&
             f.shape.tokens == c.tokens;
    });
    if (it == fams.end()) {
      fams.push_back(Family{c, {}, {}, 0});
      it = fams.end() - 1;
    }
    it->shape.count = std::max(it->shape.count, c.count);
    it->configs.push_back(i);
  }
  for (size_t i = 0; i < fams.size(); ++i) {
    Family& f = fams[i];
    ref::ProblemSpec& s = f.spec;
    s.op = f.shape.op;
    s.heads = f.shape.heads;
    s.state_dtype = f.shape.state;
    s.conv = f.shape.conv;
    s.tokens = f.shape.tokens;
    s.gate = KDAJIT_GATE_BOUNDED;
    if (s.op == KDAJIT_OP_SINGLE) {
      s.rows = f.shape.count;
    } else {
      s.seq_lens.assign(static_cast<size_t>(f.shape.count), f.shape.tokens);  // every sequence L = T
      s.num_accepted.clear();                                                 // random in [1, T]
    }
    // Every slot live, no padding (ProblemSpec's defaults, spelled out).
    s.null_rows = s.oob_rows = s.null_checkpoints = s.extra_rows = 0;
    s.row_pad = s.slot_pad = 0;
    s.num_slots = 0;  // the live slots + the null slot + 3 spares
    s.seed = 1000 + i;
    // Host bytes: every buffer, twice (Problem keeps a before-snapshot).
    const int64_t H = s.heads, T = s.tokens, K = T + 2, R = rows_of(f.shape);
    const int64_t S = (s.op == KDAJIT_OP_SINGLE ? R : int64_t{f.shape.count} * T) + 4;
    const int64_t bytes = S * H * D * D * state_bytes_per_elem(s.state_dtype) + S * 3 * H * D * K * 2 +
                          R * (6 * H * D + H) * 2 + (1 << 20);
    f.host_bytes = static_cast<size_t>(2 * bytes);
  }
  return fams;
}

// The args of a configuration: the family's device problem narrowed to its rows.
kdajit_decode_args_t args_for(const Config& c, const kdajit_decode_args_t& base) {
  kdajit_decode_args_t a = base;
  const int64_t R = rows_of(c);
  for (kdajit_tensor_t* t : {&a.x, &a.raw_gate, &a.raw_beta, &a.output_gate, &a.output}) t->shape[0] = R;
  a.state_indices.shape[0] = c.count;  // single: [R]; packed: [N, T]
  if (c.op == KDAJIT_OP_PACKED) {
    a.query_start_loc.shape[0] = c.count + 1;  // qsl[n] = n * T: the first N sequences cover rows [0, N*T)
    a.num_accepted_tokens.shape[0] = c.count;
  }
  return a;
}

// --- Measurements ---------------------------------------------------------------

struct Measured {
  std::string status = "skipped";  // ok | failed | skipped
  std::string error;               // failed: the message; skipped: why
  int64_t bytes = 0;
  Summary device, warm, host, validate;
  double floor_us = 0, gbps = 0, pct_roofline = 0;
  double host_loop_us = 0, host_throughput_us = 0;
  int host_calls = 0;
  double first_call_ms = 0, problem_seconds = 0;
  int gate_timeouts = 0;
  bool gated = false;
  bool host_during_generation = false;
};

struct Bench {
  Bench() = default;
  Bench(const Bench&) = delete;
  Bench& operator=(const Bench&) = delete;
  ~Bench() {
    if (stream) cudaStreamDestroy(stream);
  }

  Options opt;
  std::unique_ptr<Runtime> rt;
  cudaStream_t stream = nullptr;
  EventPairs events;
  DeviceBuffer flush;
  Summary copy_us;
  double copy_gbps = 0;
  Summary memset_host_us;
  json gpu = json::object();
  int gen_threads = 0;
  // Cleared for the rest of the run once a stream gate opens by itself: the
  // driver then did not run the gate's host function as expected, and holding
  // every batch for StreamGate::kMaxHoldSeconds would only waste the time limit.
  bool gating = true;
};

Status outcome_status(const Outcome& o, const char* what) {
  if (o) return {};
  return Error(static_cast<ErrorCode>(o.code),
               fmt::format("{}: {} ({})", what, o.message, kdajit_status_string(o.code)));
}

Outcome decode(Runtime& rt, kdajit_op_t op, const kdajit_decode_args_t& a, cudaStream_t s) {
  auto stream = reinterpret_cast<kdajit_stream_t>(s);
  return op == KDAJIT_OP_SINGLE ? rt.single_decode(a, stream) : rt.packed_decode(a, stream);
}

// D2D copy bandwidth, read + write bytes counted: the roofline.
Status measure_copy(Bench& b) {
  const size_t bytes = static_cast<size_t>(b.opt.copy_mib) << 20;
  DeviceBuffer src, dst;
  KDAJIT_TRY(src.allocate(bytes));
  KDAJIT_TRY(dst.allocate(bytes));
  BENCH_CUDA(cudaMemsetAsync(src.get(), 1, bytes, b.stream));
  BENCH_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, b.stream));  // warm-up
  KDAJIT_TRY(wait_stream(b.stream, b.opt.gpu_timeout_s, "copy warm-up"));
  int gate_timeouts = 0;
  KDAJIT_TRY_ASSIGN(std::vector<double> us,
                    time_on_stream(
                        b.stream, b.events, b.opt.copy_reps, b.opt.gpu_timeout_s, b.gating, &gate_timeouts,
                        [](int) { return Status{}; },
                        [&](int) {
                          return cuda_status(
                              cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, b.stream),
                              "cudaMemcpyAsync(D2D)");
                        }));
  if (gate_timeouts > 0) b.gating = false;
  b.copy_us = summarize(us);
  if (b.copy_us.median <= 0) return Error(ErrorCode::cuda, "copy bandwidth: a zero median time");
  b.copy_gbps = 2.0 * static_cast<double>(bytes) / (b.copy_us.median * 1e-6) / 1e9;
  return {};
}

// Host cost of a 4-byte cudaMemsetAsync: a launch-like baseline for the host column.
Status measure_memset_baseline(Bench& b) {
  const int n = b.opt.host_calls;
  std::vector<double> us;
  us.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    const cudaError_t e = cudaMemsetAsync(b.flush.get(), 0, 4, b.stream);
    us.push_back(us_between(t0, Clock::now()));
    BENCH_CUDA(e);
  }
  KDAJIT_TRY(wait_stream(b.stream, b.opt.gpu_timeout_s, "memset baseline"));
  b.memset_host_us = summarize(us);
  return {};
}

// Owns a captured graph and its executable.
struct GraphGuard {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  GraphGuard() = default;
  GraphGuard(const GraphGuard&) = delete;
  GraphGuard& operator=(const GraphGuard&) = delete;
  ~GraphGuard() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

Status measure_config(Bench& b, const Config& c, const kdajit_decode_args_t& a, bool generating, Measured& m) {
  Runtime& rt = *b.rt;
  const cudaStream_t s = b.stream;
  const double timeout = b.opt.gpu_timeout_s;
  m.bytes = bytes_per_call(c);

  // 1. Warm-up: the first call compiles (or loads from the disk cache) the kernel.
  const auto t_first = Clock::now();
  KDAJIT_TRY(outcome_status(decode(rt, c.op, a, s), "decode (first call)"));
  KDAJIT_TRY(wait_stream(s, timeout, "first decode call"));
  m.first_call_ms = seconds_since(t_first) * 1e3;
  for (int i = 0; i < 2; ++i) KDAJIT_TRY(outcome_status(decode(rt, c.op, a, s), "decode (warm-up)"));
  KDAJIT_TRY(wait_stream(s, timeout, "warm-up decode calls"));

  // 2. Device time: one call captured, replayed with and without an L2 flush.
  GraphGuard g;
  BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const Outcome captured = decode(rt, c.op, a, s);
  const cudaError_t ended = cudaStreamEndCapture(s, &g.graph);  // always: leaves the stream out of capture
  KDAJIT_TRY(outcome_status(captured, "decode (during graph capture)"));
  BENCH_CUDA(ended);
  BENCH_CUDA(cudaGraphInstantiate(&g.exec, g.graph, 0));
  BENCH_CUDA(cudaGraphLaunch(g.exec, s));  // the first launch uploads the graph
  KDAJIT_TRY(wait_stream(s, timeout, "first graph replay"));
  auto replay = [&](int) { return cuda_status(cudaGraphLaunch(g.exec, s), "cudaGraphLaunch"); };
  m.gated = b.gating;
  {
    // A different nonzero byte each time: nothing can treat the fill as unchanged or as zeros.
    auto flush = [&](int i) {
      return cuda_status(cudaMemsetAsync(b.flush.get(), i % 255 + 1, b.flush.bytes(), s), "cudaMemsetAsync(L2 flush)");
    };
    KDAJIT_TRY_ASSIGN(std::vector<double> us,
                      time_on_stream(s, b.events, b.opt.iters, timeout, b.gating, &m.gate_timeouts, flush, replay));
    m.device = summarize(std::move(us));
  }
  if (m.gate_timeouts > 0) b.gating = false;
  {
    KDAJIT_TRY_ASSIGN(std::vector<double> us, time_on_stream(
                                                  s, b.events, b.opt.iters, timeout, b.gating, &m.gate_timeouts,
                                                  [](int) { return Status{}; }, replay));
    m.warm = summarize(std::move(us));
  }
  if (m.gate_timeouts > 0) b.gating = false;
  if (m.device.median > 0) {
    m.floor_us = static_cast<double>(m.bytes) / (b.copy_gbps * 1e9) * 1e6;
    m.gbps = static_cast<double>(m.bytes) / (m.device.median * 1e-6) / 1e9;
    m.pct_roofline = 100.0 * m.gbps / b.copy_gbps;
  }

  // 3. Host cost. Validation alone, through the C ABI.
  const int n_validate = b.opt.host_calls;
  {
    std::vector<double> us;
    us.reserve(static_cast<size_t>(n_validate));
    for (int i = 0; i < n_validate; ++i) {
      const auto t0 = Clock::now();
      const kdajit_status_t st = kdajit_validate_args(c.op, &a);
      us.push_back(us_between(t0, Clock::now()));
      if (st != KDAJIT_OK)
        return Error(static_cast<ErrorCode>(st), fmt::format("kdajit_validate_args: {}", kdajit_last_error()));
    }
    m.validate = summarize(std::move(us));
  }
  // Whole decode calls back to back, no sync inside the loop. The count is cut
  // for slow kernels so that the GPU work of the loop stays near 2 s.
  int n = b.opt.host_calls;
  if (m.device.median > 0 && n > 100)
    n = static_cast<int>(std::clamp(2e6 / m.device.median, 100.0, static_cast<double>(n)));
  m.host_calls = n;
  m.host_during_generation = generating;
  {
    std::vector<double> us;
    us.reserve(static_cast<size_t>(n));
    Status calls_ok;
    const auto t0 = Clock::now();
    for (int i = 0; i < n && calls_ok; ++i) {
      const auto c0 = Clock::now();
      const Outcome o = decode(rt, c.op, a, s);
      us.push_back(us_between(c0, Clock::now()));
      calls_ok = outcome_status(o, "decode (host-cost loop)");
    }
    const auto t1 = Clock::now();
    KDAJIT_TRY(wait_stream(s, timeout, "host-cost loop"));
    const auto t2 = Clock::now();
    KDAJIT_TRY(std::move(calls_ok));
    m.host = summarize(std::move(us));
    m.host_loop_us = us_between(t0, t1) / n;
    m.host_throughput_us = us_between(t0, t2) / n;
  }
  m.status = "ok";
  return {};
}

// --- Reporting -------------------------------------------------------------------

json summary_json(const Summary& s) {
  return json{{"n", s.n},     {"median", s.median}, {"min", s.min},  {"p10", s.p10},
              {"p90", s.p90}, {"max", s.max},       {"mean", s.mean}};
}

json config_json(const Config& c, const Measured& m) {
  json j{{"name", config_name(c)},
         {"op", op_name(c.op)},
         {"heads", c.heads},
         {"rows", rows_of(c)},
         {"tokens", c.tokens},
         {"state", state_name(c.state)},
         {"conv", conv_name(c.conv)},
         {"gate", "bounded"},
         {"state_indices_mode", "unique_or_null"},
         {"status", m.status},
         {"bytes_per_call", bytes_per_call(c)}};
  if (c.op == KDAJIT_OP_PACKED) j["seqs"] = c.count;
  if (!m.error.empty()) j["error"] = m.error;
  if (m.status != "ok") return j;
  j["device_us"] = summary_json(m.device);
  j["warm_us"] = summary_json(m.warm);
  j["floor_us"] = m.floor_us;
  j["effective_gbps"] = m.gbps;
  j["pct_of_copy_bandwidth"] = m.pct_roofline;
  j["host_us_per_call"] = summary_json(m.host);
  j["host_loop_us_per_call"] = m.host_loop_us;
  j["host_throughput_us_per_call"] = m.host_throughput_us;
  j["host_calls"] = m.host_calls;
  j["host_measured_while_generating"] = m.host_during_generation;
  j["validate_us_per_call"] = summary_json(m.validate);
  j["first_call_ms"] = m.first_call_ms;
  j["problem_build_seconds"] = m.problem_seconds;
  j["stream_gate"] = m.gated;
  j["gate_timeouts"] = m.gate_timeouts;
  return j;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string first_line_of(const char* path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

json report_json(const Bench& b, const std::vector<Config>& configs, const std::vector<Measured>& results,
                 const std::string& run_status, double seconds) {
  json cfgs = json::array();
  for (size_t i = 0; i < configs.size(); ++i) cfgs.push_back(config_json(configs[i], results[i]));
  const Options& o = b.opt;
  return json{
      {"schema", "kdajit-bench-decode/1"},
      {"date", utc_now()},
      {"commit", o.commit},
      {"kdajit_version", kdajit::version()},
      {"status", run_status},
      {"total_seconds", seconds},
      {"host", {{"hostname", host_name()}, {"cpus", std::thread::hardware_concurrency()}}},
      {"gpu", b.gpu},
      {"settings",
       {{"iters", o.iters},
        {"host_calls", o.host_calls},
        {"flush_bytes", b.flush.bytes()},
        {"copy_bytes", static_cast<int64_t>(o.copy_mib) << 20},
        {"copy_reps", o.copy_reps},
        {"time_limit_s", o.time_limit_s},
        {"gpu_timeout_s", o.gpu_timeout_s},
        {"problem_threads", b.gen_threads},
        {"stream_gate_at_end", b.gating},
        {"cache_dir", o.cache_dir}}},
      {"copy_bandwidth_gbps", b.copy_gbps},
      {"copy_us", summary_json(b.copy_us)},
      {"memset_host_us_per_call", summary_json(b.memset_host_us)},
      {"configs", cfgs},
  };
}

// Written to FILE.tmp and renamed, so a run killed mid-write leaves the last good file.
Status write_json(const std::string& path, const json& j) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f)
      return Error(ErrorCode::io, fmt::format("--json: cannot open '{}' for writing: {}", tmp, std::strerror(errno)));
    f << j.dump(2) << '\n';
    if (!f.flush()) return Error(ErrorCode::io, fmt::format("--json: writing '{}' failed", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Error(ErrorCode::io, fmt::format("--json: renaming '{}' to '{}' failed: {}", tmp, path, ec.message()));
  return {};
}

void print_table(const Bench& b, const std::vector<Config>& configs, const std::vector<Measured>& results) {
  fmt::print("\nkdajit {} on {} | copy roofline {:.0f} GB/s | memset host {:.2f} us | {} replays, L2 flush {} MiB\n",
             kdajit::version(), b.gpu.value("name", std::string("?")), b.copy_gbps, b.memset_host_us.median,
             b.opt.iters, b.flush.bytes() >> 20);
  fmt::print("{:<6} {:>4} {:>5} {:>2} {:<5} {:>10} {:>10} {:>10} {:>8} {:>7} {:>8} {:>8}\n", "op", "H", "R/N", "T",
             "state", "median us", "min us", "floor us", "GB/s", "% roof", "host us", "valid us");
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    const Measured& m = results[i];
    fmt::print("{:<6} {:>4} {:>5} {:>2} {:<5} ", op_name(c.op), c.heads, c.count, c.tokens, state_name(c.state));
    if (m.status == "ok")
      fmt::print("{:>10.2f} {:>10.2f} {:>10.2f} {:>8.0f} {:>7.1f} {:>8.2f} {:>8.2f}\n", m.device.median, m.device.min,
                 m.floor_us, m.gbps, m.pct_roofline, m.host.median, m.validate.median);
    else  // the first line only: a compile failure carries its log (the JSON has all of it)
      fmt::print("{}: {}\n", m.status == "failed" ? "FAILED" : "skipped", m.error.substr(0, m.error.find('\n')));
  }
}

// --- The run -------------------------------------------------------------------

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
Status open_device(Bench& b) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return Error(ErrorCode::unsupported, fmt::format("no CUDA device (cudaGetDeviceCount: {})",
                                                     e == cudaSuccess ? "0 devices" : cudaGetErrorString(e)));
  if (b.opt.device < 0 || b.opt.device >= count)
    return Error(ErrorCode::unsupported, fmt::format("--device: expected 0..{}, got {}", count - 1, b.opt.device));
  if (cudaError_t r = cudaSetDevice(b.opt.device); r != cudaSuccess)
    return Error(ErrorCode::unsupported,
                 fmt::format("no usable CUDA device (cudaSetDevice: {})", cudaGetErrorString(r)));
  if (cudaError_t r = cudaFree(nullptr); r != cudaSuccess)  // creates the primary context the runtime launches into
    return Error(ErrorCode::unsupported,
                 fmt::format("no usable CUDA device (context creation: {})", cudaGetErrorString(r)));
  return {};
}

Status describe_device(Bench& b) {
  const int dev = b.opt.device;
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, dev));
  int sms = 0, l2 = 0, driver = 0, runtime = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  BENCH_CUDA(cudaDriverGetVersion(&driver));
  BENCH_CUDA(cudaRuntimeGetVersion(&runtime));
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess) bus[0] = 0;
  b.gpu = json{{"name", prop.name},
               {"device", dev},
               {"pci_bus_id", bus},
               {"compute_capability", fmt::format("{}.{}", prop.major, prop.minor)},
               {"sms", sms},
               {"l2_bytes", l2},
               {"memory_bytes", prop.totalGlobalMem},
               {"cuda_driver_version", fmt::format("{}.{}", driver / 1000, driver % 1000 / 10)},
               {"cuda_runtime_version", fmt::format("{}.{}", runtime / 1000, runtime % 1000 / 10)},
               {"nvidia_driver", first_line_of("/proc/driver/nvidia/version")}};
  // The flush must exceed the L2 several times over.
  const size_t flush = std::max(static_cast<size_t>(b.opt.flush_mib) << 20, 4 * static_cast<size_t>(l2));
  KDAJIT_TRY(b.flush.allocate(flush));
  return {};
}

int run(Bench& b, const std::vector<Config>& configs, Clock::time_point t_start, bool* workers_busy) {
  const Options& o = b.opt;
  std::vector<Measured> results(configs.size());
  const auto deadline =
      t_start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.time_limit_s));
  auto elapsed = [&] { return seconds_since(t_start); };

  if (Status st = open_device(b); !st) {
    fmt::print(stderr, "kdajit_bench: {}\n", st.error().message);
    return kExitUsage;
  }
  if (Status st = describe_device(b); !st) {
    fmt::print(stderr, "kdajit_bench: {}\n", st.error().message);
    return kExitFailed;
  }
  RuntimeOptions ro;
  ro.cache_dir = o.cache_dir;
  ro.device = -1;  // the stream's context: the primary context opened above
  ro.log_level = o.verbose ? KDAJIT_LOG_INFO : KDAJIT_LOG_QUIET;
  if (Outcome out = Runtime::create(ro, &b.rt); !out) {
    fmt::print(stderr, "kdajit_bench: Runtime::create: {}\n", out.message);
    return kExitFailed;
  }
  if (Status st = cuda_status(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      !st) {
    fmt::print(stderr, "kdajit_bench: {}\n", st.error().message);
    return kExitFailed;
  }
  if (Status st = b.events.create(std::max(o.iters, o.copy_reps)); !st) {
    fmt::print(stderr, "kdajit_bench: {}\n", st.error().message);
    return kExitFailed;
  }

  // Host problems build on worker threads (largest first) from here on.
  std::vector<Family> fams = make_families(configs);
  std::vector<ProblemPool::Job> jobs;
  for (size_t i = 0; i < fams.size(); ++i) jobs.push_back({i, fams[i].spec, fams[i].host_bytes});
  std::stable_sort(jobs.begin(), jobs.end(), [](const auto& x, const auto& y) { return x.host_bytes > y.host_bytes; });
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const size_t phys = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : size_t{16} << 30;
  const size_t host_cap = std::min(phys / 2, size_t{64} << 30);
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Two cores stay free for the timing thread and the driver's threads.
  b.gen_threads = o.gen_threads > 0 ? o.gen_threads : std::clamp(hw - 2, 1, static_cast<int>(fams.size()));
  ProblemPool pool(std::move(jobs), b.gen_threads, host_cap);

  fmt::print(stderr, "kdajit_bench: {} ({} SMs), {} configurations in {} problems, {} build threads\n",
             b.gpu.value("name", std::string("?")), b.gpu.value("sms", 0), configs.size(), fams.size(), b.gen_threads);
  int rc = kExitOk;
  std::string run_status = "running";  // what a JSON written mid-run (or left by a killed run) says
  auto fail = [&](const char* what, const Status& st) {
    fmt::print(stderr, "kdajit_bench: {}: {}\n", what, st.error().message);
    rc = gpu_hung() ? kExitHung : kExitFailed;
    run_status = gpu_hung() ? "gpu_hung" : "failed";
  };
  auto save = [&] {
    if (o.json_path.empty()) return;
    if (Status st = write_json(o.json_path, report_json(b, configs, results, run_status, elapsed())); !st) {
      fmt::print(stderr, "kdajit_bench: {}\n", st.error().message);
      if (rc == kExitOk) rc = kExitFailed;
    }
  };

  if (Status st = measure_copy(b); !st)
    fail("copy bandwidth", st);
  else if (Status st2 = measure_memset_baseline(b); !st2)
    fail("memset baseline", st2);
  if (rc == kExitOk)
    fmt::print(stderr, "kdajit_bench: copy roofline {:.0f} GB/s ({:.1f} us per {} MiB copy), memset host {:.2f} us\n",
               b.copy_gbps, b.copy_us.median, o.copy_mib, b.memset_host_us.median);

  // A failure that leaves the context unusable (a sticky error, a hang) stops the run.
  auto context_usable = [&] {
    if (gpu_hung()) return false;
    (void)cudaGetLastError();  // clears a non-sticky error; a sticky one shows in the wait
    return wait_stream(b.stream, o.gpu_timeout_s, "stream after a failure").ok();
  };
  bool stopped = rc != kExitOk;
  size_t done = 0;
  while (!stopped && Clock::now() < deadline) {
    std::optional<ProblemPool::Built> built = pool.next(deadline);
    if (!built) break;  // every problem delivered, or the deadline passed while waiting
    const Family& f = fams[built->id];
    auto mark_family = [&](const std::string& status, const std::string& why) {
      for (size_t ci : f.configs)
        if (results[ci].status == "skipped" && results[ci].error.empty()) {
          results[ci].status = status;
          results[ci].error = why;
        }
    };
    if (!built->problem) {
      mark_family("failed", "Problem::make: " + built->problem.error().message);
      pool.release(built->host_bytes);
      rc = kExitFailed;
      continue;
    }
    std::optional<ref::Problem> problem(std::move(built->problem).value());
    std::unique_ptr<DeviceProblem> dp;
    {
      size_t free_b = 0, total_b = 0;
      const size_t need = DeviceProblem::device_bytes(*problem);
      Status st = cuda_status(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
      if (st && need + (size_t{1} << 30) > free_b)
        st = Error(ErrorCode::cuda, fmt::format("the problem needs {:.2f} GiB of device memory, {:.2f} GiB free",
                                                need / 1073741824.0, free_b / 1073741824.0));
      if (st) {
        auto up = DeviceProblem::upload(*problem);
        if (up)
          dp = std::move(up).value();
        else
          st = std::move(up).error();
      }
      problem.reset();
      pool.release(built->host_bytes);
      if (!st) {
        mark_family("failed", "upload: " + st.error().message);
        rc = kExitFailed;
        if (!context_usable()) stopped = true;
        continue;
      }
    }
    for (size_t ci : f.configs) {
      const Config& c = configs[ci];
      Measured& m = results[ci];
      if (Clock::now() > deadline) {
        m.error = "time limit";
        continue;
      }
      m.problem_seconds = built->seconds;
      const Status st = measure_config(b, c, args_for(c, dp->args()), pool.busy(), m);
      ++done;
      if (!st) {
        m.status = "failed";
        m.error = st.error().message;
        rc = gpu_hung() ? kExitHung : kExitFailed;
        fmt::print(stderr, "[{}/{}] {}: FAILED: {}\n", done, configs.size(), config_name(c), m.error);
        if (!context_usable()) {
          run_status = gpu_hung() ? "gpu_hung" : "cuda_context_lost";
          stopped = true;
          break;
        }
        continue;
      }
      fmt::print(stderr,
                 "[{}/{}] {}: {:.2f} us (min {:.2f}, warm {:.2f}), floor {:.2f} us, {:.0f} GB/s = {:.1f}% of copy; "
                 "host {:.2f} us/call; first call {:.0f} ms\n",
                 done, configs.size(), config_name(c), m.device.median, m.device.min, m.warm.median, m.floor_us, m.gbps,
                 m.pct_roofline, m.host.median, m.first_call_ms);
    }
    dp.reset();
    save();
  }
  pool.stop();
  for (Measured& m : results)
    if (m.status == "skipped" && m.error.empty())
      m.error = gpu_hung() ? "the GPU hung" : stopped ? "stopped after an earlier failure" : "time limit";
  const bool timed_out =
      std::any_of(results.begin(), results.end(), [](const Measured& m) { return m.error == "time limit"; });
  if (timed_out && rc == kExitOk) {
    rc = kExitTimeLimit;
    run_status = "time_limit";
  }
  if (run_status == "running") run_status = rc == kExitOk ? "ok" : "failed";
  if (timed_out) fmt::print(stderr, "kdajit_bench: time limit of {:.0f} s reached: partial results\n", o.time_limit_s);
  print_table(b, configs, results);
  save();
  if (!o.json_path.empty()) fmt::print("json: {}\n", o.json_path);
  fmt::print("total: {:.1f} s, exit {}\n", elapsed(), rc);
  *workers_busy = pool.busy();
  return rc;
}

}  // namespace
}  // namespace kdajit::bench

int main(int argc, char** argv) {
  using namespace kdajit::bench;
  const auto t_start = Clock::now();
  Options o;
  CLI::App app{"kdajit_bench: device time, bandwidth and host cost of kdajit's decode kernels"};
  app.add_option("--op", o.op, "single | packed | all")->capture_default_str();
  app.add_option("--heads", o.heads, "head counts (default: single 8,16,32,64 (+96 f32 R 1,128); packed 16,64)")
      ->delimiter(',');
  app.add_option("--rows", o.rows, "R for the single op, N for the packed op (default: 1,8,32,128,512 / 1,8,32,128)")
      ->delimiter(',');
  app.add_option("--state", o.states, "state dtypes: f32,bf16 (default both)")->delimiter(',');
  app.add_option("--conv", o.conv, "conv_state layout: sd | ds")->capture_default_str();
  app.add_option("--tokens", o.tokens, "T of the packed op (every sequence L = T)")->capture_default_str();
  app.add_option("--iters", o.iters, "timed graph replays per configuration")->capture_default_str();
  app.add_option("--host-calls", o.host_calls, "decode calls of the host-cost loop")->capture_default_str();
  app.add_option("--json", o.json_path, "write every number to this JSON file");
  app.add_option("--commit", o.commit, "git commit recorded in the JSON");
  app.add_option("--device", o.device, "CUDA device ordinal")->capture_default_str();
  app.add_option("--cache-dir", o.cache_dir,
                 "kernel cache (default: KDAJIT_CACHE_DIR, $XDG_CACHE_HOME/kdajit, ~/.cache/kdajit)");
  app.add_option("--time-limit", o.time_limit_s, "seconds after which remaining configurations are skipped (exit 3)")
      ->capture_default_str();
  app.add_option("--gpu-timeout", o.gpu_timeout_s, "seconds any one wait for the GPU may take before it counts as hung")
      ->capture_default_str();
  app.add_option("--problem-threads", o.gen_threads, "threads building host problems (0: cores - 2)")
      ->capture_default_str();
  app.add_option("--flush-mib", o.flush_mib, "L2 flush buffer (at least 4x the L2 is used)")->capture_default_str();
  app.add_option("--copy-mib", o.copy_mib, "size of the roofline copy")->capture_default_str();
  app.add_option("--copy-reps", o.copy_reps, "timed roofline copies")->capture_default_str();
  app.add_flag("--list", o.list, "print the configurations and bytes per call, then exit (no GPU needed)");
  app.add_flag("-v,--verbose", o.verbose, "kdajit runtime log at info level");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  auto bad = [](const std::string& msg) {
    std::fprintf(stderr, "kdajit_bench: %s\n", msg.c_str());
    return kExitUsage;
  };
  if (o.iters < 1 || o.iters > 100000) return bad(fmt::format("--iters: expected 1..100000, got {}", o.iters));
  if (o.host_calls < 1 || o.host_calls > 1000000)
    return bad(fmt::format("--host-calls: expected 1..1000000, got {}", o.host_calls));
  if (o.copy_reps < 1 || o.copy_reps > 1000)
    return bad(fmt::format("--copy-reps: expected 1..1000, got {}", o.copy_reps));
  if (o.copy_mib < 1 || o.copy_mib > 65536)
    return bad(fmt::format("--copy-mib: expected 1..65536, got {}", o.copy_mib));
  if (o.flush_mib < 1 || o.flush_mib > 65536)
    return bad(fmt::format("--flush-mib: expected 1..65536, got {}", o.flush_mib));
  if (!(o.time_limit_s > 0)) return bad(fmt::format("--time-limit: expected > 0 s, got {}", o.time_limit_s));
  if (!(o.gpu_timeout_s > 0)) return bad(fmt::format("--gpu-timeout: expected > 0 s, got {}", o.gpu_timeout_s));
  if (o.gen_threads < 0 || o.gen_threads > 1024)
    return bad(fmt::format("--problem-threads: expected 0..1024, got {}", o.gen_threads));
  auto configs = make_configs(o);
  if (!configs) return bad(configs.error().message);
  if (configs->empty()) return bad("no configuration selected");

  if (o.list) {
    fmt::print("{:<32} {:>14}\n", "configuration", "bytes/call");
    for (const Config& c : *configs) fmt::print("{:<32} {:>14}\n", config_name(c), bytes_per_call(c));
    const auto fams = make_families(*configs);
    size_t host = 0;
    for (const auto& f : fams) host += f.host_bytes;
    fmt::print("{} configurations, {} problems, {:.1f} GiB of host buffers in all\n", configs->size(), fams.size(),
               static_cast<double>(host) / 1073741824.0);
    return 0;
  }

  int rc = kExitFailed;
  bool workers_busy = false;
  {
    // The hard limit leaves room for the table, the JSON and a slow last wait.
    Watchdog watchdog(o.time_limit_s + o.gpu_timeout_s + 10);
    Bench b;
    b.opt = o;
    rc = run(b, *configs, t_start, &workers_busy);
    if (gpu_hung() || workers_busy) {
      // Nothing more to wait for: a hung GPU would block teardown, and a worker
      // inside Problem::make cannot be stopped.
      std::fflush(nullptr);
      std::_Exit(rc);
    }
  }
  return rc;
}
