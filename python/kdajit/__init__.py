"""kdajit: JIT-compiled fused KDA (Kimi Delta Attention) decode and prefill kernels for PyTorch.

    import kdajit
    out = kdajit.fused_kda_decode(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias,
                                  state_indices, state, output_gate, norm_weight)
    out = kdajit.fused_kda_prefill(x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias,
                                   state_indices, state, output_gate, norm_weight, query_start_loc)
    o, ht = kdajit.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                             use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                             use_beta_sigmoid_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
                             lower_bound=-5.0, cu_seqlens=cu_seqlens)

The decode and prefill ops take FlashInfer's arguments in FlashInfer's order, and
chunk_kda those of FLA's chunk_kda, so an engine switches by changing the import.
Python over libkdajit.so's C ABI (ctypes); a decode call whose tensor layout was
seen before takes a C++ path (kdajit._hotpath, built with the library when
torch's C++ headers are there; `hotpath_info()` says whether it is in use).
"""
from ._abi import ABI_VERSION as __version__
from ._abi import KdajitError, LibraryNotFound, library_path, nvrtc_candidates, version
from ._config import PrewarmResult, Support, key_for, keys_for, prewarm, supported
from ._launch import hotpath_info, prefill_workspace_bytes
from ._ops import (HAS_CUSTOM_OPS, chunk_kda, dry_run, fused_kda_decode, fused_kda_prefill, packed_fused_kda_decode,
                   selected_key)
from ._runtime import Runtime, configure, runtime

__all__ = [
    "fused_kda_decode", "packed_fused_kda_decode", "fused_kda_prefill", "chunk_kda", "supported", "key_for",
    "keys_for", "prewarm", "dry_run", "selected_key", "prefill_workspace_bytes",
    "Support", "PrewarmResult", "Runtime", "configure", "runtime", "KdajitError", "LibraryNotFound",
    "library_path", "nvrtc_candidates", "version", "hotpath_info", "HAS_CUSTOM_OPS", "__version__",
]
