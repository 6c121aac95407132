/* kdajit: JIT-compiled fused KDA (Kimi Delta Attention) decode kernels.
 * The C ABI. Every function returns a kdajit_status_t; on failure the
 * calling thread's message is available from kdajit_last_error().
 * Contract: docs/CONTRACT.md; "§N" below is its section N. Notation: D = 128,
 * H heads, R rows, S slots, N sequences, T tokens per sequence (1 for the
 * single op), K = T + 2 conv taps. Shapes and strides are in elements.
 *
 * ABI growth (docs/CONTRACT.md §9). Every struct a caller passes by pointer
 * (kdajit_runtime_options_t, kdajit_decode_args_t, kdajit_prefill_args_t,
 * kdajit_config_t) starts
 * with size_t struct_size, which its *_init sets to sizeof the struct of the
 * header the caller compiled against. Fields are only ever appended: the
 * library reads the caller's struct_size bytes, gives every field past them
 * its default, and answers KDAJIT_ERROR_INVALID_ARGUMENT, naming the struct,
 * for a size it does not know. kdajit_tensor_t never changes. The entry points
 * that take these structs are exported with a _v1 suffix, to which the plain
 * names map (the macros below); the plain symbols serve binaries built against
 * the 0.1.0 header, whose structs have no struct_size (the prefill entry
 * points, newer than 0.1.0, have only the _v1 export). */
#ifndef KDAJIT_KDAJIT_H
#define KDAJIT_KDAJIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KDAJIT_API __attribute__((visibility("default")))
#else
#define KDAJIT_API
#endif

/* KDAJIT_VERSION_MAJOR/MINOR/PATCH and KDAJIT_VERSION_STRING, generated from the
 * project's version by the build. */
#include "kdajit/kdajit_version.h"

/* Status of every call (§6). H > 128 and T > 16 are UNSUPPORTED; every other
 * contract violation is INVALID_ARGUMENT. kdajit_status_string() names a code. */
typedef enum kdajit_status {
  KDAJIT_OK = 0,
  KDAJIT_ERROR_INVALID_ARGUMENT = 1, /* an argument breaks the contract */
  KDAJIT_ERROR_UNSUPPORTED = 2,      /* a configuration this build cannot serve */
  KDAJIT_ERROR_COMPILE = 3,          /* NVRTC rejected the generated source */
  KDAJIT_ERROR_CUDA = 4,             /* the CUDA driver returned an error */
  KDAJIT_ERROR_CACHE = 5,            /* the kernel cache failed */
  KDAJIT_ERROR_JIT_DISABLED = 6,     /* KDAJIT_DISABLE_JIT=1 and the kernel is not cached */
  KDAJIT_ERROR_CAPTURE = 7,          /* a compile was needed while the stream is capturing */
  KDAJIT_ERROR_IO = 8,
  KDAJIT_ERROR_INTERNAL = 9
} kdajit_status_t;

/* Element types of tensor views: f32 and int32 are 4 bytes, bf16 2. */
typedef enum kdajit_dtype {
  KDAJIT_DTYPE_F32 = 0,
  KDAJIT_DTYPE_BF16 = 1,
  KDAJIT_DTYPE_INT32 = 2
} kdajit_dtype_t;

/* The gate of §2 step 4, with g = raw_gate + dt_bias, A = exp(A_log) and
 * decay_k = exp(gv). Part of the kernel key (§5). */
typedef enum kdajit_gate {
  KDAJIT_GATE_BOUNDED = 0,  /* gv = lower_bound * sigmoid(A * g) */
  /* Kimi-Linear; softplus(g) = g for g > 20; lower_bound is ignored. */
  KDAJIT_GATE_SOFTPLUS = 1  /* gv = -A * softplus(g) */
} kdajit_gate_t;

/* conv_state layout (§1.3). A decode call infers it from conv_state's strides;
 * this enum names it in kdajit_config_t and in kernel keys (§5). */
typedef enum kdajit_conv_layout {
  KDAJIT_CONV_SD = 0, /* conv_state strides (slot, 1, qkv): taps slow */
  KDAJIT_CONV_DS = 1  /* conv_state strides (slot, K, 1): taps contiguous per channel */
} kdajit_conv_layout_t;

