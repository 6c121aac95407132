// The route table: one row per route (kernel shape), the single source of truth
// that generation, the selector, the launcher, the presets, the CLI
// (`kdajit routes`) and the tests all read. Its rows are kdajit/routes.def:
// adding a route is one row there plus its template file.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kdajit/kernel_key.hpp"

namespace kdajit {

// The caller's promise about state_indices (kdajit_indices_mode_t, same numbers).
enum class IndicesMode : uint8_t { unique_or_null, positive_unique, repeated_positive };
inline constexpr std::array<std::string_view, 3> kIndicesModeNames = {"unique_or_null", "positive_unique",
                                                                       "repeated_positive"};

// What validation derives from a call that selection and the launch need: the
// key's family (every field but route and arch, which selection sets) and the
// sizes. Declared once: validation fills it, the selector reads it.
struct CallShape {
  KernelKey family;
  IndicesMode mode = IndicesMode::unique_or_null;
  int64_t rows = 0;      // R (the prefill op: T_total)
  int64_t num_seqs = 0;  // N (packed and prefill ops; 0 for the single op)
  // Prefill op: the caller's bound on the longest sequence (max_seq_len, 0
  // replaced by T_total, clamped to T_total); the selector's input only.
  int64_t max_seq_len = 0;
  // Chunked ops: the bytes of the caller's workspace (0: none); route twopass
  // needs twopass_workspace_bytes() of them.
  int64_t workspace_bytes = 0;
};

// The device a call runs on, as the selector sees it (read once per context).
struct DeviceTraits {
  Arch arch = Arch::sm_90;
  int sm_count = 0;
};

// The route table's chunked-op columns of `route`'s row: the chunk size of
// its keys (their t field) and whether it runs only where a caller forces it.
struct RouteChunkColumns {
  int chunk = kPrefillChunk;
  bool forced = false;
};
constexpr RouteChunkColumns route_chunk_columns(Route route) {
  switch (route) {
#define ROUTE(name, technique, single_template, packed_template, prefill_template, cluster, ctas_per_sm, threads,     \
              eligible, eligibility, grid, stages, pre_grid, post_grid, chunk, forced)                                 \
  case Route::name: return {chunk, forced};
#include "kdajit/routes.def"
#undef ROUTE
  }
  return {};
}
// The chunk size of a chunked op's keys on `route` (their t field).
constexpr int route_chunk(Route route) { return route_chunk_columns(route).chunk; }
// A route that runs `op` only where a caller forces it (options.route): the
// selector never picks it for the op, and no preset or configuration lists
// its keys of the op. Only chunked ops have such routes: rowcta16 (being
// measured: docs/DESIGN.md, "Chunks of 16 on one CTA per (sequence, head)"),
// and rowcta and the splits, which pipe16 and twopass outrun on every
// prompt batch measured (docs/PERFORMANCE.md, "The prefill selector").
constexpr bool forced_only(Route route, Op op) { return chunked(op) && route_chunk_columns(route).forced; }

// The key `call` runs with on `arch` with `route`.
inline KernelKey key_for(const CallShape& call, Route route, Arch arch) {
  KernelKey k = call.family;
  k.route = route;
  k.arch = arch;
  if (chunked(k.op)) k.tokens = route_chunk(route);
  return k;
}

struct LaunchGrid {
  uint32_t x = 1, y = 1, z = 1;
};

// Grid dimension y (and z) may not exceed this.
inline constexpr int64_t kMaxGridY = 65535;

// The chunked ops' launch shape, the same for every route that serves them (the
// route sets P, the cluster): 8 warps, one CTA per SM, and the sm_90 opt-in
// maximum of dynamic shared memory per CTA for the chunk's working set (the
// generator passes it as KDA_SMEM_BYTES; the kernel static_asserts its layout
// fits). Grid: x = H, y = P x wave with wave = min(max(N, 1), 65535 / P); the
// kernel walks sequences n = blockIdx.y / P + k x wave. Route pipe16 runs two
// roles of kPrefillThreads each (templates/kda_prefill_pipe.cu).
inline constexpr int kPrefillThreads = 256;
inline constexpr int kPrefillCtasPerSm = 1;
inline constexpr uint32_t kPrefillSmemBytes = 232448;

