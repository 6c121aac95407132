// GPU tests of the prefill op (docs/DESIGN.md "Prefill") against the f64
// reference ref::prefill: every route on fresh random data (docs/CONTRACT.md
// §8: poisoned outputs, NaN padding in padded rows and slots), ragged batches
// with empty, null-slot, out-of-range and malformed sequences, the preset head
// counts, a long prompt, and the two properties users rely on: a prefill equals
// the single decode op token by token, and a prefill split into two calls
// equals one call. The reference runs once per problem and serves every route.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dynamic_tests.hpp"
#include "gpu_harness.hpp"
#include "kdajit/kernel_key.hpp"
#include "kdajit/routes.hpp"

using namespace kdajit;
using kdajit::ref::Problem;
using kdajit::ref::Tensor;
// The harness: make_runtime, runtime, runtime_for, stream, device_arch, DeviceProblem.
using namespace kdajit::test;

namespace {

constexpr int kChunk = 64;  // the selector's routes' t: tokens per chunk
// A route's t (the route table's: 16 for rowcta16 and pipe16).
int route_chunk(std::string_view route) { return kdajit::route_chunk(*parse_field<Route>(route)); }
// The prefill op's routes, by name (options.route takes the name): every row of the table that serves it.
const std::vector<std::string_view> kPrefillRoutes = route_names(Op::prefill);

std::string_view dtype_name(kdajit_dtype_t d) { return d == KDAJIT_DTYPE_F32 ? "f32" : "bf16"; }
std::string_view conv_name(kdajit_conv_layout_t c) { return c == KDAJIT_CONV_SD ? "sd" : "ds"; }
std::string_view gate_name(kdajit_gate_t g) { return g == KDAJIT_GATE_BOUNDED ? "bounded" : "softplus"; }

// ---- Problems ------------------------------------------------------------------

enum class Slot { live, null, oob };

struct SeqSpec {
  int len = 0;
  Slot slot = Slot::live;
  int initial = 1;  // has_initial_state[n]
};

struct PrefillSpec {
  int heads = 16;
  kdajit_dtype_t state_dtype = KDAJIT_DTYPE_F32;
  kdajit_conv_layout_t conv = KDAJIT_CONV_SD;
  kdajit_gate_t gate = KDAJIT_GATE_BOUNDED;
  int conv_taps = 3;  // K of conv_state
  std::vector<SeqSpec> seqs;
  bool initial_empty = false;  // has_initial_state empty: every sequence starts from its slot
  int rows_after = 0;          // rows past qsl[N]
  // query_start_loc as given, with total_rows rows (malformed ranges); empty:
  // the lengths in order from row 0, then rows_after.
  std::vector<int32_t> qsl;
  int total_rows = 0;
  float norm_eps = 1e-5f;
  // Elements past the end of each row of the row tensors; odd: the output
  // gate's rows are not 16-byte aligned, so route twopass's step 6 loads it
  // instead of staging it.
  int row_pad = 8;
  // A strong decay: the bounded gate's bound, and a shift added to every A_log
  // (A = exp(A_log)) after the §8 draw.
  float lower_bound = -5.f;
  float a_log_shift = 0.f;
  uint64_t seed = 1;

  std::string key_name(std::string_view route) const {
    return fmt::format("kda_prefill.h{}.state_{}.conv_{}.t{}.gate_{}.route_{}.{}", heads, dtype_name(state_dtype),
                       conv_name(conv), route_chunk(route), gate_name(gate), route, to_string(device_arch()));
  }
};

// One prefill call on the host: the tensors and the call's metadata
// (ref::PrefillMeta; initial empty: has_initial_state is passed empty).
struct PrefillProblem {
  Problem tensors;
  ref::PrefillMeta meta;
  int32_t oob_sequences = 0;  // sequences whose slot is >= S (what oob_counter counts)

  ref::PrefillArgs host_args() const { return ref::prefill_args(tensors, meta); }

  void run_reference() {
    Status s = ref::prefill(host_args());
    INFO((s ? std::string() : s.error().message));
    REQUIRE(s.ok());
  }

  ref::WritePlan plan() {
    auto p = ref::plan_prefill_writes(host_args());
    if (!p) FAIL("plan_prefill_writes: " << p.error().message);
    return std::move(p).value();
  }