/* The two decode ops: kdajit_single_decode (§2-§3), kdajit_packed_decode (§4). */
typedef enum kdajit_op {
  KDAJIT_OP_SINGLE = 0, /* one token per row */
  KDAJIT_OP_PACKED = 1, /* T >= 1 tokens per sequence (draft verify) */
  KDAJIT_OP_PREFILL = 2, /* whole prompts, chunked (kdajit_prefill, §10); keys carry the chunk size as t */
  /* the prefill's delta rule alone on FLA chunk_kda's tensors (kdajit_chunk, §11); keys carry conv sd, t 64 */
  KDAJIT_OP_CHUNK = 3
} kdajit_op_t;

/* A host-side promise about the state_indices values, so that the launch can
 * be chosen without reading device memory (docs/CONTRACT.md §3). Broken
 * promises are undefined behaviour. The packed op rejects REPEATED_POSITIVE
 * (INVALID_ARGUMENT: live sequences never share a written slot, §4). */
typedef enum kdajit_indices_mode {
  KDAJIT_INDICES_UNIQUE_OR_NULL = 0,   /* default: positive slots distinct, nulls allowed */
  KDAJIT_INDICES_POSITIVE_UNIQUE = 1,  /* every slot > 0 and distinct */
  /* Single op only: each row sees the state and conv updates of every earlier
   * row with the same slot (one CTA per head walks the rows in order). */
  KDAJIT_INDICES_REPEATED_POSITIVE = 2 /* slots may repeat; rows apply in row order */
} kdajit_indices_mode_t;

#define KDAJIT_MAX_DIMS 4

/* A strided tensor view: the fields of a DLPack DLTensor that matter here.
 * Shapes and strides are in elements. data is a device pointer for the decode
 * calls and a host pointer for the reference. */
typedef struct kdajit_tensor {
  /* Non-NULL, aligned to the element size and to the column "data align" of
   * the §1.2 table. */
  void* data;
  kdajit_dtype_t dtype;
  /* Exactly the rank the argument's shape has (§1.2). */
  int32_t ndim;
  int64_t shape[KDAJIT_MAX_DIMS];
  /* A dimension of size 1 accepts any stride (it is never stepped over). */
  int64_t strides[KDAJIT_MAX_DIMS];
} kdajit_tensor_t;

/* Arguments of both decode ops (docs/CONTRACT.md §1). The packed op also reads
 * query_start_loc and num_accepted_tokens; the single op neither reads nor
 * validates them (they may stay empty). "row >= n" / "slot >= n": a free stride
 * of at least n. Initialise with kdajit_decode_args_init(). */
