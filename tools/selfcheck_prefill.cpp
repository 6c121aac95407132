#include "selfcheck_prefill.hpp"

#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "kdajit/chunk_problem.hpp"
#include "kdajit/device_problem.hpp"
#include "kdajit/problem.hpp"
#include "kdajit/reference.hpp"
#include "kdajit/routes.hpp"
#include "kdajit/rng.hpp"
#include "kdajit/runtime/device/driver_api.hpp"

namespace kdajit::cli {

namespace {

using ref::Problem;
using ref::Tensor;

// Device copies of the call's int32 metadata and its workspace (the tensors are a DeviceProblem's).
class DeviceInts {
 public:
  explicit DeviceInts(const DriverApi& api) : api_(api) {}
  ~DeviceInts() {
    for (CUdeviceptr p : ptrs_) api_.cuMemFree(p);
  }
  DeviceInts(const DeviceInts&) = delete;
  DeviceInts& operator=(const DeviceInts&) = delete;
  Result<void*> upload(const std::vector<int32_t>& v, const char* what) {
    CUdeviceptr d = 0;
    KDAJIT_TRY(cu_check(api_, api_.cuMemAlloc(&d, v.size() * 4), fmt::format("cuMemAlloc({})", what)));
    ptrs_.push_back(d);
    KDAJIT_TRY(cu_check(api_, api_.cuMemcpyHtoD(d, v.data(), v.size() * 4), fmt::format("cuMemcpyHtoD({})", what)));
    return reinterpret_cast<void*>(d);
  }
  // `bytes` of 0xFF (route twopass's workspace: units that hold no chunk).
  Result<void*> poisoned(int64_t bytes, const char* what) {
    CUdeviceptr d = 0;
    KDAJIT_TRY(cu_check(api_, api_.cuMemAlloc(&d, static_cast<size_t>(bytes)), fmt::format("cuMemAlloc({})", what)));
    ptrs_.push_back(d);
    const std::vector<unsigned char> poison(static_cast<size_t>(bytes), 0xFF);
    KDAJIT_TRY(cu_check(api_, api_.cuMemcpyHtoD(d, poison.data(), poison.size()), fmt::format("cuMemcpyHtoD({})", what)));
    return reinterpret_cast<void*>(d);
  }

