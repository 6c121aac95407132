// Random KDA decode problems that own their host buffers, and the checker of
// docs/CONTRACT.md §8. Used by test_reference, the GPU tests and `kdajit selfcheck`.
//
// A GPU check goes:
//   auto p = Problem::make(spec).value();      // outputs come poisoned
//   Problem expected = p, got = p;             // copies re-point their views; they share p's before-snapshot
//   expected.run_reference();
//   auto args = got.args();
//   for (auto& b : got.buffers()) { upload *b.bytes; (args.*b.view).data = device pointer; }
//   launch(args); download every b.written buffer into *b.bytes;
//   CompareReport rep = compare(expected, got);  // rep.pass, rep.message
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kdajit/error.hpp"
#include "kdajit/kdajit.h"
#include "kdajit/kernel_key.hpp"
#include "kdajit/reference.hpp"

namespace kdajit::ref {

struct ProblemSpec {
  kdajit_op_t op = KDAJIT_OP_SINGLE;
  int heads = 4;
  kdajit_dtype_t state_dtype = KDAJIT_DTYPE_F32;
  kdajit_conv_layout_t conv = KDAJIT_CONV_SD;
  int tokens = 1;  // T: 1 for single
  // K of conv_state; 0: T + 2, what the decode ops take. The prefill op takes
  // any K in 3..18 (its tests build their tensors from a single-op problem).
  int conv_taps = 0;
  kdajit_gate_t gate = KDAJIT_GATE_BOUNDED;
  int rows = 4;                   // single: R
  std::vector<int> seq_lens;      // packed: L per sequence (0 allowed; > T is bad metadata); R = sum + extra_rows
  std::vector<int> num_accepted;  // packed: per sequence, stored as given (the op clamps); empty: random in [1, T]
  int extra_rows = 0;             // packed: rows beyond qsl[N]
  int num_slots = 0;              // S; 0: enough for every row / checkpoint, plus the null slot and 3 spares
  // single: rows with a null slot (0 or negative) / a slot >= S;
  // packed: sequences whose cs or src is null / out of range.
  int null_rows = 0, oob_rows = 0;
  int null_checkpoints = 0;  // packed: entries state_indices[n, t] (t not 0 or a-1) made null or out of range
  kdajit_indices_mode_t mode = KDAJIT_INDICES_UNIQUE_OR_NULL;  // single + repeated_positive: some slots repeat
  float norm_eps = 1e-5f;
  float lower_bound = -5.f;
  int row_pad = 0;   // extra elements in the row stride of x, raw_gate, raw_beta, output_gate, output
  int slot_pad = 0;  // extra elements in the slot stride of conv_state and state (rounded up to a multiple of 8)
  uint64_t seed = 1;
};

// A spec with a small mixed workload for one kernel key: null and out-of-range
// rows, padded rows and slots, and for the packed op every kind of sequence.
ProblemSpec default_spec(const KernelKey& key, uint64_t seed);

// The tensors of a call, named after their kdajit_decode_args_t fields.
enum class Tensor : int {
  x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
  output_gate, norm_weight, output, query_start_loc, num_accepted_tokens,
};
inline constexpr int kNumTensors = 14;
std::string_view tensor_name(Tensor t);
kdajit_tensor_t kdajit_decode_args_t::*tensor_field(Tensor t);
bool tensor_written(Tensor t);  // output, conv_state, state

// One tensor's host buffer. The view's data always points at bytes->data().
struct BufferRef {
  Tensor tensor;
  std::string_view name;
  std::vector<std::byte>* bytes;
  kdajit_tensor_t kdajit_decode_args_t::*view;  // the args field this buffer backs
  bool written;                                 // output, conv_state, state
};

class Problem {
 public:
  // Data per docs/CONTRACT.md §8, fresh per seed. Every tensor is drawn from its own
  // stream in logical index order, so layout, padding and S do not change values.
  // Padding is filled with NaN bit patterns (a kernel that reads it shows NaN;
  // one that writes it fails the bytewise check). Outputs start poisoned.
  static Result<Problem> make(const ProblemSpec& spec);

  Problem(const Problem& other);
  Problem& operator=(const Problem& other);
  Problem(Problem&& other) noexcept;
  Problem& operator=(Problem&& other) noexcept;
  ~Problem() = default;

  Problem clone() const { return *this; }

  const ProblemSpec& spec() const { return spec_; }
  kdajit_op_t op() const { return spec_.op; }
  int64_t rows() const { return rows_; }
  int64_t heads() const { return spec_.heads; }
  int64_t tokens() const { return spec_.tokens; }
  int64_t num_seqs() const { return num_seqs_; }
  int64_t num_slots() const { return num_slots_; }

  kdajit_decode_args_t args() const { return args_; }  // views into this problem's host buffers
  // Every non-empty buffer (the single op has no query_start_loc / num_accepted_tokens).
  std::vector<BufferRef> buffers();

  std::vector<std::byte>& bytes(Tensor t) { return buffers_[static_cast<size_t>(t)]; }
  const std::vector<std::byte>& bytes(Tensor t) const { return buffers_[static_cast<size_t>(t)]; }
  const kdajit_tensor_t& view(Tensor t) const { return args_.*tensor_field(t); }
  // The buffer as it was at the last snapshot (make / poison_outputs / snapshot).
  const std::vector<std::byte>& initial(Tensor t) const { return (*initial_)[static_cast<size_t>(t)]; }