typedef struct kdajit_decode_args {
  /* sizeof(kdajit_decode_args_t) of the caller's header: kdajit_decode_args_init sets it. */
  size_t struct_size;
  /* [R, 3*H*128] bf16, strides (row >= 3*H*128, 1). Defines R (1..2^31-1).
   * q, k, v projections before the conv: channel j*H*128 + h*128 + d with
   * j = 0 q, 1 k, 2 v (§1.1, §2 step 1). */
  kdajit_tensor_t x;                   /* [R, 3*H*128] bf16 */
  /* [3, 4, H*128] f32, contiguous: strides (4*H*128, H*128, 1). Depthwise conv
   * taps conv_weight[j, w, h*128 + d]: w = 0..2 weight the history taps, oldest
   * first; w = 3 weights the current x (§2 step 1). */
  kdajit_tensor_t conv_weight;         /* [3, 4, H*128] f32 */
  /* [S, 3*H*128, K] bf16 with K = T + 2, i.e. 3 for the single op. Strides SD
   * (slot, 1, 3*H*128), taps slow, or DS (slot, K, 1), taps contiguous; the
   * layout is inferred from them (§1.3). Slot stride >= 3*H*128*K and a
   * multiple of 4 elements (8 bytes); data 8-byte aligned. Same S as state.
   * Conv history, tap 0 oldest; live rows update it in place (§2 step 1, §4). */
  kdajit_tensor_t conv_state;          /* [S, 3*H*128, K] bf16, SD or DS strides */
  /* [R, H, 128] bf16, strides (row >= H*128, 128, 1). Per-k gate logits, to
   * which dt_bias is added (§2 step 4). */
  kdajit_tensor_t raw_gate;            /* [R, H, 128] bf16 */
  /* [R, H] bf16, strides (row >= H, 1). beta = sigmoid(raw_beta) (§2 step 5). */
  kdajit_tensor_t raw_beta;            /* [R, H] bf16 */
  /* [H] f32, contiguous. Defines H: 1..128 (H > 128: UNSUPPORTED). Log decay
   * rate per head, A = exp(A_log[h]) (§2 step 4). */
  kdajit_tensor_t A_log;               /* [H] f32 */
  /* [H*128] f32, contiguous. Gate bias, element h*128 + k (§2 step 4). */
  kdajit_tensor_t dt_bias;             /* [H*128] f32 */
  /* int32, contiguous; values read on the device only (never an error).
   * Single op: [R], the slot of each row: 1..S-1 computed, <= 0 null (zeros),
   * >= S out of range (zeros, counted) (§3).
   * Packed op: [N, T], defines N (1..2^31-1) and T (1..16; T > 16: UNSUPPORTED).
   * [n, 0] is the conv slot, [n, a-1] the source state slot, [n, t] the
   * checkpoint slot of token t (§4). */
  kdajit_tensor_t state_indices;       /* single: [R]; packed: [N, T] int32 */
  /* [S, H, 128, 128] f32 or bf16, element [s, h, v, k] with k fastest (the
   * transpose of FLA's [K, V]). Strides (slot >= H*128*128, 128*128, 128, 1);
   * slot stride a multiple of 16 bytes (4 f32 / 8 bf16 elements); data 16-byte
   * aligned. Defines S (1..2^31-1). Slot 0 is the null slot: read, never
   * written. Recurrent state, updated in place (§2 step 6). */
  kdajit_tensor_t state;               /* [S, H, 128, 128] f32 or bf16 */
  /* [R, H, 128] bf16, strides (row >= H*128, 128, 1). Gated-RMSNorm gate
   * logits (§2 step 7). */
  kdajit_tensor_t output_gate;         /* [R, H, 128] bf16 */
  /* [128] f32, contiguous. RMSNorm weight shared by every head (§2 step 7). */
  kdajit_tensor_t norm_weight;         /* [128] f32 */
  /* [R, H, 128] bf16, strides (row >= H*128, 128, 1). Caller-owned; every
   * element is written by every call: computed rows, and zeros for null,
   * out-of-range, non-live and unowned rows (§3, §4). */
  kdajit_tensor_t output;              /* [R, H, 128] bf16, written */
  /* Packed op: [N + 1] int32, contiguous, device values. Sequence n owns rows
   * [qsl[n], qsl[n+1]), 0 to T of them; malformed ranges and rows outside
   * [qsl[0], qsl[N]) give zeros (§4). */
  kdajit_tensor_t query_start_loc;     /* packed: [N + 1] int32 */
  /* Packed op: [N] int32, contiguous, device values. Tokens a accepted in the
   * previous verify step, clamped into [1, T]: the conv history is taps
   * a-1 .. a+1 and the state starts from slot state_indices[n, a-1] (§4). */
  kdajit_tensor_t num_accepted_tokens; /* packed: [N] int32 */
  /* Bounded or softplus (§2 step 4); part of the kernel key (§5). */
  kdajit_gate_t gate;
  /* Bounded gate: finite and < 0, else INVALID_ARGUMENT; log decay then lies
   * in (lower_bound, 0). Softplus ignores it. Default -5 (§1.4). */
  float lower_bound; /* bounded gate: finite and < 0 */
  /* RMSNorm epsilon: finite and >= 0. Default 1e-6 (§1.4, §2 step 7). */
  float norm_eps;    /* >= 0 */
  /* Default UNIQUE_OR_NULL; the packed op rejects REPEATED_POSITIVE (§3). */
  kdajit_indices_mode_t state_indices_mode;
  /* NULL or a 4-byte aligned device int32. The kernel adds the slots >= S it
   * meets: one per such row (single op, §3), one per used position of
   * state_indices[n, :] (packed op, §4). Never reset by kdajit. */
  int32_t* oob_counter; /* optional device int32: += number of out-of-range slots seen */
} kdajit_decode_args_t;

/* Arguments of kdajit_prefill (docs/CONTRACT.md §10): N sequences of any
 * length (0 allowed) packed in T_total rows, one state slot each. Every tensor
 * not described here has the decode ops' rules with R = T_total rows.
 * Initialise with kdajit_prefill_args_init(). */
