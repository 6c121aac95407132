/* A C99 program built against the installed kdajit package: the CPU-side
 * entry points (version, support query, argument validation, last error). */
#include <kdajit/kdajit.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define EXPECT(cond)                                                   \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);  \
      ++failures;                                                      \
    }                                                                  \
  } while (0)

/* Places tensors in one host buffer: validation only reads the views. */
static unsigned char* arena;
static size_t arena_used;

static kdajit_tensor_t view(kdajit_dtype_t dtype, int32_t ndim, const int64_t* shape, const int64_t* strides) {
  kdajit_tensor_t t;
  int64_t last = 0;
  int32_t d;
  memset(&t, 0, sizeof t);
  t.dtype = dtype;
  t.ndim = ndim;
  for (d = 0; d < ndim; ++d) {
    t.shape[d] = shape[d];
    t.strides[d] = strides[d];
    last += (shape[d] - 1) * strides[d];
  }
  arena_used = (arena_used + 255) / 256 * 256;
  t.data = arena + arena_used;
  arena_used += (size_t)(last + 1) * (dtype == KDAJIT_DTYPE_BF16 ? 2 : 4);
  return t;
}

/* A valid single-token call: H = 2, R = 3, S = 4, f32 state, SD conv layout. */
static void make_args(kdajit_decode_args_t* a) {
  const int64_t H = 2, D = 128, R = 3, S = 4, hidden = 2 * 128, qkv = 3 * 2 * 128;
  const kdajit_dtype_t bf16 = KDAJIT_DTYPE_BF16, f32 = KDAJIT_DTYPE_F32, i32 = KDAJIT_DTYPE_INT32;
  kdajit_decode_args_init(a);
  {
    int64_t sh[] = {R, qkv}, st[] = {qkv, 1};
    a->x = view(bf16, 2, sh, st);
  }
  {
    int64_t sh[] = {3, 4, hidden}, st[] = {4 * hidden, hidden, 1};
    a->conv_weight = view(f32, 3, sh, st);
  }
  {
    int64_t sh[] = {S, qkv, 3}, st[] = {qkv * 3, 1, qkv};
    a->conv_state = view(bf16, 3, sh, st);
  }
  {
    int64_t sh[] = {R, H, D}, st[] = {hidden, D, 1};
    a->raw_gate = view(bf16, 3, sh, st);
    a->output_gate = view(bf16, 3, sh, st);
    a->output = view(bf16, 3, sh, st);
  }
  {
    int64_t sh[] = {R, H}, st[] = {H, 1};
    a->raw_beta = view(bf16, 2, sh, st);
  }
  {
    int64_t sh[] = {H}, st[] = {1};
    a->A_log = view(f32, 1, sh, st);
  }
  {
    int64_t sh[] = {hidden}, st[] = {1};
    a->dt_bias = view(f32, 1, sh, st);
  }
  {
    int64_t sh[] = {R}, st[] = {1};
    a->state_indices = view(i32, 1, sh, st);
  }
  {
    int64_t sh[] = {S, H, D, D}, st[] = {H * D * D, D * D, D, 1};
    a->state = view(f32, 4, sh, st);
  }
  {
    int64_t sh[] = {D}, st[] = {1};
    a->norm_weight = view(f32, 1, sh, st);
  }
  a->gate = KDAJIT_GATE_BOUNDED;
  a->lower_bound = -5.0f;
  a->norm_eps = 1e-6f;
  a->state_indices_mode = KDAJIT_INDICES_UNIQUE_OR_NULL;
  a->oob_counter = NULL;
}

int main(void) {
  kdajit_config_t config;
  kdajit_decode_args_t args;
  char reason[512];
  char version_prefix[32];
  const char* version = kdajit_version();
  unsigned char* storage = (unsigned char*)malloc((size_t)1 << 21);
  if (!storage) return 2;
  arena = (unsigned char*)(((uintptr_t)storage + 255) / 256 * 256);

  /* The library and this header agree on the version. */
  EXPECT(version != NULL && version[0] != '\0');
  sprintf(version_prefix, "%d.%d", KDAJIT_VERSION_MAJOR, KDAJIT_VERSION_MINOR);
  EXPECT(version != NULL && strstr(version, version_prefix) != NULL);
  EXPECT(kdajit_status_string(KDAJIT_ERROR_INVALID_ARGUMENT) != NULL);

  kdajit_config_init(&config);
  EXPECT(config.struct_size == sizeof config);
  config.op = KDAJIT_OP_SINGLE;
  config.heads = 16;
  config.state_dtype = KDAJIT_DTYPE_F32;
  config.conv_layout = KDAJIT_CONV_SD;
  config.tokens = 1;
  config.gate = KDAJIT_GATE_BOUNDED;
  config.arch = "sm_90";
  config.device = 0;
  strcpy(reason, "unchanged");
  EXPECT(kdajit_query_support(&config, reason, sizeof reason) == KDAJIT_OK);
  EXPECT(reason[0] == '\0');
  EXPECT(kdajit_query_support(&config, NULL, 0) == KDAJIT_OK);

  config.heads = 0;
  {
    kdajit_status_t s = kdajit_query_support(&config, reason, sizeof reason);
    EXPECT(s == KDAJIT_ERROR_INVALID_ARGUMENT || s == KDAJIT_ERROR_UNSUPPORTED);
    EXPECT(strstr(reason, "heads") != NULL);
    printf("H = 0: %s\n", reason);
  }

  make_args(&args);
  EXPECT(kdajit_validate_args(KDAJIT_OP_SINGLE, &args) == KDAJIT_OK);
  args.raw_gate.shape[2] = 64;
  EXPECT(kdajit_validate_args(KDAJIT_OP_SINGLE, &args) == KDAJIT_ERROR_INVALID_ARGUMENT);
  EXPECT(strstr(kdajit_last_error(), "raw_gate") != NULL);
  printf("raw_gate [3, 2, 64]: %s\n", kdajit_last_error());

  free(storage);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("kdajit %s: all consumer checks passed\n", version);
  return 0;
}