  // Scalars of the call.
  void set_norm_eps(float eps) { args_.norm_eps = eps; }
  void set_lower_bound(float lb) { args_.lower_bound = lb; }

  void poison_outputs();  // output elements = 0xffff (a NaN), then snapshot()
  void snapshot();        // the current written buffers become the "before" that compare() checks against
  Status run_reference(Capture* capture = nullptr);

 private:
  Problem() = default;
  void repoint();

  ProblemSpec spec_;
  int64_t rows_ = 0, num_seqs_ = 0, num_slots_ = 0;
  kdajit_decode_args_t args_{};
  std::vector<std::vector<std::byte>> buffers_;  // indexed by Tensor
  // Shared between copies: the before-state that expected and got both came from (indexed by Tensor).
  std::shared_ptr<const std::vector<std::vector<std::byte>>> initial_;
};

// The tensors and scalars a prefill call takes from decode args `d` (a
// Problem's host views or a DeviceProblem's device ones), copied into f
// (ref::PrefillArgs or kdajit_prefill_args_t); the prefill's own metadata
// (state_indices [N], has_initial_state, query_start_loc) is the caller's.
template <class PrefillArgsT>
void copy_shared_fields(const kdajit_decode_args_t& d, PrefillArgsT& f) {
  f.x = d.x;
  f.conv_weight = d.conv_weight;
  f.conv_state = d.conv_state;
  f.raw_gate = d.raw_gate;
  f.raw_beta = d.raw_beta;
  f.A_log = d.A_log;
  f.dt_bias = d.dt_bias;
  f.state = d.state;
  f.output_gate = d.output_gate;
  f.norm_weight = d.norm_weight;
  f.output = d.output;
  f.gate = d.gate;
  f.lower_bound = d.lower_bound;
  f.norm_eps = d.norm_eps;
}

// A prefill call over a Problem: a single-op problem of T_total rows supplies
// the tensors (§8 data, NaN padding, poisoned output; its own state_indices are
// all null and play no part), the call's own metadata lives here.
struct PrefillMeta {
  std::vector<int32_t> slots;    // state_indices [N]: a slot per sequence
  std::vector<int32_t> qsl;      // query_start_loc [N+1]
  std::vector<int32_t> initial;  // has_initial_state [N]; empty: passed empty (every sequence starts from its slot)
};
// The prefill args of that call: the problem's tensors and scalars, and host
// views of meta's vectors (the reference only reads them; both must outlive
// the args).
PrefillArgs prefill_args(const Problem& p, const PrefillMeta& meta);

// Spec section 8 tolerances.
struct Tolerances {
  double output_rel_l2 = 1e-2;
  double output_rtol = 3e-2, output_atol = 2e-2;
  double state_f32_rel_l2 = 1e-3;
  double state_bf16_rel_l2 = 6e-3;
  double state_change_rel_l2 = 1e-2;

  // An output element within atol + rtol |expected| (false for NaN or inf).
  bool output_within(double got, double expected) const {
    return std::fabs(got - expected) <= output_atol + output_rtol * std::fabs(expected);
  }
  // The state's relative L2 limit for its dtype.
  double state_rel_l2(bool bf16) const { return bf16 ? state_bf16_rel_l2 : state_f32_rel_l2; }
};
// The chunked ops' limits (docs/CONTRACT.md §10, §11): §8's output limits, and
// the state's looser, since the chunked recurrence evaluates in another order
// than the reference's token after token.
inline Tolerances chunked_tolerances() {
  Tolerances t;
  t.state_f32_rel_l2 = 2e-3;
  t.state_bf16_rel_l2 = 8e-3;
  return t;
}

struct CompareReport {
  bool pass = true;
  std::string message;                // the first failure (tensor, index, values); "" when pass
  std::vector<std::string> failures;  // every failure found, up to a dozen
  double output_rel_l2 = 0, output_max_abs = 0;
  int64_t output_bad_elements = 0;  // outside rtol/atol, NaN/inf, or nonzero in a zero row
  double state_rel_l2 = 0, state_change_rel_l2 = 0, state_max_abs = 0;
  int64_t state_bad_elements = 0;  // NaN/inf in a written slot
  int64_t conv_mismatches = 0;     // elements differing from the reference (must be 0)
  int64_t untouched_mismatches = 0;  // bytes changed that the call must not write
  std::string summary() const;       // one line with every metric
};

// Checks got (after the device call) against expected (after run_reference);
// both must be copies of one Problem (same inputs, same before-snapshot).
CompareReport compare(const Problem& expected, const Problem& got, const Tolerances& tol = {});
// The same against a given write plan (a prefill call's: plan_prefill_writes),
// for problems whose own metadata is not the call's.
CompareReport compare(const Problem& expected, const Problem& got, const WritePlan& plan, const Tolerances& tol = {});

// Output, state and conv_state bytes identical (determinism checks).
bool bitwise_equal(const Problem& a, const Problem& b);

}  // namespace kdajit::ref