typedef struct kdajit_prefill_args {
  /* sizeof(kdajit_prefill_args_t) of the caller's header: kdajit_prefill_args_init sets it. */
  size_t struct_size;
  kdajit_tensor_t x;                 /* [T_total, 3*H*128] bf16, strides (row >= 3*H*128, 1) */
  kdajit_tensor_t conv_weight;       /* [3, 4, H*128] f32, contiguous */
  /* [S, 3*H*128, K] bf16 with K in 3..18, SD or DS strides (§1.3). A sequence
   * reads taps 0..2 as its history and writes its last 3 inputs there. */
  kdajit_tensor_t conv_state;
  kdajit_tensor_t raw_gate;          /* [T_total, H, 128] bf16 */
  kdajit_tensor_t raw_beta;          /* [T_total, H] bf16 */
  kdajit_tensor_t A_log;             /* [H] f32 */
  kdajit_tensor_t dt_bias;           /* [H*128] f32 */
  /* [N] int32, contiguous, device values: the slot of sequence n (1..S-1;
   * <= 0 null and >= S out of range: its rows are zeros, nothing is written).
   * Defines N (0..2^31-2). Live sequences have distinct slots. */
  kdajit_tensor_t state_indices;
  /* [N] int32, contiguous, device values, or empty (ndim 0 or shape [0] with
   * data NULL): every sequence starts from its slot. 0: sequence n starts from
   * zero state and zero conv history whatever its slot holds. */
  kdajit_tensor_t has_initial_state;
  kdajit_tensor_t state;             /* [S, H, 128, 128] f32 or bf16, as the decode ops */
  kdajit_tensor_t output_gate;       /* [T_total, H, 128] bf16 */
  kdajit_tensor_t norm_weight;       /* [128] f32 */
  kdajit_tensor_t output;            /* [T_total, H, 128] bf16, every element written */
  /* [N + 1] int32, contiguous, device values: sequence n owns rows
   * [qsl[n], qsl[n+1]); malformed ranges give zeros (§10). */
  kdajit_tensor_t query_start_loc;
  kdajit_gate_t gate;
  float lower_bound; /* bounded gate: finite and < 0 */
  float norm_eps;    /* >= 0 */
  /* A host-side upper bound of the longest sequence, for the route selector
   * only (no device read); 0: T_total. Every route computes every length, so
   * a wrong hint costs speed, never correctness (a CUDA graph captured with one
   * hint stays correct when replayed over other lengths). */
  int64_t max_seq_len;
  /* NULL or a 4-byte aligned device int32: += one per sequence whose slot is >= S. */
  int32_t* oob_counter;
  /* Optional device scratch (appended: a shorter struct_size means none): NULL
   * with workspace_bytes 0, or 16-byte aligned with its size in bytes. With at least
   * kdajit_prefill_workspace_bytes(N, T_total, H) bytes the selector may pick
   * route twopass (docs/CONTRACT.md §10.4); the call may overwrite any of it.
   * Not read or written by other routes. */
  void* workspace;
  int64_t workspace_bytes;
} kdajit_prefill_args_t;

/* Arguments of kdajit_chunk (docs/CONTRACT.md §11): the delta rule of
 * kdajit_prefill without its conv and its norm, on the tensors of FLA's
 * chunk_kda (q, k, v after the engine's conv, one dense state per sequence),
 * for engines that keep their own conv and norm. N sequences of any length
 * (0 allowed) packed in T_total rows. Initialise with kdajit_chunk_args_init(). */