 private:
  const DriverApi& api_;
  std::vector<CUdeviceptr> ptrs_;
};

bool slot_written(const ref::PrefillMeta& h, int64_t slot) {
  for (size_t n = 0; n < h.slots.size(); ++n)
    if (h.slots[n] == slot && h.qsl[n + 1] > h.qsl[n]) return true;
  return false;
}

}  // namespace

std::vector<int> prefill_check_lengths(uint64_t seed) {
  ref::Rng gen(seed, 0);  // the same lengths with any C++ library
  auto draw = [&](int lo, int hi) { return lo + static_cast<int>(gen.below(hi - lo + 1)); };
  return {draw(65, 200), 0, draw(1, 63), draw(1, 300)};
}

Result<PrefillCheck> check_prefill(Runtime::Impl& rt, const KernelKey& key, uint64_t seed) {
  const std::vector<int> lens = prefill_check_lengths(seed);
  const auto N = static_cast<int64_t>(lens.size());
  const int64_t total = std::accumulate(lens.begin(), lens.end(), int64_t{0});
  ref::PrefillMeta h;
  h.qsl.push_back(0);
  for (int64_t n = 0; n < N; ++n) {
    h.slots.push_back(static_cast<int32_t>(n + 1));
    h.qsl.push_back(h.qsl.back() + lens[static_cast<size_t>(n)]);
    h.initial.push_back(n == 0 ? 0 : 1);
  }
  ref::ProblemSpec spec;
  spec.op = KDAJIT_OP_SINGLE;
  spec.heads = key.heads;
  spec.state_dtype = key.state == StateDtype::f32 ? KDAJIT_DTYPE_F32 : KDAJIT_DTYPE_BF16;
  spec.conv = key.conv == ConvLayout::sd ? KDAJIT_CONV_SD : KDAJIT_CONV_DS;
  spec.gate = key.gate == Gate::bounded ? KDAJIT_GATE_BOUNDED : KDAJIT_GATE_SOFTPLUS;
  spec.rows = static_cast<int>(total);
  spec.null_rows = static_cast<int>(total);  // the problem's own slots: unused
  spec.num_slots = static_cast<int>(N + 3);  // the null slot, one per sequence, two spares nobody writes
  spec.row_pad = 8;
  spec.slot_pad = 8;
  spec.seed = seed;
  KDAJIT_TRY_ASSIGN(Problem made, Problem::make(spec));
  Problem expected = made, got = std::move(made);
  KDAJIT_TRY(ref::prefill(ref::prefill_args(expected, h)));

  {
    KDAJIT_TRY_ASSIGN(auto dev, ref::DeviceProblem::upload(got));
    KDAJIT_TRY_ASSIGN(const DriverApi* api, driver());
    DeviceInts ints(*api);
    kdajit_prefill_args_t a{};  // no oob_counter, max_seq_len 0 (T_total)
    a.struct_size = sizeof a;
    ref::copy_shared_fields(dev->args(), a);
    KDAJIT_TRY_ASSIGN(void* slots, ints.upload(h.slots, "state_indices"));
    KDAJIT_TRY_ASSIGN(void* qsl, ints.upload(h.qsl, "query_start_loc"));
    KDAJIT_TRY_ASSIGN(void* initial, ints.upload(h.initial, "has_initial_state"));
    a.state_indices = dense_tensor_view(slots, KDAJIT_DTYPE_INT32, {N});
    a.query_start_loc = dense_tensor_view(qsl, KDAJIT_DTYPE_INT32, {N + 1});
    a.has_initial_state = dense_tensor_view(initial, KDAJIT_DTYPE_INT32, {N});
    // Every call brings route twopass's workspace (the other routes ignore it).
    a.workspace_bytes = twopass_workspace_bytes(N, total, key.heads);
    KDAJIT_TRY_ASSIGN(a.workspace, ints.poisoned(a.workspace_bytes, "workspace"));
    KDAJIT_TRY(rt.prefill(a, nullptr));
    KDAJIT_TRY(dev->download(got));
  }

  PrefillCheck c;
  const ref::Tolerances tol = ref::chunked_tolerances();  // §8's output limits, §10's state limits
  auto fail = [&](std::string m) {
    if (c.message.empty()) c.message = std::move(m);
  };
  // Output: every row belongs to a live sequence here.
  const kdajit_tensor_t& ov = expected.view(Tensor::output);
  const kdajit_tensor_t& og = got.view(Tensor::output);
  double num = 0, den = 0;
  for (int64_t r = 0; r < total; ++r)
    for (int64_t hh = 0; hh < key.heads; ++hh)
      for (int64_t i = 0; i < kHeadDim; ++i) {
        const double e = ref::load(ov, {r, hh, i}), g = ref::load(og, {r, hh, i});
        if (!tol.output_within(g, e))
          fail(fmt::format("output[{}, {}, {}]: got {}, expected {}", r, hh, i, g, e));
        num += (g - e) * (g - e);
        den += e * e;
      }
  c.output_rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (!(c.output_rel_l2 <= tol.output_rel_l2))
    fail(fmt::format("output: rel L2 {:.3e} > {:.0e}", c.output_rel_l2, tol.output_rel_l2));

  // State: the live sequences' slots within the rel L2 limit; every other slot byte for byte.
  const kdajit_tensor_t& sv = expected.view(Tensor::state);
  const kdajit_tensor_t& sg = got.view(Tensor::state);
  const double state_limit = tol.state_rel_l2(key.state == StateDtype::bf16);
  num = den = 0;
  for (int64_t s = 0; s < expected.num_slots(); ++s) {
    const bool live = slot_written(h, s);
    for (int64_t hh = 0; hh < key.heads; ++hh)
      for (int64_t v = 0; v < kHeadDim; ++v)
        for (int64_t k = 0; k < kHeadDim; ++k) {
          const double e = ref::load(sv, {s, hh, v, k}), g = ref::load(sg, {s, hh, v, k});
          if (live) {
            if (!std::isfinite(g)) fail(fmt::format("state[{}, {}, {}, {}]: got {}", s, hh, v, k, g));
            num += (g - e) * (g - e);
            den += e * e;
          } else if (std::memcmp(&e, &g, sizeof e) != 0 && !(std::isnan(e) && std::isnan(g))) {
            fail(fmt::format("state[{}, {}, {}, {}]: slot {} is not written by this call, but changed", s, hh, v, k, s));
          }
        }
  }
  c.state_rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (!(c.state_rel_l2 <= state_limit)) fail(fmt::format("state: rel L2 {:.3e} > {:.0e}", c.state_rel_l2, state_limit));
  // conv_state: exact (raw bf16 copies of x); padding included.
  if (expected.bytes(Tensor::conv_state) != got.bytes(Tensor::conv_state)) fail("conv_state: differs from the reference");
  if (expected.bytes(Tensor::output).size() == got.bytes(Tensor::output).size()) {
    // Output row padding must stay as it was (NaN patterns).
    const auto& eb = expected.bytes(Tensor::output);
    const auto& gb = got.bytes(Tensor::output);
    const int64_t row = og.strides[0] * 2, used = key.heads * kHeadDim * 2;
    for (int64_t r = 0; r < total && row > used; ++r)
      if (std::memcmp(eb.data() + r * row + used, gb.data() + r * row + used, static_cast<size_t>(row - used)) != 0) {
        fail(fmt::format("output: row {}'s padding was written", r));
        break;
      }
  }
  c.pass = c.message.empty();
  return c;
}

Result<PrefillCheck> check_chunk(Runtime::Impl& rt, const KernelKey& key, uint64_t seed) {
  ref::ChunkSpec s;
  s.heads = key.heads;
  s.state = key.state == StateDtype::f32 ? KDAJIT_DTYPE_F32 : KDAJIT_DTYPE_BF16;
  s.gate = key.gate == Gate::bounded ? KDAJIT_GATE_BOUNDED : KDAJIT_GATE_SOFTPLUS;
  const std::vector<int> lens = prefill_check_lengths(seed);
  s.lengths.assign(lens.begin(), lens.end());
  s.seed = seed;
  const ref::ChunkProblem input = ref::ChunkProblem::make(s);
  ref::ChunkProblem expected = input, got = input;
  KDAJIT_TRY(ref::chunk(expected.args));
  {
    KDAJIT_TRY_ASSIGN(auto dev, ref::DeviceChunk::upload(got));
    KDAJIT_TRY(rt.chunk(dev->args(), nullptr));
    KDAJIT_TRY(dev->download(got));
  }
  const ref::ChunkReport r = ref::compare_chunk(expected, got);
  PrefillCheck c;
  c.pass = r.pass;
  c.output_rel_l2 = r.output_rel_l2;
  c.state_rel_l2 = r.state_rel_l2;
  c.message = r.message;
  return c;
}

}  // namespace kdajit::cli