  // Row r of the output, as bytes (row padding excluded).
  std::vector<std::byte> output_row(int64_t r) const {
    const kdajit_tensor_t& v = tensors.view(Tensor::output);
    const auto& b = tensors.bytes(Tensor::output);
    const auto begin = b.begin() + r * v.strides[0] * 2;
    return {begin, begin + v.shape[1] * v.shape[2] * 2};
  }
  void set_output_row(int64_t r, const std::vector<std::byte>& row) {
    const kdajit_tensor_t& v = tensors.view(Tensor::output);
    std::copy(row.begin(), row.end(), tensors.bytes(Tensor::output).begin() + r * v.strides[0] * 2);
  }
};

PrefillProblem make_prefill(const PrefillSpec& s) {
  const auto N = static_cast<int64_t>(s.seqs.size());
  int64_t rows = s.total_rows;
  if (s.qsl.empty()) {
    rows = s.rows_after;
    for (const auto& q : s.seqs) rows += q.len;
  }
  int64_t live = 0;
  for (const auto& q : s.seqs) live += q.slot == Slot::live;
  const int64_t S = live + 4;  // the null slot, one per live sequence, three spares nobody writes

  ref::ProblemSpec ps;
  ps.op = KDAJIT_OP_SINGLE;
  ps.heads = s.heads;
  ps.state_dtype = s.state_dtype;
  ps.conv = s.conv;
  ps.gate = s.gate;
  ps.conv_taps = s.conv_taps;
  ps.rows = static_cast<int>(rows);
  ps.null_rows = static_cast<int>(rows);  // the single op's slots: none live, so S stays small
  ps.num_slots = static_cast<int>(S);
  ps.norm_eps = s.norm_eps;
  ps.lower_bound = s.lower_bound;
  ps.row_pad = s.row_pad;
  ps.slot_pad = 8;
  ps.seed = s.seed;
  auto made = Problem::make(ps);
  if (!made) FAIL("Problem::make: " << made.error().message);

  PrefillProblem p{std::move(made).value(), {}, 0};
  if (s.a_log_shift != 0.f) {
    auto& a_log = p.tensors.bytes(Tensor::A_log);
    for (size_t i = 0; i + sizeof(float) <= a_log.size(); i += sizeof(float)) {
      float v;
      std::memcpy(&v, a_log.data() + i, sizeof v);
      v += s.a_log_shift;
      std::memcpy(a_log.data() + i, &v, sizeof v);
    }
    p.tensors.snapshot();
  }
  // Live slots from a shuffled pool of 1..S-1; null ones 0, -1, INT32_MIN;
  // out-of-range ones S, S+1, INT32_MAX.
  std::vector<int32_t> pool(static_cast<size_t>(S - 1));
  std::iota(pool.begin(), pool.end(), 1);
  std::mt19937_64 rng(s.seed * 7919 + 13);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  int nulls = 0, oobs = 0;
  for (const auto& q : s.seqs) {
    static constexpr int32_t kNull[] = {0, -1, INT32_MIN};
    const int32_t oob = oobs % 3 == 2 ? INT32_MAX : static_cast<int32_t>(S + oobs % 3);
    switch (q.slot) {
      case Slot::live: p.meta.slots.push_back(pool[next++]); break;
      case Slot::null: p.meta.slots.push_back(kNull[nulls++ % 3]); break;
      case Slot::oob: p.meta.slots.push_back(oob); ++oobs; break;
    }
  }
  if (s.qsl.empty()) {
    p.meta.qsl.push_back(0);
    for (const auto& q : s.seqs) p.meta.qsl.push_back(p.meta.qsl.back() + q.len);
  } else {
    p.meta.qsl = s.qsl;
    REQUIRE(static_cast<int64_t>(p.meta.qsl.size()) == N + 1);
  }
  for (int32_t slot : p.meta.slots) p.oob_sequences += slot >= S;
  if (!s.initial_empty)
    for (const auto& q : s.seqs) p.meta.initial.push_back(q.initial);
  return p;
}

// ---- Device side ---------------------------------------------------------------

// An int32 vector in device memory (nothing allocated when empty).
class DeviceInts {
 public:
  explicit DeviceInts(const std::vector<int32_t>& v) : n_(v.size()) {
    if (n_) KDAJIT_CUDA_CHECK(cudaMalloc(&ptr_, n_ * sizeof(int32_t)));
    upload(v);
  }
  ~DeviceInts() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceInts(const DeviceInts&) = delete;
  DeviceInts& operator=(const DeviceInts&) = delete;
  void upload(const std::vector<int32_t>& v) {
    REQUIRE(v.size() == n_);
    if (n_) KDAJIT_CUDA_CHECK(cudaMemcpy(ptr_, v.data(), n_ * sizeof(int32_t), cudaMemcpyHostToDevice));
  }
  std::vector<int32_t> download() const {
    std::vector<int32_t> v(n_);
    if (n_) KDAJIT_CUDA_CHECK(cudaMemcpy(v.data(), ptr_, n_ * sizeof(int32_t), cudaMemcpyDeviceToHost));
    return v;
  }
  kdajit_tensor_t view() const {
    return dense_tensor_view(n_ ? ptr_ : nullptr, KDAJIT_DTYPE_INT32, {static_cast<int64_t>(n_)});
  }

