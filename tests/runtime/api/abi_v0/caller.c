/* A C99 caller built against the 0.1.0 header (abi_v0/kdajit/kdajit.h: the
 * header before the structs had struct_size, kept as it was) and linked with
 * today's libkdajit.so: the library must read and write the 0.1.0 structs
 * exactly, every field at its 0.1.0 offset and nothing past their end.
 * Usage: test_abi_v0_caller CACHE_DIR (a directory the runtime may create). */
#include "kdajit/kdajit.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(kdajit_runtime_create) || defined(kdajit_decode_args_init)
#error "built against today's kdajit.h; this caller needs the 0.1.0 header of abi_v0/"
#endif

static int failures = 0;

#define EXPECT(cond)                                                  \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                     \
    }                                                                 \
  } while (0)

#define CANARY 0xA5
#define SLACK 64

/* Whether the SLACK bytes after a struct of `size` bytes at p are untouched. */
static int tail_untouched(const unsigned char* p, size_t size) {
  size_t i;
  for (i = size; i < size + SLACK; ++i)
    if (p[i] != CANARY) return 0;
  return 1;
}

static int has(const char* text, const char* part) { return strstr(text, part) != NULL; }

/* Host views for validation (it only reads the views), placed in one arena. */
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
  int64_t x_sh[2], x_st[2], w_sh[3], w_st[3], c_sh[3], c_st[3], r_sh[3], r_st[3], b_sh[2], b_st[2];
  int64_t h_sh[1], one[1], hd_sh[1], s_sh[4], s_st[4], d_sh[1], i_sh[1];
  x_sh[0] = R, x_sh[1] = qkv, x_st[0] = qkv, x_st[1] = 1;
  w_sh[0] = 3, w_sh[1] = 4, w_sh[2] = hidden, w_st[0] = 4 * hidden, w_st[1] = hidden, w_st[2] = 1;
  c_sh[0] = S, c_sh[1] = qkv, c_sh[2] = 3, c_st[0] = qkv * 3, c_st[1] = 1, c_st[2] = qkv;
  r_sh[0] = R, r_sh[1] = H, r_sh[2] = D, r_st[0] = hidden, r_st[1] = D, r_st[2] = 1;
  b_sh[0] = R, b_sh[1] = H, b_st[0] = H, b_st[1] = 1;
  h_sh[0] = H, one[0] = 1, hd_sh[0] = hidden, d_sh[0] = D, i_sh[0] = R;
  s_sh[0] = S, s_sh[1] = H, s_sh[2] = D, s_sh[3] = D, s_st[0] = H * D * D, s_st[1] = D * D, s_st[2] = D, s_st[3] = 1;
  kdajit_decode_args_init(a);
  a->x = view(KDAJIT_DTYPE_BF16, 2, x_sh, x_st);
  a->conv_weight = view(KDAJIT_DTYPE_F32, 3, w_sh, w_st);
  a->conv_state = view(KDAJIT_DTYPE_BF16, 3, c_sh, c_st);
  a->raw_gate = view(KDAJIT_DTYPE_BF16, 3, r_sh, r_st);
  a->raw_beta = view(KDAJIT_DTYPE_BF16, 2, b_sh, b_st);
  a->A_log = view(KDAJIT_DTYPE_F32, 1, h_sh, one);
  a->dt_bias = view(KDAJIT_DTYPE_F32, 1, hd_sh, one);
  a->state_indices = view(KDAJIT_DTYPE_INT32, 1, i_sh, one);
  a->state = view(KDAJIT_DTYPE_F32, 4, s_sh, s_st);
  a->output_gate = view(KDAJIT_DTYPE_BF16, 3, r_sh, r_st);
  a->norm_weight = view(KDAJIT_DTYPE_F32, 1, d_sh, one);
  a->output = view(KDAJIT_DTYPE_BF16, 3, r_sh, r_st);
}