typedef struct kdajit_chunk_args {
  /* sizeof(kdajit_chunk_args_t) of the caller's header: kdajit_chunk_args_init sets it. */
  size_t struct_size;
  /* [T_total, H, 128] bf16 each, strides (row >= H*128, 128, 1). q defines
   * T_total (1..2^31-1); H comes from A_log. */
  kdajit_tensor_t q;
  kdajit_tensor_t k;
  kdajit_tensor_t v;
  /* [T_total, H, 128] bf16 or f32, strides (row >= H*128, 128, 1): the gate
   * logits, to which dt_bias is added (§2 step 4, the key's gate). */
  kdajit_tensor_t g;
  /* [T_total, H] bf16 or f32, strides (row >= H, 1): logits with
   * beta_sigmoid 1 (beta = sigmoid), else beta itself. */
  kdajit_tensor_t beta;
  kdajit_tensor_t A_log;   /* [H] f32: defines H (1..128) */
  kdajit_tensor_t dt_bias; /* [H*128] f32, or empty (ndim 0 or shape [0], data NULL): no bias */
  /* [N, H, 128, 128] f32 or bf16 (the key's state dtype), strides
   * (n >= H*128*128, 128*128, 128, 1), data and the n stride 16-byte aligned;
   * element [n, h, k, v] (FLA's layout) or, with state_v_first 1, [n, h, v, k]
   * (kdajit's state pool). Empty: every sequence starts from zero state. */
  kdajit_tensor_t initial_state;
  /* The same shape, dtype and layout, or empty: nothing written. Receives each
   * sequence's state after its last token (its initial state for length 0);
   * it may be initial_state itself (in place). */
  kdajit_tensor_t final_state;
  /* [T_total, H, 128] bf16, strides (row >= H*128, 128, 1), written: the
   * delta rule's output o (before any norm); every element is written. */
  kdajit_tensor_t output;
  /* [N + 1] int32, contiguous, device values: sequence n owns rows
   * [cu_seqlens[n], cu_seqlens[n+1]). Defines N (1..2^31-2). A malformed
   * range gives zero rows and leaves its final state unwritten (§11). */
  kdajit_tensor_t cu_seqlens;
  kdajit_gate_t gate;
  float lower_bound;       /* bounded gate: finite and < 0 */
  float scale;             /* finite and > 0: q's scale; default 1/sqrt(128) */
  int32_t qk_l2norm;       /* 1 (default): q and k divided by sqrt(sum x^2 + 1e-6); 0: as given */
  int32_t beta_sigmoid;    /* 1 (default): beta = sigmoid(beta); 0: beta as given */
  int32_t state_v_first;   /* 0 (default): states [n, h, k, v]; 1: [n, h, v, k] */
  /* As kdajit_prefill_args_t.max_seq_len: the selector's host hint; 0: T_total. */
  int64_t max_seq_len;
  /* Optional device scratch (appended: a shorter struct_size means none): NULL
   * with workspace_bytes 0, or 16-byte aligned with its size in bytes. With at least
   * kdajit_prefill_workspace_bytes(N, T_total, H) bytes the selector may pick
   * route twopass (docs/CONTRACT.md §11); the call may overwrite any of it.
   * Not read or written by other routes. */
  void* workspace;
  int64_t workspace_bytes;
} kdajit_chunk_args_t;

typedef enum kdajit_log_level {
  KDAJIT_LOG_DEFAULT = -1, /* KDAJIT_LOG, else info */
  KDAJIT_LOG_QUIET = 0,
  KDAJIT_LOG_INFO = 1,
  KDAJIT_LOG_DEBUG = 2
} kdajit_log_level_t;

/* Options of kdajit_runtime_create; kdajit_runtime_options_init() sets the
 * defaults (all NULL, device -1, log level default, use_tuning 1, pdl 0). */
typedef struct kdajit_runtime_options {
  /* sizeof(kdajit_runtime_options_t) of the caller's header: kdajit_runtime_options_init sets it. */
  size_t struct_size;
  const char* cache_dir; /* NULL: KDAJIT_CACHE_DIR, $XDG_CACHE_HOME/kdajit, ~/.cache/kdajit */
  const char* arch;      /* NULL: from the device; else e.g. "sm_90a" */
  /* -1: every call launches in its stream's context (for the null stream, the
   * current context); >= 0: the primary context of that device ordinal. */
  int32_t device;        /* -1: the device of the current context */
  kdajit_log_level_t log_level;
  /* NULL or "": the selector picks the route per call (§5). Else a route name
   * of `kdajit routes` that every call runs with; a call it cannot serve
   * exactly fails with UNSUPPORTED (for tests and benchmarks). */
  const char* route;
  /* 1: prefer a route table written by `kdajit tune` into the cache when one
   * matches this GPU, driver, NVRTC and kdajit; 0: the built-in bands only. */
  int32_t use_tuning;
  /* 1: launch with programmatic stream serialization (PDL): the kernel's
   * prologue overlaps the previous kernel on the stream, and it waits on the
   * grid dependency before reading anything that kernel may write. */
  int32_t pdl;
} kdajit_runtime_options_t;

/* A configuration for the static support query: the key fields of §5 that a
 * call would carry, minus the route (chosen by kdajit). */