// Route twopass (templates/kda_prefill.cu, "Route twopass"): one unit per
// chunk position, N + ceil(T_total / 64) of them per head, each holding a
// chunk's W, U^T, Q̂ ∘ Γ, (K̂ ∘ Γ_C / Γ)^T (64 x 128 f32 each), A (64 x 64
// f32), Γ_C and the chunk it holds; the kernel static_asserts the size
// (KDA_UNIT_BYTES). The workspace's data must be 16-byte aligned.
inline constexpr int64_t kTwopassUnitBytes = 148096;
// Its intra-chunk kernel holds only steps 1-4's buffers, two CTAs per SM
// (KDA_INTRA_SMEM_BYTES; the kernel static_asserts its layout fits): at most
// half an sm_90 SM's 228 KiB, less the 1 KiB the driver reserves per CTA.
inline constexpr uint32_t kTwopassIntraSmemBytes = 115456;
inline constexpr int kTwopassIntraCtasPerSm = 2;
inline constexpr int64_t kWorkspaceAlignment = 16;
// The workspace route twopass needs for N sequences, T_total rows and H heads
// (0 when T_total is 0); a negative or overflowing size gives INT64_MAX.
int64_t twopass_workspace_bytes(int64_t num_seqs, int64_t rows, int64_t heads);
// Route twopass's CTAs per (sequence, head) in its state pass kernel (grid z,
// each holding 128 / P value rows of the state): the largest P in 1, 2, 4, 8
// with P x max(N, 1) x H <= SMs (one CTA per SM), else 1.
int twopass_parts(const CallShape& call, const DeviceTraits& device);
// Whether a chunked key runs step 5 on wgmma (docs/DESIGN.md, "Step 5 at
// P <= 2 on wgmma"): route twopass's state pass at P <= 2 and route rowcta,
// on Hopper (sm_90, sm_90a) only; an sm_90 key's program then compiles for
// sm_90a (canonical_options; the cubin runs on compute capability 9.0, which
// is what the key names). The split routes and every other arch keep mma.sync.
constexpr bool wgmma_state_pass(const KernelKey& key) {
  return chunked(key.op) &&
         (key.route == Route::twopass || key.route == Route::rowcta || key.route == Route::rowcta16 ||
          key.route == Route::pipe16) &&
         (key.arch == Arch::sm_90 || key.arch == Arch::sm_90a);
}

// The work items of a call per head: single op, its rows; packed op,
// max(N, ceil(R / T)) (item i: sequence i and the tail-row candidates
// i + k n, k < T; templates/kda_packed_item.cuh, packed_items(), is the same
// rule); prefill op, max(N, 1) (one item per sequence).
int64_t items_per_head(const CallShape& call);