static void check_inits(void) {
  static unsigned char buf[sizeof(kdajit_decode_args_t) + SLACK];
  const kdajit_runtime_options_t* o = (const kdajit_runtime_options_t*)(void*)buf;
  const kdajit_config_t* c = (const kdajit_config_t*)(void*)buf;
  const kdajit_decode_args_t* a = (const kdajit_decode_args_t*)(void*)buf;

  memset(buf, CANARY, sizeof buf);
  kdajit_runtime_options_init((kdajit_runtime_options_t*)(void*)buf);
  EXPECT(tail_untouched(buf, sizeof(kdajit_runtime_options_t)));
  EXPECT(o->cache_dir == NULL && o->arch == NULL && o->route == NULL);
  EXPECT(o->device == -1 && o->log_level == KDAJIT_LOG_DEFAULT && o->use_tuning == 1 && o->pdl == 0);

  memset(buf, CANARY, sizeof buf);
  kdajit_config_init((kdajit_config_t*)(void*)buf);
  EXPECT(tail_untouched(buf, sizeof(kdajit_config_t)));
  EXPECT(c->op == KDAJIT_OP_SINGLE && c->heads == 64 && c->tokens == 1 && c->arch == NULL && c->device == -1);
  EXPECT(c->state_indices_mode == KDAJIT_INDICES_UNIQUE_OR_NULL && c->sm_count == 0);

  memset(buf, CANARY, sizeof buf);
  kdajit_decode_args_init((kdajit_decode_args_t*)(void*)buf);
  EXPECT(tail_untouched(buf, sizeof(kdajit_decode_args_t)));
  EXPECT(a->x.data == NULL && a->x.ndim == 0 && a->num_accepted_tokens.ndim == 0);
  EXPECT(a->gate == KDAJIT_GATE_BOUNDED && a->lower_bound == -5.0f && a->norm_eps == 1e-6f);
  EXPECT(a->state_indices_mode == KDAJIT_INDICES_UNIQUE_OR_NULL && a->oob_counter == NULL);
}

/* Every option is read at its 0.1.0 offset: each bad value is named. */
static kdajit_runtime_t* check_runtime(const char* cache_dir) {
  kdajit_runtime_options_t o;
  kdajit_runtime_t* rt = NULL;
  kdajit_runtime_options_init(&o);
  o.cache_dir = cache_dir;
  o.log_level = KDAJIT_LOG_QUIET;
  o.route = "fastest";
  EXPECT(kdajit_runtime_create(&o, &rt) == KDAJIT_ERROR_INVALID_ARGUMENT && rt == NULL);
  EXPECT(has(kdajit_last_error(), "options.route"));
  o.route = "rowcta";
  o.use_tuning = 2;
  EXPECT(kdajit_runtime_create(&o, &rt) == KDAJIT_ERROR_INVALID_ARGUMENT);
  EXPECT(has(kdajit_last_error(), "options.use_tuning: expected 0 or 1, got 2"));
  o.use_tuning = 0;
  o.pdl = 3;
  EXPECT(kdajit_runtime_create(&o, &rt) == KDAJIT_ERROR_INVALID_ARGUMENT);
  EXPECT(has(kdajit_last_error(), "options.pdl: expected 0 or 1, got 3"));
  o.pdl = 0;
  o.arch = "sm_89";
  EXPECT(kdajit_runtime_create(&o, &rt) == KDAJIT_ERROR_INVALID_ARGUMENT);
  EXPECT(has(kdajit_last_error(), "options.arch"));
  o.arch = "sm_90";
  EXPECT(kdajit_runtime_create(&o, &rt) == KDAJIT_OK && rt != NULL);
  if (rt == NULL) fprintf(stderr, "kdajit_runtime_create: %s\n", kdajit_last_error());
  return rt;
}