typedef struct kdajit_config {
  /* sizeof(kdajit_config_t) of the caller's header: kdajit_config_init sets it. */
  size_t struct_size;
  kdajit_op_t op;
  /* < 1: INVALID_ARGUMENT; > 128: UNSUPPORTED. */
  int32_t heads;           /* 1..128 */
  kdajit_dtype_t state_dtype;  /* F32 or BF16 */
  kdajit_conv_layout_t conv_layout;
  /* Single: exactly 1; packed: < 1 INVALID_ARGUMENT, > 16 UNSUPPORTED;
   * prefill: exactly 64 (the chunk size its keys carry). */
  int32_t tokens;          /* T: 1 for single, 1..16 for packed, 64 for prefill */
  kdajit_gate_t gate;
  /* sm_90, sm_90a, sm_100a, sm_103a or sm_120a (another "sm_NN" name: UNSUPPORTED). */
  const char* arch;        /* e.g. "sm_90"; NULL: use device */
  /* -1 with arch NULL: the current context's device; with none, the only GPU
   * (INVALID_ARGUMENT on a machine of several: name an ordinal). */
  int32_t device;          /* used when arch is NULL: a CUDA device ordinal */
  /* The promise the calls will make (§3); the selector's input. */
  kdajit_indices_mode_t state_indices_mode;
  /* SM count the selector assumes; 0: the device's (when a GPU is present),
   * else the reference part of the arch (132 for sm_90/sm_90a, 148 for sm_100a). */
  int32_t sm_count;
} kdajit_config_t;

/* The exported names of the entry points that take the sized structs. The
 * *_init macros pass sizeof the caller's struct, so that init never writes
 * past what the caller has. */
#define kdajit_runtime_options_init(options) kdajit_runtime_options_init_v1((options), sizeof(*(options)))
#define kdajit_decode_args_init(args) kdajit_decode_args_init_v1((args), sizeof(*(args)))
#define kdajit_config_init(config) kdajit_config_init_v1((config), sizeof(*(config)))
#define kdajit_runtime_create kdajit_runtime_create_v1
#define kdajit_single_decode kdajit_single_decode_v1
#define kdajit_packed_decode kdajit_packed_decode_v1
#define kdajit_validate_args kdajit_validate_args_v1
#define kdajit_query_support kdajit_query_support_v1
#define kdajit_config_key kdajit_config_key_v1
#define kdajit_config_keys kdajit_config_keys_v1
#define kdajit_selected_key kdajit_selected_key_v1
#define kdajit_prefill_args_init(args) kdajit_prefill_args_init_v1((args), sizeof(*(args)))
#define kdajit_prefill kdajit_prefill_v1
#define kdajit_validate_prefill_args kdajit_validate_prefill_args_v1
#define kdajit_chunk_args_init(args) kdajit_chunk_args_init_v1((args), sizeof(*(args)))
#define kdajit_chunk kdajit_chunk_v1
#define kdajit_validate_chunk_args kdajit_validate_chunk_args_v1
#define kdajit_selected_prefill_key kdajit_selected_prefill_key_v1
#define kdajit_selected_chunk_key kdajit_selected_chunk_key_v1

typedef struct kdajit_runtime kdajit_runtime_t;
typedef struct CUstream_st* kdajit_stream_t; /* a CUstream / cudaStream_t */

KDAJIT_API const char* kdajit_version(void);
/* The library's tables as one JSON object, built once (NUL-terminated, owned by
 * the library, valid for the process; NULL only when out of memory):
 *   "version": kdajit_version();
 *   "enums": {"op", "dtype", "gate", "conv_layout", "indices_mode",
 *             "log_level", "status"}: each {spelling: the C enum value};
 *   "arches": [{"name", "compute_capability"}] (e.g. {"sm_90a", 90}), the
 *             spellings kdajit_config_t.arch and options.arch accept;
 *   "arch_for_compute_capability": {"9.0": "sm_90", ...}: the arch the runtime
 *             and the CLI build for on a device of that compute capability;
 *   "arch_without_device": the arch of keys named without a GPU ("sm_90");
 *   "routes": [{"name", "ops": [op spellings]}], as `kdajit routes`;
 *   "max_heads", "max_tokens": 128 and 16;
 *   "prefill_chunk": 64, the t of every prefill key.
 * The C enum numbers of this header are the ABI; the JSON maps spellings to them. */
KDAJIT_API const char* kdajit_tables_json(void);
KDAJIT_API const char* kdajit_status_string(kdajit_status_t status);
/* The calling thread's message for its last failed call ("" if none). */
KDAJIT_API const char* kdajit_last_error(void);
/* The detail of that failure ("" if none): for a compile, the options, the
 * NVRTC log and the failing source line. */
KDAJIT_API const char* kdajit_last_error_detail(void);

/* Writes the defaults (struct_size included) into the first struct_size bytes
 * of options; kdajit_runtime_options_init(options) passes sizeof(*options). */
KDAJIT_API void kdajit_runtime_options_init_v1(kdajit_runtime_options_t* options, size_t struct_size);
KDAJIT_API kdajit_status_t kdajit_runtime_create(const kdajit_runtime_options_t* options,
                                                 kdajit_runtime_t** runtime);
