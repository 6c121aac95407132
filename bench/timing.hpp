// The timing method shared by every number of the bench: work captured into a
// CUDA graph, replayed `iters` times, each replay between its own event pair,
// with an L2 flush (a memset of a buffer several times the L2) before each
// replay outside the events; the median of the replays. Plus the host-side
// loops (per-call wall time) and the bare launch of a captured kernel node.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <functional>
#include <memory>

#include "bench_cuda.hpp"

namespace kdajit::bench {

// Owns a captured graph and its executable.
class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

// Captures what `enqueue` puts on `s` (thread-local capture mode), instantiates
// it and replays it once (uploads it), waiting for that replay.
Result<std::unique_ptr<Graph>> capture_graph(cudaStream_t s, double timeout_s, const std::function<Status()>& enqueue);

// What every timed loop needs.
struct TimingContext {
  cudaStream_t stream = nullptr;
  const EventPairs* events = nullptr;
  const DeviceBuffer* flush = nullptr;
  int iters = 200;
  double timeout_s = 20;
  bool gating = true;     // cleared for the rest of the run once a gate opens by itself
  int gate_timeouts = 0;  // gates that opened by themselves, in all
};

// Replays with (flush = true) or without the L2 flush; per-replay microseconds summarised.
Result<Summary> time_graph(TimingContext& t, const Graph& g, bool flush);

// One kernel launch read back from a captured graph's only kernel node: the same
// function, grid, block, shared memory, cluster dimension and parameter block
// (owned by the graph, which must outlive it).
struct BareLaunch {
  CUfunction fn = nullptr;
  CUlaunchConfig cfg{};
  CUlaunchAttribute attr{};
  void** params = nullptr;
  Status launch(cudaStream_t s);
};
Result<BareLaunch> bare_launch_of(const Graph& g);

// Calls of a host-cost loop: max_calls, cut for slow kernels so that the GPU work
// the loop queues stays near 0.25 s, but at least 100.
int host_loop_calls(int max_calls, double device_us);

struct HostLoop {
  Summary per_call;         // wall time of each call
  double loop_us = 0;       // loop wall time / calls
  double throughput_us = 0; // (loop + the final wait) / calls
  int calls = 0;
};
// `calls` back-to-back calls of `call` (each timed), one wait at the end.
Result<HostLoop> host_loop(int calls, cudaStream_t s, double timeout_s, const std::function<Status()>& call);

// `calls` calls each of `a` and `b` on one stream, interleaved (a b, b a, a b,
// ...: neither always runs first), each timed; one wait at the end. The paired
// difference a - b of each round is what a host-cost comparison needs: drift of
// the host (clock, other tenants) hits both calls of a round alike.
struct PairedLoops {
  HostLoop a, b;   // per-call times; loop_us: the calls' mean; throughput: (loop + wait) / (2 calls)
  Summary a_minus_b;
};
Result<PairedLoops> paired_host_loops(int calls, cudaStream_t s, double timeout_s, const std::function<Status()>& a,
                                      const std::function<Status()>& b);

}  // namespace kdajit::bench