// One row of the route table (kdajit/routes.def).
struct RouteSpec {
  Route route;
  // One line: what the kernel shape is.
  std::string_view technique;
  // The template file per decode op and for the chunked ops (index: template_column);
  // empty where the route does not serve that op.
  std::array<std::string_view, 3> templates;
  // CTAs that share one (row, head): a thread-block cluster along grid y (1:
  // none). The prefill op's P value slices per (sequence, head).
  int cluster = 1;
  // CTAs per SM a key is compiled for (__launch_bounds__' minimum): caps
  // registers at 65536 / (threads x CTAs per SM). More, smaller CTAs per SM keep
  // more loads in flight while others compute; the cap must not cause spills.
  int (*ctas_per_sm_of)(const KernelKey& key) = nullptr;
  // Threads per CTA for a key of this route.
  int (*threads)(const KernelKey& key) = nullptr;
  // Whether this route computes `call` exactly as the contract says (e.g. only
  // the sequential route applies repeated slots in row order), on `device`.
  bool (*eligible)(const CallShape& call, const DeviceTraits& device) = nullptr;
  std::string_view eligibility;  // the same rule in words (CLI, errors)
  // The launch grid for a validated call on `device`.
  LaunchGrid (*grid)(const CallShape& call, const DeviceTraits& device) = nullptr;
  // Shared-memory state stages per CTA for a key (KDA_STAGES; 0: the route
  // has none). Each holds one (slot, head) state slice in dynamic shared memory.
  int (*stages)(const KernelKey& key) = nullptr;
  // The grid of a kernel this route launches before its own (route twopass),
  // or nullptr.
  LaunchGrid (*pre_grid)(const CallShape& call, const DeviceTraits& device) = nullptr;
  // The grid of a kernel this route launches after its own (route twopass,
  // prefill op: its norm kernel; x = 0 for an op without one), or nullptr.
  LaunchGrid (*post_grid)(const CallShape& call, const DeviceTraits& device) = nullptr;

  std::string_view name() const { return to_string(route); }
  int ctas_per_sm(const KernelKey& key) const { return ctas_per_sm_of(key); }
  int stage_count(const KernelKey& key) const { return stages(key); }
  // Dynamic shared memory of a launch (bytes): the stages; kPrefillSmemBytes
  // for a prefill key.
  uint32_t dynamic_smem_bytes(const KernelKey& key) const;
  // That of the kernel launched first (pre_grid; route twopass's intra-chunk
  // kernel: kTwopassIntraSmemBytes), 0 without one.
  uint32_t pre_dynamic_smem_bytes(const KernelKey& key) const;
  bool serves(Op op) const { return !templates[template_column(op)].empty(); }
  std::string_view template_file(Op op) const { return templates[template_column(op)]; }
  // The routes.def column of an op: the chunk op shares the prefill template.
  static constexpr size_t template_column(Op op) { return op == Op::chunk ? 2 : static_cast<size_t>(op); }
};

// Everything a launch of `key` for `call` on `device` needs besides the kernel
// and its parameters: the route's row applied to the call.
struct LaunchPlan {
  LaunchGrid grid;
  uint32_t threads = 0;
  uint32_t dynamic_smem_bytes = 0;
  uint32_t cluster_y = 1;  // cluster dimension along grid y (1: no cluster)
  // A kernel launched first on the same stream, with the same block and
  // parameters, its own shared memory and no cluster (route twopass: its
  // intra-chunk kernel, pre_entry_name()); pre_grid.x == 0: none.
  LaunchGrid pre_grid{0, 0, 0};
  uint32_t pre_dynamic_smem_bytes = 0;  // its dynamic shared memory
  bool has_pre() const { return pre_grid.x > 0; }
  // A kernel launched last on the same stream, with the same block and
  // parameters, no dynamic shared memory and no cluster (route twopass,
  // prefill op: its norm kernel, post_entry_name()); post_grid.x == 0: none.
  LaunchGrid post_grid{0, 0, 0};
  bool has_post() const { return post_grid.x > 0; }
};
LaunchPlan launch_plan(const KernelKey& key, const CallShape& call, const DeviceTraits& device);

// Every route, in Route enum order.
std::span<const RouteSpec> route_table();
const RouteSpec& route_spec(Route route);
// The routes that serve an op, by name.
std::vector<std::string_view> route_names(Op op);

// The kernel's extern "C" name in the generated source (one per op, every route).
std::string_view entry_name(Op op);
// The extern "C" name of the kernel a route with a pre_grid launches first
// (kda_prefill_intra, kda_chunk_intra); empty for the decode ops.
std::string_view pre_entry_name(Op op);
// The extern "C" name of the kernel a route with a post_grid launches last
// (kda_prefill_norm); empty for the other ops.
std::string_view post_entry_name(Op op);

}  // namespace kdajit
