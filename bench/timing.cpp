#include "timing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "driver.hpp"

namespace kdajit::bench {

Graph::~Graph() {
  if (exec) (void)cudaGraphExecDestroy(exec);
  if (graph) (void)cudaGraphDestroy(graph);
}

Result<std::unique_ptr<Graph>> capture_graph(cudaStream_t s, double timeout_s, const std::function<Status()>& enqueue) {
  auto g = std::make_unique<Graph>();
  BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const Status queued = enqueue();
  const cudaError_t ended = cudaStreamEndCapture(s, &g->graph);  // always: leaves the stream out of capture
  KDAJIT_TRY(queued);
  BENCH_CUDA(ended);
  BENCH_CUDA(cudaGraphInstantiate(&g->exec, g->graph, 0));
  BENCH_CUDA(cudaGraphLaunch(g->exec, s));  // the first launch uploads the graph
  KDAJIT_TRY(wait_stream(s, timeout_s, "first graph replay"));
  return g;
}

Result<Summary> time_graph(TimingContext& t, const Graph& g, bool flush) {
  const cudaStream_t s = t.stream;
  auto replay = [&](int) { return cuda_status(cudaGraphLaunch(g.exec, s), "cudaGraphLaunch"); };
  // A different nonzero byte each time: nothing can treat the fill as unchanged or as zeros.
  auto before = [&](int i) {
    if (!flush) return Status{};
    return cuda_status(cudaMemsetAsync(t.flush->get(), i % 255 + 1, t.flush->bytes(), s), "cudaMemsetAsync(L2 flush)");
  };
  int timeouts = 0;
  KDAJIT_TRY_ASSIGN(std::vector<double> us,
                    time_on_stream(s, *t.events, t.iters, t.timeout_s, t.gating, &timeouts, before, replay));
  if (timeouts > 0) {
    t.gating = false;
    t.gate_timeouts += timeouts;
  }
  return summarize(std::move(us));
}

Status BareLaunch::launch(cudaStream_t s) {
  KDAJIT_TRY_ASSIGN(const DriverApi* f, driver());
  cfg.hStream = reinterpret_cast<CUstream>(s);
  cfg.attrs = cfg.numAttrs > 0 ? &attr : nullptr;  // this object's attribute (it may have been copied)
  BENCH_CU(*f, f->cuLaunchKernelEx(&cfg, fn, params, nullptr));
  return {};
}

Result<BareLaunch> bare_launch_of(const Graph& g) {
  KDAJIT_TRY_ASSIGN(const DriverApi* f, bench_driver());
  size_t n = 0;
  BENCH_CUDA(cudaGraphGetNodes(g.graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) BENCH_CUDA(cudaGraphGetNodes(g.graph, nodes.data(), &n));
  std::vector<cudaGraphNode_t> kernels;
  for (size_t i = 0; i < n; ++i) {
    cudaGraphNodeType type{};
    BENCH_CUDA(cudaGraphNodeGetType(nodes[i], &type));
    if (type == cudaGraphNodeTypeKernel) kernels.push_back(nodes[i]);
  }
  if (kernels.size() != 1 || n != 1)
    return Error(ErrorCode::unsupported,
                 fmt::format("the call captured {} nodes ({} kernels); the bare launch takes exactly one kernel", n,
                             kernels.size()));
  CUDA_KERNEL_NODE_PARAMS kp{};
  BENCH_CU(*f, f->cuGraphKernelNodeGetParams(reinterpret_cast<CUgraphNode>(kernels[0]), &kp));
  if (kp.extra != nullptr) return Error(ErrorCode::unsupported, "the kernel node passes its parameters as `extra`");
  BareLaunch b;
  b.fn = kp.func ? kp.func : reinterpret_cast<CUfunction>(kp.kern);
  if (!b.fn) return Error(ErrorCode::internal, "the kernel node has neither a function nor a kernel handle");
  b.params = kp.kernelParams;
  b.cfg.gridDimX = kp.gridDimX;
  b.cfg.gridDimY = kp.gridDimY;
  b.cfg.gridDimZ = kp.gridDimZ;
  b.cfg.blockDimX = kp.blockDimX;
  b.cfg.blockDimY = kp.blockDimY;
  b.cfg.blockDimZ = kp.blockDimZ;
  b.cfg.sharedMemBytes = kp.sharedMemBytes;
  cudaLaunchAttributeValue cluster{};
  BENCH_CUDA(cudaGraphKernelNodeGetAttribute(kernels[0], cudaLaunchAttributeClusterDimension, &cluster));
  if (cluster.clusterDim.x * cluster.clusterDim.y * cluster.clusterDim.z > 1) {
    b.attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    b.attr.value.clusterDim.x = cluster.clusterDim.x;
    b.attr.value.clusterDim.y = cluster.clusterDim.y;
    b.attr.value.clusterDim.z = cluster.clusterDim.z;
    b.cfg.numAttrs = 1;  // cfg.attrs is pointed at attr by launch()
  }
  return b;
}

int host_loop_calls(int max_calls, double device_us) {
  if (max_calls <= 100 || device_us <= 0) return max_calls;
  return static_cast<int>(std::clamp(2.5e5 / device_us, 100.0, static_cast<double>(max_calls)));
}

Result<HostLoop> host_loop(int calls, cudaStream_t s, double timeout_s, const std::function<Status()>& call) {
  std::vector<double> us;
  us.reserve(static_cast<size_t>(calls));
  Status ok;
  const auto t0 = Clock::now();
  for (int i = 0; i < calls && ok; ++i) {
    const auto c0 = Clock::now();
    ok = call();
    us.push_back(us_between(c0, Clock::now()));
  }
  const auto t1 = Clock::now();
  KDAJIT_TRY(wait_stream(s, timeout_s, "host-cost loop"));
  const auto t2 = Clock::now();
  KDAJIT_TRY(std::move(ok));
  HostLoop h;
  h.calls = calls;
  h.per_call = summarize(std::move(us));
  h.loop_us = us_between(t0, t1) / calls;
  h.throughput_us = us_between(t0, t2) / calls;
  return h;
}

Result<PairedLoops> paired_host_loops(int calls, cudaStream_t s, double timeout_s, const std::function<Status()>& a,
                                      const std::function<Status()>& b) {
  std::vector<double> ua, ub, diff;
  ua.reserve(static_cast<size_t>(calls));
  ub.reserve(static_cast<size_t>(calls));
  diff.reserve(static_cast<size_t>(calls));
  auto timed = [](const std::function<Status()>& f, std::vector<double>& us) {
    const auto c0 = Clock::now();
    Status ok = f();
    us.push_back(us_between(c0, Clock::now()));
    return ok;
  };
  Status ok;
  const auto t0 = Clock::now();
  for (int i = 0; i < calls && ok; ++i) {
    if (i % 2 == 0) {
      ok = timed(a, ua);
      if (ok) ok = timed(b, ub);
    } else {
      ok = timed(b, ub);
      if (ok) ok = timed(a, ua);
    }
    if (ok) diff.push_back(ua.back() - ub.back());
  }
  KDAJIT_TRY(wait_stream(s, timeout_s, "host-cost loop"));
  const auto t2 = Clock::now();
  KDAJIT_TRY(std::move(ok));
  PairedLoops p;
  for (auto [loop, us] : {std::pair{&p.a, &ua}, std::pair{&p.b, &ub}}) {
    double total = 0;
    for (double u : *us) total += u;
    loop->calls = calls;
    loop->loop_us = total / calls;
    loop->throughput_us = us_between(t0, t2) / (2.0 * calls);
    loop->per_call = summarize(std::move(*us));
  }
  p.a_minus_b = summarize(std::move(diff));
  return p;
}

}  // namespace kdajit::bench