static void check_config(void) {
  kdajit_config_t c;
  char name[256], reason[256], keys[1024];
  size_t needed = 0;
  kdajit_config_init(&c);
  c.heads = 8;
  c.arch = "sm_90";
  EXPECT(kdajit_config_key(&c, 1, name, sizeof name) == KDAJIT_OK);
  EXPECT(strcmp(name, "kda_single.h8.state_f32.conv_sd.t1.gate_bounded.route_split4.sm_90") == 0);
  c.state_dtype = KDAJIT_DTYPE_BF16;
  c.conv_layout = KDAJIT_CONV_DS;
  c.gate = KDAJIT_GATE_SOFTPLUS;
  c.state_indices_mode = KDAJIT_INDICES_REPEATED_POSITIVE;
  EXPECT(kdajit_config_keys(&c, keys, sizeof keys, &needed) == KDAJIT_OK);
  EXPECT(strcmp(keys, "kda_single.h8.state_bf16.conv_ds.t1.gate_softplus.route_sequential.sm_90") == 0);
  EXPECT(kdajit_query_support(&c, reason, sizeof reason) == KDAJIT_OK);
  c.state_indices_mode = KDAJIT_INDICES_UNIQUE_OR_NULL;
  c.op = KDAJIT_OP_PACKED;
  c.tokens = 17;
  EXPECT(kdajit_query_support(&c, reason, sizeof reason) == KDAJIT_ERROR_UNSUPPORTED);
  c.tokens = 4;
  c.sm_count = -1;
  EXPECT(kdajit_query_support(&c, reason, sizeof reason) == KDAJIT_ERROR_INVALID_ARGUMENT);
  EXPECT(has(reason, "sm_count"));
}

static void check_decode(kdajit_runtime_t* rt) {
  kdajit_decode_args_t a;
  char name[256];
  make_args(&a);
  EXPECT(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_OK);
  if (kdajit_last_error()[0]) fprintf(stderr, "kdajit_validate_args: %s\n", kdajit_last_error());
  a.oob_counter = (int32_t*)(uintptr_t)0x1002;
  EXPECT(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  EXPECT(has(kdajit_last_error(), "oob_counter: expected NULL or an int32 pointer aligned to 4 bytes, got 0x1002"));
  a.oob_counter = NULL;
  a.norm_eps = -1.0f;
  EXPECT(kdajit_validate_args(KDAJIT_OP_SINGLE, &a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  EXPECT(has(kdajit_last_error(), "norm_eps"));
  a.norm_eps = 1e-6f;
  a.num_accepted_tokens.ndim = 1; /* the packed op reads it: its last tensor */
  EXPECT(kdajit_validate_args(KDAJIT_OP_PACKED, &a) == KDAJIT_ERROR_INVALID_ARGUMENT);
  a.raw_gate.shape[2] = 64;
  EXPECT(kdajit_single_decode(rt, &a, NULL) == KDAJIT_ERROR_INVALID_ARGUMENT);
  EXPECT(has(kdajit_last_error(), "raw_gate"));
  EXPECT(kdajit_packed_decode(rt, &a, NULL) == KDAJIT_ERROR_INVALID_ARGUMENT);
  EXPECT(kdajit_selected_key(rt, KDAJIT_OP_SINGLE, &a, NULL, name, sizeof name) == KDAJIT_ERROR_INVALID_ARGUMENT);
  EXPECT(has(kdajit_last_error(), "raw_gate"));
}

int main(int argc, char** argv) {
  kdajit_runtime_t* rt;
  unsigned char* storage = (unsigned char*)malloc((size_t)1 << 21);
  if (argc != 2 || !storage) {
    fprintf(stderr, "usage: test_abi_v0_caller CACHE_DIR\n");
    return 2;
  }
  arena = (unsigned char*)(((uintptr_t)storage + 255) / 256 * 256);
  printf("0.1.0 header: sizeof options %u, args %u, config %u; library %s\n",
         (unsigned)sizeof(kdajit_runtime_options_t), (unsigned)sizeof(kdajit_decode_args_t),
         (unsigned)sizeof(kdajit_config_t), kdajit_version());
  check_inits();
  rt = check_runtime(argv[1]);
  check_config();
  if (rt) {
    check_decode(rt);
    kdajit_runtime_destroy(rt);
  }
  free(storage);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("a 0.1.0 caller: all checks passed\n");
  return 0;
}
