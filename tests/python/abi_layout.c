/* Prints the C layout of the structs that python/kdajit/_abi.py mirrors with
 * ctypes, one line per struct ("NAME size N") and per field ("NAME.FIELD
 * offset size"), after the header's version ("version X.Y.Z").
 * tests/python/test_abi.py compares them with ctypes. A field added to the
 * header and not here still shows up as a size mismatch. */
#include <stddef.h>
#include <stdio.h>

#include "kdajit/kdajit.h"

#define STRUCT(T) printf(#T " size %zu\n", sizeof(T))
#define FIELD(T, F) printf(#T "." #F " %zu %zu\n", offsetof(T, F), sizeof(((T*)0)->F))

int main(void) {
  printf("version %s\n", KDAJIT_VERSION_STRING);
  STRUCT(kdajit_tensor_t);
  FIELD(kdajit_tensor_t, data);
  FIELD(kdajit_tensor_t, dtype);
  FIELD(kdajit_tensor_t, ndim);
  FIELD(kdajit_tensor_t, shape);
  FIELD(kdajit_tensor_t, strides);

  STRUCT(kdajit_decode_args_t);
  FIELD(kdajit_decode_args_t, struct_size);
  FIELD(kdajit_decode_args_t, x);
  FIELD(kdajit_decode_args_t, conv_weight);
  FIELD(kdajit_decode_args_t, conv_state);
  FIELD(kdajit_decode_args_t, raw_gate);
  FIELD(kdajit_decode_args_t, raw_beta);
  FIELD(kdajit_decode_args_t, A_log);
  FIELD(kdajit_decode_args_t, dt_bias);
  FIELD(kdajit_decode_args_t, state_indices);
  FIELD(kdajit_decode_args_t, state);
  FIELD(kdajit_decode_args_t, output_gate);
  FIELD(kdajit_decode_args_t, norm_weight);
  FIELD(kdajit_decode_args_t, output);
  FIELD(kdajit_decode_args_t, query_start_loc);
  FIELD(kdajit_decode_args_t, num_accepted_tokens);
  FIELD(kdajit_decode_args_t, gate);
  FIELD(kdajit_decode_args_t, lower_bound);
  FIELD(kdajit_decode_args_t, norm_eps);
  FIELD(kdajit_decode_args_t, state_indices_mode);
  FIELD(kdajit_decode_args_t, oob_counter);

  STRUCT(kdajit_prefill_args_t);
  FIELD(kdajit_prefill_args_t, struct_size);
  FIELD(kdajit_prefill_args_t, x);
  FIELD(kdajit_prefill_args_t, conv_weight);
  FIELD(kdajit_prefill_args_t, conv_state);
  FIELD(kdajit_prefill_args_t, raw_gate);
  FIELD(kdajit_prefill_args_t, raw_beta);
  FIELD(kdajit_prefill_args_t, A_log);
  FIELD(kdajit_prefill_args_t, dt_bias);
  FIELD(kdajit_prefill_args_t, state_indices);
  FIELD(kdajit_prefill_args_t, has_initial_state);
  FIELD(kdajit_prefill_args_t, state);
  FIELD(kdajit_prefill_args_t, output_gate);
  FIELD(kdajit_prefill_args_t, norm_weight);
  FIELD(kdajit_prefill_args_t, output);
  FIELD(kdajit_prefill_args_t, query_start_loc);
  FIELD(kdajit_prefill_args_t, gate);
  FIELD(kdajit_prefill_args_t, lower_bound);
  FIELD(kdajit_prefill_args_t, norm_eps);
  FIELD(kdajit_prefill_args_t, max_seq_len);
  FIELD(kdajit_prefill_args_t, oob_counter);
  FIELD(kdajit_prefill_args_t, workspace);
  FIELD(kdajit_prefill_args_t, workspace_bytes);

  STRUCT(kdajit_chunk_args_t);
  FIELD(kdajit_chunk_args_t, struct_size);
  FIELD(kdajit_chunk_args_t, q);
  FIELD(kdajit_chunk_args_t, k);
  FIELD(kdajit_chunk_args_t, v);
  FIELD(kdajit_chunk_args_t, g);
  FIELD(kdajit_chunk_args_t, beta);
  FIELD(kdajit_chunk_args_t, A_log);
  FIELD(kdajit_chunk_args_t, dt_bias);
  FIELD(kdajit_chunk_args_t, initial_state);
  FIELD(kdajit_chunk_args_t, final_state);
  FIELD(kdajit_chunk_args_t, output);
  FIELD(kdajit_chunk_args_t, cu_seqlens);
  FIELD(kdajit_chunk_args_t, gate);
  FIELD(kdajit_chunk_args_t, lower_bound);
  FIELD(kdajit_chunk_args_t, scale);
  FIELD(kdajit_chunk_args_t, qk_l2norm);
  FIELD(kdajit_chunk_args_t, beta_sigmoid);
  FIELD(kdajit_chunk_args_t, state_v_first);
  FIELD(kdajit_chunk_args_t, max_seq_len);
  FIELD(kdajit_chunk_args_t, workspace);
  FIELD(kdajit_chunk_args_t, workspace_bytes);

  STRUCT(kdajit_runtime_options_t);
  FIELD(kdajit_runtime_options_t, struct_size);
  FIELD(kdajit_runtime_options_t, cache_dir);
  FIELD(kdajit_runtime_options_t, arch);
  FIELD(kdajit_runtime_options_t, device);
  FIELD(kdajit_runtime_options_t, log_level);
  FIELD(kdajit_runtime_options_t, route);
  FIELD(kdajit_runtime_options_t, use_tuning);
  FIELD(kdajit_runtime_options_t, pdl);

  STRUCT(kdajit_config_t);
  FIELD(kdajit_config_t, struct_size);
  FIELD(kdajit_config_t, op);
  FIELD(kdajit_config_t, heads);
  FIELD(kdajit_config_t, state_dtype);
  FIELD(kdajit_config_t, conv_layout);
  FIELD(kdajit_config_t, tokens);
  FIELD(kdajit_config_t, gate);
  FIELD(kdajit_config_t, arch);
  FIELD(kdajit_config_t, device);
  FIELD(kdajit_config_t, state_indices_mode);
  FIELD(kdajit_config_t, sm_count);
  return 0;
}