 private:
  size_t n_;
  int32_t* ptr_ = nullptr;
};

// Route twopass's workspace for a call's sizes, 0xFF bytes (units that hold
// no chunk) until a call writes it.
class DeviceWorkspace {
 public:
  DeviceWorkspace(int64_t num_seqs, int64_t rows, int64_t heads) : bytes_(twopass_workspace_bytes(num_seqs, rows, heads)) {
    if (bytes_ > 0) {
      KDAJIT_CUDA_CHECK(cudaMalloc(&ptr_, static_cast<size_t>(bytes_)));
      KDAJIT_CUDA_CHECK(cudaMemset(ptr_, 0xFF, static_cast<size_t>(bytes_)));
    }
  }
  ~DeviceWorkspace() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceWorkspace(const DeviceWorkspace&) = delete;
  DeviceWorkspace& operator=(const DeviceWorkspace&) = delete;
  void* data() const { return ptr_; }
  int64_t bytes() const { return ptr_ ? bytes_ : 0; }

 private:
  int64_t bytes_;
  void* ptr_ = nullptr;
};

// Device copies of a prefill problem's tensors and metadata, and the call's
// arguments pointing at them, with a workspace for route twopass (every call
// gets it; the other routes ignore it).
class DevicePrefill {
 public:
  explicit DevicePrefill(PrefillProblem& p)
      : dev_(p.tensors),
        slots_(p.meta.slots),
        qsl_(p.meta.qsl),
        initial_(p.meta.initial),
        empty_initial_(p.meta.initial.empty()),
        workspace_(static_cast<int64_t>(p.meta.slots.size()), p.tensors.rows(), p.tensors.heads()) {
    KDAJIT_CUDA_CHECK(cudaDeviceSynchronize());  // the metadata copies land before any launch
  }

  // Another call's metadata (same N) on the same device tensors.
  void set_metadata(const PrefillProblem& p) {
    slots_.upload(p.meta.slots);
    qsl_.upload(p.meta.qsl);
    if (!empty_initial_) initial_.upload(p.meta.initial);
    KDAJIT_CUDA_CHECK(cudaDeviceSynchronize());
  }

  PrefillArgs args(int64_t max_seq_len = 0, int32_t* oob_counter = nullptr) const {
    PrefillArgs a = default_prefill_args();
    ref::copy_shared_fields(dev_.args(), a);
    a.state_indices = slots_.view();
    a.has_initial_state = initial_.view();
    a.query_start_loc = qsl_.view();
    a.max_seq_len = max_seq_len;
    a.oob_counter = oob_counter;
    a.workspace = workspace_.data();
    a.workspace_bytes = workspace_.bytes();
    return a;
  }

  // The written tensors into p; the metadata must still be p's (inputs are read only).
  void download(PrefillProblem& p) {
    dev_.download(p.tensors);
    CHECK(slots_.download() == p.meta.slots);
    CHECK(qsl_.download() == p.meta.qsl);
    CHECK(initial_.download() == p.meta.initial);
  }

  test::DeviceProblem& tensors() { return dev_; }

