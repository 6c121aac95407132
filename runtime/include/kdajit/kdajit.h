/* kdajit: JIT-compiled fused KDA (Kimi Delta Attention) decode kernels.
 * The C ABI. Every function returns a kdajit_status_t; on failure the
 * calling thread's message is available from kdajit_last_error().
 * Contract: docs in the repository, spec "KDA decode contract". */
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

#define KDAJIT_VERSION_MAJOR 0
#define KDAJIT_VERSION_MINOR 1
#define KDAJIT_VERSION_PATCH 0

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

/* Element types of tensor views. */
typedef enum kdajit_dtype {
  KDAJIT_DTYPE_F32 = 0,
  KDAJIT_DTYPE_BF16 = 1,
  KDAJIT_DTYPE_INT32 = 2
} kdajit_dtype_t;

typedef enum kdajit_gate {
  KDAJIT_GATE_BOUNDED = 0,  /* gv = lower_bound * sigmoid(A * g) */
  KDAJIT_GATE_SOFTPLUS = 1  /* gv = -A * softplus(g) */
} kdajit_gate_t;

typedef enum kdajit_conv_layout {
  KDAJIT_CONV_SD = 0, /* conv_state strides (slot, 1, qkv): taps slow */
  KDAJIT_CONV_DS = 1  /* conv_state strides (slot, K, 1): taps contiguous per channel */
} kdajit_conv_layout_t;

typedef enum kdajit_op {
  KDAJIT_OP_SINGLE = 0, /* one token per row */
  KDAJIT_OP_PACKED = 1  /* T >= 1 tokens per sequence (draft verify) */
} kdajit_op_t;

/* A host-side promise about state_indices (spec section 3). */
typedef enum kdajit_indices_mode {
  KDAJIT_INDICES_UNIQUE_OR_NULL = 0,   /* default: positive slots distinct, nulls allowed */
  KDAJIT_INDICES_POSITIVE_UNIQUE = 1,  /* every slot > 0 and distinct */
  KDAJIT_INDICES_REPEATED_POSITIVE = 2 /* slots may repeat; rows apply in row order */
} kdajit_indices_mode_t;

#define KDAJIT_MAX_DIMS 4

/* A strided tensor view: the fields of a DLPack DLTensor that matter here.
 * Shapes and strides are in elements. data is a device pointer for the decode
 * calls and a host pointer for the reference. */
typedef struct kdajit_tensor {
  void* data;
  kdajit_dtype_t dtype;
  int32_t ndim;
  int64_t shape[KDAJIT_MAX_DIMS];
  int64_t strides[KDAJIT_MAX_DIMS];
} kdajit_tensor_t;

/* Arguments of both decode ops. The packed op also reads query_start_loc and
 * num_accepted_tokens; the single op ignores them. */
typedef struct kdajit_decode_args {
  kdajit_tensor_t x;                   /* [R, 3*H*128] bf16 */
  kdajit_tensor_t conv_weight;         /* [3, 4, H*128] f32 */
  kdajit_tensor_t conv_state;          /* [S, 3*H*128, K] bf16, SD or DS strides */
  kdajit_tensor_t raw_gate;            /* [R, H, 128] bf16 */
  kdajit_tensor_t raw_beta;            /* [R, H] bf16 */
  kdajit_tensor_t A_log;               /* [H] f32 */
  kdajit_tensor_t dt_bias;             /* [H*128] f32 */
  kdajit_tensor_t state_indices;       /* single: [R]; packed: [N, T] int32 */
  kdajit_tensor_t state;               /* [S, H, 128, 128] f32 or bf16 */
  kdajit_tensor_t output_gate;         /* [R, H, 128] bf16 */
  kdajit_tensor_t norm_weight;         /* [128] f32 */
  kdajit_tensor_t output;              /* [R, H, 128] bf16, written */
  kdajit_tensor_t query_start_loc;     /* packed: [N + 1] int32 */
  kdajit_tensor_t num_accepted_tokens; /* packed: [N] int32 */
  kdajit_gate_t gate;
  float lower_bound; /* bounded gate: finite and < 0 */
  float norm_eps;    /* >= 0 */
  kdajit_indices_mode_t state_indices_mode;
  int32_t* oob_counter; /* optional device int32: += number of out-of-range slots seen */
} kdajit_decode_args_t;

typedef enum kdajit_log_level {
  KDAJIT_LOG_DEFAULT = -1, /* KDAJIT_LOG, else info */
  KDAJIT_LOG_QUIET = 0,
  KDAJIT_LOG_INFO = 1,
  KDAJIT_LOG_DEBUG = 2
} kdajit_log_level_t;

typedef struct kdajit_runtime_options {
  const char* cache_dir; /* NULL: KDAJIT_CACHE_DIR, $XDG_CACHE_HOME/kdajit, ~/.cache/kdajit */
  const char* arch;      /* NULL: from the device; else e.g. "sm_90a" */
  int32_t device;        /* -1: the device of the current context */
  kdajit_log_level_t log_level;
} kdajit_runtime_options_t;

/* A configuration for the static support query. */
typedef struct kdajit_config {
  kdajit_op_t op;
  int32_t heads;           /* 1..128 */
  kdajit_dtype_t state_dtype;  /* F32 or BF16 */
  kdajit_conv_layout_t conv_layout;
  int32_t tokens;          /* T: 1 for single, 1..16 for packed */
  kdajit_gate_t gate;
  const char* arch;        /* e.g. "sm_90"; NULL: use device */
  int32_t device;          /* used when arch is NULL: a CUDA device ordinal */
} kdajit_config_t;

typedef struct kdajit_runtime kdajit_runtime_t;
typedef struct CUstream_st* kdajit_stream_t; /* a CUstream / cudaStream_t */

KDAJIT_API const char* kdajit_version(void);
KDAJIT_API const char* kdajit_status_string(kdajit_status_t status);
/* The calling thread's message for its last failed call ("" if none). */
KDAJIT_API const char* kdajit_last_error(void);

KDAJIT_API void kdajit_runtime_options_init(kdajit_runtime_options_t* options);
KDAJIT_API kdajit_status_t kdajit_runtime_create(const kdajit_runtime_options_t* options,
                                                 kdajit_runtime_t** runtime);
KDAJIT_API void kdajit_runtime_destroy(kdajit_runtime_t* runtime);

KDAJIT_API void kdajit_decode_args_init(kdajit_decode_args_t* args);
KDAJIT_API kdajit_status_t kdajit_single_decode(kdajit_runtime_t* runtime, const kdajit_decode_args_t* args,
                                                kdajit_stream_t stream);
KDAJIT_API kdajit_status_t kdajit_packed_decode(kdajit_runtime_t* runtime, const kdajit_decode_args_t* args,
                                                kdajit_stream_t stream);

/* Validates args against the contract (spec section 6) without launching. */
KDAJIT_API kdajit_status_t kdajit_validate_args(kdajit_op_t op, const kdajit_decode_args_t* args);

/* Supported or not, and why, without compiling or touching the GPU (unless
 * config->arch is NULL, when the device's compute capability is read).
 * reason may be NULL; it receives "" when supported. */
KDAJIT_API kdajit_status_t kdajit_query_support(const kdajit_config_t* config, char* reason, size_t reason_size);

#ifdef __cplusplus
}
#endif

#endif /* KDAJIT_KDAJIT_H */