KDAJIT_API void kdajit_runtime_destroy(kdajit_runtime_t* runtime);

/* Zeroes args (every tensor empty), then sets struct_size, gate BOUNDED,
 * lower_bound -5, norm_eps 1e-6, state_indices_mode UNIQUE_OR_NULL and
 * oob_counter NULL: within the first struct_size bytes, as options_init. */
KDAJIT_API void kdajit_decode_args_init_v1(kdajit_decode_args_t* args, size_t struct_size);
/* Validate (§6), then launch on stream: one token per row (§2-§3), or up to T
 * tokens per sequence (§4). Never synchronise, allocate or read device memory
 * on the host; a compile needed while the stream captures a graph fails with
 * KDAJIT_ERROR_CAPTURE before anything is enqueued (§5). */
KDAJIT_API kdajit_status_t kdajit_single_decode(kdajit_runtime_t* runtime, const kdajit_decode_args_t* args,
                                                kdajit_stream_t stream);
KDAJIT_API kdajit_status_t kdajit_packed_decode(kdajit_runtime_t* runtime, const kdajit_decode_args_t* args,
                                                kdajit_stream_t stream);

/* Zeroes args, then sets struct_size, gate BOUNDED, lower_bound -5, norm_eps
 * 1e-6, max_seq_len 0 and oob_counter NULL, within the first struct_size bytes. */
KDAJIT_API void kdajit_prefill_args_init_v1(kdajit_prefill_args_t* args, size_t struct_size);
/* Validate (§10), then launch the chunked prefill of every sequence on stream:
 * conv, norms, gates, the delta rule from each slot's state, the final state
 * and conv history back to the slot, the gated RMSNorm into output. The same
 * rules as the decode calls: no synchronisation, allocation or device read on
 * the host; KDAJIT_ERROR_CAPTURE for a compile while the stream captures. */
KDAJIT_API kdajit_status_t kdajit_prefill(kdajit_runtime_t* runtime, const kdajit_prefill_args_t* args,
                                          kdajit_stream_t stream);
/* Validates prefill args against §10 without launching. */
KDAJIT_API kdajit_status_t kdajit_validate_prefill_args(const kdajit_prefill_args_t* args);
/* The workspace bytes route twopass needs for a prefill or chunk call of
 * num_seqs sequences, total_tokens rows and heads heads:
 * (num_seqs + ceil(total_tokens / 64)) * heads * 148096 (0 for no rows), or
 * INT64_MAX for negative arguments or a size past it. A host function of the
 * call's sizes: no device read, usable before a CUDA graph capture. */
KDAJIT_API int64_t kdajit_prefill_workspace_bytes(int64_t num_seqs, int64_t total_tokens, int64_t heads);

/* Zeroes args, then sets struct_size, gate BOUNDED, lower_bound -5, scale
 * 1/sqrt(128), qk_l2norm 1, beta_sigmoid 1, state_v_first 0 and max_seq_len 0,
 * within the first struct_size bytes. */
KDAJIT_API void kdajit_chunk_args_init_v1(kdajit_chunk_args_t* args, size_t struct_size);
/* Validate (§11), then launch the chunked delta rule of every sequence on
 * stream: from initial_state (or zero), output o, the final state into
 * final_state. The calls' rules: no synchronisation, allocation or device read
 * on the host; KDAJIT_ERROR_CAPTURE for a compile while the stream captures. */
KDAJIT_API kdajit_status_t kdajit_chunk(kdajit_runtime_t* runtime, const kdajit_chunk_args_t* args,
                                        kdajit_stream_t stream);
/* Validates chunk args against §11 without launching. */
KDAJIT_API kdajit_status_t kdajit_validate_chunk_args(const kdajit_chunk_args_t* args);
/* Validates args against the contract (docs/CONTRACT.md §6) without launching. */
KDAJIT_API kdajit_status_t kdajit_validate_args(kdajit_op_t op, const kdajit_decode_args_t* args);

/* Supported or not, and why, without compiling or touching the GPU (unless
 * config->arch is NULL, when the device's compute capability is read). It runs
 * the same validation as a call, on a synthetic call of this configuration.
 * reason may be NULL; it receives "" when supported. */
KDAJIT_API kdajit_status_t kdajit_query_support(const kdajit_config_t* config, char* reason, size_t reason_size);