 private:
  test::DeviceProblem dev_;
  DeviceInts slots_, qsl_, initial_;
  bool empty_initial_;
  DeviceWorkspace workspace_;
};

Outcome launch(Runtime& rt, const PrefillArgs& args) {
  return rt.prefill(args, reinterpret_cast<kdajit_stream_t>(stream()));
}

// A device int32 counter, zeroed on the test stream.
struct Counter {
  int32_t* ptr = nullptr;
  Counter() {
    KDAJIT_CUDA_CHECK(cudaMalloc(&ptr, sizeof(int32_t)));
    KDAJIT_CUDA_CHECK(cudaMemsetAsync(ptr, 0, sizeof(int32_t), stream()));
  }
  ~Counter() { cudaFree(ptr); }
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;
  int32_t value() const {
    int32_t v = -1;
    KDAJIT_CUDA_CHECK(cudaMemcpy(&v, ptr, sizeof v, cudaMemcpyDeviceToHost));
    return v;
  }
};

void check_report(const ref::CompareReport& rep, const std::string& what) {
  std::string failures;
  for (const auto& f : rep.failures) failures += "\n  " + f;
  INFO(what << ": " << rep.summary() << failures);
  CHECK(rep.pass);
}

// Runs got's call on the device with rt (got: a copy of the problem that
// `expected` ran the reference on) and checks it against expected: §8 with the
// prefill's state limits, every untouched byte, the inputs, the out-of-range
// count. route: the forced route, whose key the call must name. Output rows
// [undefined.first, undefined.second) lie in two live ranges (no defined
// value): the comparison takes them from got. Returns got after the call.
PrefillProblem run_and_compare(Runtime& rt, PrefillProblem& expected, PrefillProblem got, const std::string& what,
                               int64_t max_seq_len = 0, const PrefillSpec* spec = nullptr,
                               std::string_view route = {}, std::pair<int64_t, int64_t> undefined = {0, 0}) {
  INFO(what);
  DevicePrefill dev(got);
  Counter oob;
  const PrefillArgs args = dev.args(max_seq_len, oob.ptr);
  if (spec) {
    std::string key;
    Outcome k = rt.selected_prefill_key(args, reinterpret_cast<kdajit_stream_t>(stream()), &key);
    INFO(k.message);
    REQUIRE(k.ok());
    CHECK(key == spec->key_name(route));
  }
  Outcome o = launch(rt, args);
  INFO(o.message);
  REQUIRE(o.ok());
  dev.download(got);
  CHECK(oob.value() == got.oob_sequences);
  if (undefined.first < undefined.second) {
    PrefillProblem want = expected;
    for (int64_t r = undefined.first; r < undefined.second; ++r) want.set_output_row(r, got.output_row(r));
    check_report(ref::compare(want.tensors, got.tensors, want.plan(), ref::chunked_tolerances()), what);
  } else {
    check_report(ref::compare(expected.tensors, got.tensors, expected.plan(), ref::chunked_tolerances()), what);
  }
  return got;
}

// One problem, the reference once, then each route forced.
void check_routes(const PrefillSpec& spec, const std::vector<std::string_view>& routes) {
  PrefillProblem p = make_prefill(spec);
  PrefillProblem expected = p;
  expected.run_reference();
  for (std::string_view route : routes)
    run_and_compare(runtime_for(route), expected, p, spec.key_name(route), 0, &spec, route);
}

// Lengths 0, 1, 63, 64, 65 (one chunk and its neighbours) and 1000 (many chunks,
// a partial last one), with some starting from zero state; a null slot, an
// out-of-range slot, rows past qsl[N].
std::vector<SeqSpec> ragged_batch() {
  return {{65, Slot::live, 0}, {0, Slot::live, 1}, {1000, Slot::live, 1}, {7, Slot::null, 1},
          {1, Slot::live, 0},  {64, Slot::live, 1}, {70, Slot::oob, 1},    {63, Slot::live, 0}};
}

PrefillSpec ragged_spec(int heads, kdajit_dtype_t st, kdajit_conv_layout_t cv, kdajit_gate_t g, uint64_t seed) {
  PrefillSpec s;
  s.heads = heads;
  s.state_dtype = st;
  s.conv = cv;
  s.gate = g;
  s.seqs = ragged_batch();
  s.rows_after = 5;
  s.norm_eps = seed % 2 ? 1e-6f : 1e-5f;
  s.seed = seed;
  return s;
}

// One live sequence of `tokens` tokens with an initial state, H = 16.
PrefillSpec one_sequence_spec(int tokens, kdajit_dtype_t st, uint64_t seed) {
  PrefillSpec s;
  s.heads = 16;
  s.state_dtype = st;
  s.seqs = {{tokens, Slot::live, 1}};
  s.seed = seed;
  return s;
}

std::string base_name(const PrefillSpec& s) {
  return fmt::format("kda_prefill.h{}.state_{}.conv_{}.t{}.gate_{}", s.heads, dtype_name(s.state_dtype),
                     conv_name(s.conv), kChunk, gate_name(s.gate));
}

// Every route x state dtype x conv layout x gate at H = 16, one test case each
// (the reference serves the four routes); the preset head counts on rowcta.
const bool registered = [] {
  uint64_t seed = 5000;
  for (auto st : {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16})
    for (auto cv : {KDAJIT_CONV_SD, KDAJIT_CONV_DS})
      for (auto g : {KDAJIT_GATE_BOUNDED, KDAJIT_GATE_SOFTPLUS}) {
        const PrefillSpec s = ragged_spec(16, st, cv, g, seed++);
        test::register_test(base_name(s) + ", every route", "[gpu][prefill]", [s] {
          check_routes(s, kPrefillRoutes);
        });
      }
  for (int h : {8, 32, 64, 12, 24, 48, 96}) {
    const PrefillSpec s = ragged_spec(h, KDAJIT_DTYPE_F32, KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, seed++);
    test::register_test(s.key_name("rowcta"), "[gpu][prefill]", [s] { check_routes(s, {"rowcta"}); });
  }
  return true;
}();

}  // namespace