/* Defaults: single, 64 heads, f32, SD, T = 1, bounded, arch NULL, device -1,
 * UNIQUE_OR_NULL, sm_count 0: within the first struct_size bytes, as
 * options_init. */
KDAJIT_API void kdajit_config_init_v1(kdajit_config_t* config, size_t struct_size);

/* The kernel key name (e.g. "kda_single.h64.state_f32.conv_sd.t1.gate_bounded.
 * route_rowcta.sm_90") the built-in selector picks for config at `rows` rows
 * (single op) or sequences (packed and prefill ops; for prefill, N sequences of
 * 64 tokens each: its pick also depends on the prompt lengths, and
 * kdajit_config_keys lists every route it can pick). A name longer than
 * key_name_size is an INVALID_ARGUMENT. */
KDAJIT_API kdajit_status_t kdajit_config_key(const kdajit_config_t* config, int64_t rows, char* key_name,
                                             size_t key_name_size);

/* Every kernel key name the selector can pick for config at any rows,
 * newline-separated, NUL-terminated. *needed (required) receives the bytes
 * needed including the NUL; call with buf NULL to size it. */
KDAJIT_API kdajit_status_t kdajit_config_keys(const kdajit_config_t* config, char* buf, size_t buf_size,
                                              size_t* needed);

/* Makes sure kernel key_name is in the runtime's cache, compiling it with NVRTC
 * when missing (no GPU needed). *compiled (may be NULL) receives 1 when this
 * call compiled it, 0 when it was cached. */
KDAJIT_API kdajit_status_t kdajit_runtime_prewarm(kdajit_runtime_t* runtime, const char* key_name,
                                                  int32_t* compiled);

/* Compiles the newline-separated kernel key names into the runtime's cache in
 * `threads` background threads (0: 1) and returns at once; names are checked
 * first (a bad one queues nothing). Calls run meanwhile on what is ready; a
 * call whose key is compiling waits for that compile instead of starting one. */
KDAJIT_API kdajit_status_t kdajit_runtime_prewarm_async(kdajit_runtime_t* runtime, const char* key_names,
                                                        uint32_t threads);
/* Blocks until every key given to kdajit_runtime_prewarm_async is done. */
KDAJIT_API kdajit_status_t kdajit_runtime_wait_prewarm(kdajit_runtime_t* runtime);

/* The runtime's counters, in this order, into values[0 .. count-1] (count <=
 * KDAJIT_RUNTIME_STAT_COUNT; a newer library may count more):
 * serving compiles (cache misses a call compiled), their total wall time in
 * microseconds, kernels a call loaded from disk, kernels a call found in memory,
 * keys pre-warmed in the background that compiled, that failed, still pending. */
#define KDAJIT_RUNTIME_STAT_COUNT 7
KDAJIT_API kdajit_status_t kdajit_runtime_stats(kdajit_runtime_t* runtime, uint64_t* values, size_t count);

/* The kernel key name a call with these args would launch on stream:
 * validation and route selection (which reads the stream's device once);
 * nothing is compiled or launched. op is SINGLE or PACKED (PREFILL and CHUNK:
 * INVALID_ARGUMENT; their args are other structs: kdajit_selected_prefill_key,
 * kdajit_selected_chunk_key). */
KDAJIT_API kdajit_status_t kdajit_selected_key(kdajit_runtime_t* runtime, kdajit_op_t op,
                                               const kdajit_decode_args_t* args, kdajit_stream_t stream,
                                               char* key_name, size_t key_name_size);

/* The same for a prefill call (its args a kdajit_prefill_args_t; the route
 * also depends on max_seq_len) and for a chunk call. */
KDAJIT_API kdajit_status_t kdajit_selected_prefill_key(kdajit_runtime_t* runtime, const kdajit_prefill_args_t* args,
                                                       kdajit_stream_t stream, char* key_name, size_t key_name_size);
KDAJIT_API kdajit_status_t kdajit_selected_chunk_key(kdajit_runtime_t* runtime, const kdajit_chunk_args_t* args,
                                                     kdajit_stream_t stream, char* key_name, size_t key_name_size);

/* A candidate path to the NVRTC library, tried after KDAJIT_NVRTC and before the
 * system's (the Python package passes its environment's nvidia NVRTC). Only
 * before the first compile; INVALID_ARGUMENT after it or for NULL. */
KDAJIT_API kdajit_status_t kdajit_add_nvrtc_candidate(const char* path);

#ifdef __cplusplus
}
#endif

#endif /* KDAJIT_KDAJIT_H */