TEST_CASE("prefill: has_initial_state empty (every sequence starts from its slot), every route", "[gpu][prefill]") {
  PrefillSpec s = ragged_spec(16, KDAJIT_DTYPE_F32, KDAJIT_CONV_DS, KDAJIT_GATE_BOUNDED, 6100);
  s.initial_empty = true;
  check_routes(s, {"rowcta", "split2", "split4", "split8", "twopass"});
}

TEST_CASE("prefill: route twopass at P = 8, 4, 2 and 1 state pass CTAs per (sequence, head)", "[gpu][prefill]") {
  // The ragged batch's 8 sequences at H = 2, 4, 8 and 16: the largest P with
  // P x N x H <= 132 SMs is 8, 4, 2, 1 (state_pass_shared at P = 8 and 4,
  // on Hopper step 5 on wgmma at 2 and 1). A weak decay, so that the state's
  // products weigh on every row of a chunk.
  uint64_t seed = 6160;
  for (int h : {2, 4, 8, 16}) {
    PrefillSpec s = ragged_spec(h, KDAJIT_DTYPE_F32, KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, seed++);
    s.lower_bound = -0.1f;
    check_routes(s, {"twopass"});
  }
}

TEST_CASE("prefill: 600 short sequences (route twopass's norm kernel by units), rowcta and twopass",
          "[gpu][prefill]") {
  PrefillSpec s = ragged_spec(4, KDAJIT_DTYPE_F32, KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, 6150);
  s.seqs.clear();
  for (int n = 0; n < 600; ++n) {
    const Slot slot = n % 97 == 5 ? Slot::null : n % 89 == 7 ? Slot::oob : Slot::live;
    s.seqs.push_back({1 + (n * 37) % 140, slot, n % 3 != 0});
  }
  check_routes(s, {"rowcta", "twopass"});
}

// A query_start_loc that steps back: [0, 200) and [100, 300) are live, rows
// 100..199 lie in both (no defined value: taken from the device before the
// comparison), [200, 100) is malformed. Route twopass's units (n + qsl[n] / 64:
// 0, 4, 3) give unit 3 to chunk 3 of sequence 0, so the state pass kernel
// computes chunk 0 of sequence 2 itself and sets the call's flag, and the norm
// kernel walks the sequences (rows 200..299, both conv windows) instead of
// reading the units' tags.
TEST_CASE("prefill: a chunk without its unit (query_start_loc steps back), every route", "[gpu][prefill]") {
  PrefillSpec s;
  s.heads = 16;
  s.seed = 6160;
  s.seqs = {{0, Slot::live, 1}, {0, Slot::live, 0}, {0, Slot::live, 1}};
  s.qsl = {0, 200, 100, 300};
  s.total_rows = 300;
  PrefillProblem p = make_prefill(s);
  PrefillProblem expected = p;
  expected.run_reference();
  for (std::string_view route : kPrefillRoutes)
    run_and_compare(runtime_for(route), expected, p, fmt::format("route {}", route), 0, nullptr, {}, {100, 200});
}

TEST_CASE("prefill: conv_state with K = 5 (taps 3..4 untouched), every route", "[gpu][prefill]") {
  for (auto cv : {KDAJIT_CONV_SD, KDAJIT_CONV_DS}) {
    PrefillSpec s = ragged_spec(16, KDAJIT_DTYPE_BF16, cv, KDAJIT_GATE_SOFTPLUS, 6200 + cv);
    s.conv_taps = 5;
    s.seqs = {{65, Slot::live, 1}, {1, Slot::live, 1}, {130, Slot::live, 0}, {3, Slot::null, 1}, {2, Slot::live, 1}};
    INFO("conv " << conv_name(cv));
    check_routes(s, {"rowcta", "split2", "split4", "split8", "twopass"});
  }
}

TEST_CASE("prefill: row tensors not 16-byte aligned (the output gate not staged), every route", "[gpu][prefill]") {
  PrefillSpec s = ragged_spec(16, KDAJIT_DTYPE_F32, KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, 6250);
  s.row_pad = 3;
  check_routes(s, {"rowcta", "split2", "split4", "split8", "twopass"});
}

namespace {

// One prompt of 8192 tokens (128 chunks), H = 16: the reference once, three routes.
void check_long(kdajit_dtype_t st) {
  const PrefillSpec s = one_sequence_spec(8192, st, 6300 + st);
  check_routes(s, {"rowcta", "split4", "twopass"});
}

}  // namespace

TEST_CASE("prefill: one sequence of 8192 tokens, f32 state, rowcta, split4 and twopass", "[gpu][prefill][long]") {
  check_long(KDAJIT_DTYPE_F32);
}

TEST_CASE("prefill: one sequence of 8192 tokens, bf16 state, rowcta, split4 and twopass", "[gpu][prefill][long]") {
  check_long(KDAJIT_DTYPE_BF16);
}

// The single decode op applied row after row from the same slot (its state
// stored, and rounded, after every token) against one prefill of the same 300
// tokens (the state carried in registers): the outputs and the final state
// agree within the prefill's tolerances, the conv history bit for bit.
TEST_CASE("prefill equals the single decode op token by token", "[gpu][prefill]") {
  constexpr int64_t kTokens = 300;
  for (auto st : {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16}) {
    INFO("state " << dtype_name(st));
    const PrefillSpec s = one_sequence_spec(static_cast<int>(kTokens), st, 6400 + st);
    PrefillProblem p = make_prefill(s);
    PrefillProblem expected = p;
    expected.run_reference();

    PrefillProblem stepwise = p;
    {
      test::DeviceProblem dev(stepwise.tensors);
      DeviceInts slot(std::vector<int32_t>{p.meta.slots[0]});
      KDAJIT_CUDA_CHECK(cudaDeviceSynchronize());
      const kdajit_decode_args_t whole = dev.args();
      auto row = [](kdajit_tensor_t t, int64_t r) {
        t.data = static_cast<std::byte*>(t.data) + r * t.strides[0] * static_cast<int64_t>(ref::dtype_size(t.dtype));
        t.shape[0] = 1;
        return t;
      };
      for (int64_t r = 0; r < kTokens; ++r) {
        kdajit_decode_args_t a = whole;
        a.x = row(whole.x, r);
        a.raw_gate = row(whole.raw_gate, r);
        a.raw_beta = row(whole.raw_beta, r);
        a.output_gate = row(whole.output_gate, r);
        a.output = row(whole.output, r);
        a.state_indices = slot.view();
        Outcome o = runtime().single_decode(a, reinterpret_cast<kdajit_stream_t>(stream()));
        INFO("row " << r << ": " << o.message);
        REQUIRE(o.ok());
      }
      dev.download(stepwise.tensors);
    }
    // The stepwise run itself against the reference (§8 tolerances of the single op).
    check_report(ref::compare(expected.tensors, stepwise.tensors, expected.plan()), "single decode, token by token");

    for (std::string_view route : kPrefillRoutes) {
      const std::string what = fmt::format("prefill, route {}", route);
      PrefillProblem got = run_and_compare(runtime_for(route), expected, p, what);
      check_report(ref::compare(stepwise.tensors, got.tensors, expected.plan(), ref::chunked_tolerances()),
                   what + " against the token-by-token single decode");
    }
  }
}

// Two calls over the same slot, the second with has_initial_state 1, against
// one call: the outputs (first call's rows, then the second's) and the final
// state within the prefill's tolerances, the conv history bit for bit.
TEST_CASE("a prefill split into two calls equals one call", "[gpu][prefill]") {
  constexpr int kTokens = 200;
  for (auto st : {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16}) {
    INFO("state " << dtype_name(st));
    PrefillSpec s = one_sequence_spec(kTokens, st, 6500 + st);
    s.conv = st == KDAJIT_DTYPE_F32 ? KDAJIT_CONV_SD : KDAJIT_CONV_DS;
    PrefillProblem p = make_prefill(s);
    PrefillProblem expected = p;
    expected.run_reference();
    for (std::string_view route : kPrefillRoutes) {
      const std::string one_what = fmt::format("one call, route {}", route);
      const PrefillProblem one = run_and_compare(runtime_for(route), expected, p, one_what);
      for (int split : {1, 64, 100, 137}) {
        const std::string what = fmt::format("route {}, split at token {}", route, split);
        INFO(what);
        PrefillProblem first = p, second = p;
        first.meta.qsl = {0, split};  // rows from `split` on: past qsl[N], zeros
        second.meta.qsl = {split, kTokens};  // rows below `split`: below qsl[0], zeros
        second.meta.initial = {1};
        PrefillProblem two = p;
        DevicePrefill dev(first);
        REQUIRE(launch(runtime_for(route), dev.args()).ok());
        dev.download(first);
        dev.set_metadata(second);
        Outcome o = launch(runtime_for(route), dev.args());
        INFO(o.message);
        REQUIRE(o.ok());
        dev.download(second);
        two.tensors = second.tensors;
        const kdajit_tensor_t& out2 = second.tensors.view(Tensor::output);
        for (int64_t r = 0; r < split; ++r) {
          for (int64_t h = 0; h < out2.shape[1]; ++h)
            for (int64_t d = 0; d < out2.shape[2]; ++d)
              if (ref::load(out2, {r, h, d}) != 0.0)
                FAIL(fmt::format("second call: output row {} (below qsl[0]) is not zero", r));
          two.set_output_row(r, first.output_row(r));
        }
        check_report(ref::compare(expected.tensors, two.tensors, expected.plan(), ref::chunked_tolerances()),
                     what + ": two calls against the reference");
        check_report(ref::compare(one.tensors, two.tensors, expected.plan(), ref::chunked_tolerances()),
                     what + ": two calls against one call");
      }
    }
  }
}

// Rows below qsl[0], past qsl[N], of malformed ranges (negative start,
// descending, past T_total), of null and out-of-range slots and of an empty
// sequence: exactly zero on every route, their slots untouched.
TEST_CASE("prefill: rows of no live sequence are exactly zero", "[gpu][prefill]") {
  PrefillSpec s;
  s.heads = 8;
  s.state_dtype = KDAJIT_DTYPE_BF16;
  s.seed = 6600;
  // 40 rows. Live: [3, 9) and [18, 22) (no initial state) and [22, 30).
  // Every other range overlaps only non-live ones, so zeros are the one answer:
  //   0 [-2, 3) negative start   1 [3, 9) live        2 [9, 9) empty
  //   3 [9, 14) null slot        4 [14, 12) descending  5 [12, 18) slot >= S (counted)
  //   6 [18, 22) live            7 [22, 30) live       8 [30, 45) past T_total
  //   9 [45, 35) descending; rows 35..39 are past qsl[N] = 35.
  s.seqs = {{0, Slot::live, 1}, {0, Slot::live, 1}, {0, Slot::live, 1}, {0, Slot::null, 1}, {0, Slot::live, 1},
            {0, Slot::oob, 1},  {0, Slot::live, 0}, {0, Slot::live, 1}, {0, Slot::live, 1}, {0, Slot::live, 1}};
  s.qsl = {-2, 3, 9, 9, 14, 12, 18, 22, 30, 45, 35};
  s.total_rows = 40;
  PrefillProblem p = make_prefill(s);
  REQUIRE(p.oob_sequences == 1);
  PrefillProblem expected = p;
  expected.run_reference();
  const ref::WritePlan plan = expected.plan();
  std::vector<uint8_t> want(40, 0);
  for (int r = 3; r < 9; ++r) want[static_cast<size_t>(r)] = 1;
  for (int r = 18; r < 30; ++r) want[static_cast<size_t>(r)] = 1;
  REQUIRE(plan.row_live == want);
  for (std::string_view route : kPrefillRoutes) {
    PrefillProblem got = run_and_compare(runtime_for(route), expected, p, fmt::format("route {}", route));
    const kdajit_tensor_t& v = got.tensors.view(Tensor::output);
    for (int64_t r = 0; r < 40; ++r) {
      if (want[static_cast<size_t>(r)]) continue;
      for (int64_t h = 0; h < v.shape[1]; ++h)
        for (int64_t d = 0; d < v.shape[2]; ++d) {
          const double x = ref::load(v, {r, h, d});
          if (x != 0.0) FAIL(fmt::format("route {}: output[{}, {}, {}] = {}, expected 0", route, r, h, d, x));
        }
    }
  }
}

// The selector picks the route from the host's max_seq_len hint; every route
// computes every length, so a hint of 0 (T_total) or one below the longest
// sequence gives the same results.
TEST_CASE("prefill: the selector's route with max_seq_len 0 and a hint below the real length", "[gpu][prefill]") {
  const PrefillSpec s = ragged_spec(16, KDAJIT_DTYPE_F32, KDAJIT_CONV_SD, KDAJIT_GATE_BOUNDED, 6700);
  PrefillProblem p = make_prefill(s);
  PrefillProblem expected = p;
  expected.run_reference();
  for (int64_t hint : {int64_t{0}, int64_t{16}, int64_t{1}}) {
    std::string key;
    {
      DevicePrefill dev(p);
      Outcome k = runtime().selected_prefill_key(dev.args(hint), reinterpret_cast<kdajit_stream_t>(stream()), &key);
      INFO(k.message);
      REQUIRE(k.ok());
      CHECK(key.rfind("kda_prefill.h16.state_f32.conv_sd.t", 0) == 0);  // t: the route's chunk
      CHECK(key.find(".gate_bounded.route_") != std::string::npos);
    }
    run_and_compare(runtime(), expected, p, fmt::format("max_seq_len {} (longest sequence 1000), {}", hint, key), hint);
  }
}

// A decay strong enough that a sub-chunk's half decays by more than the
// factored pass allows (docs/DESIGN.md "Prefill"): the kernel takes one
// exponential per element for the diagonal blocks of A and M. Bounded gate:
// lower_bound -20 (up to 8 x 20 over half a sub-chunk); softplus: A_log + 3.
TEST_CASE("prefill: a strong decay (the per-element path for A and M), every route", "[gpu][prefill]") {
  for (auto g : {KDAJIT_GATE_BOUNDED, KDAJIT_GATE_SOFTPLUS}) {
    PrefillSpec s = ragged_spec(16, g == KDAJIT_GATE_BOUNDED ? KDAJIT_DTYPE_F32 : KDAJIT_DTYPE_BF16, KDAJIT_CONV_SD,
                                g, 6900 + g);
    s.seqs = {{200, Slot::live, 1}, {64, Slot::live, 0}, {17, Slot::live, 1}};
    if (g == KDAJIT_GATE_BOUNDED) s.lower_bound = -20.f;
    else s.a_log_shift = 3.f;
    INFO("gate " << gate_name(g));
    check_routes(s, kPrefillRoutes);
  }
}

// Small cases for compute-sanitizer (memcheck, racecheck, synccheck): every
// route, both state dtypes, a chunk boundary and a partial chunk.
TEST_CASE("prefill sanitizer cases", "[sanitize]") {
  for (auto st : {KDAJIT_DTYPE_F32, KDAJIT_DTYPE_BF16}) {
    PrefillSpec s;
    s.heads = 2;
    s.state_dtype = st;
    s.conv = st == KDAJIT_DTYPE_F32 ? KDAJIT_CONV_SD : KDAJIT_CONV_DS;
    s.seqs = {{70, Slot::live, 1}, {0, Slot::live, 1}, {5, Slot::null, 1}, {3, Slot::live, 0}};
    s.rows_after = 2;
    s.seed = 6800 + st;
    INFO("state " << dtype_name(st));
    check_routes(s, kPrefillRoutes);
  }
}
