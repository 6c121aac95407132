"""The support query, kernel key names and pre-warming, mirroring the CLI
(`kdajit keys`, `kdajit prewarm`) and kdajit_query_support. No torch needed."""
import itertools
import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from ctypes import byref, c_int32, c_size_t, create_string_buffer, sizeof

from . import _abi, _runtime

# The spellings state_dtype takes besides the library's ("f32", "bf16"): torch
# dtypes by their str(), so that this module needs no torch.
_TORCH_DTYPE_NAMES = {"float32": "f32", "bfloat16": "bf16", "torch.float32": "f32", "torch.bfloat16": "bf16"}
_KEY_BYTES = 256


def _pick(name, value, table, aliases=None):
    """The C value of `value` in table ({spelling: value}, from the library);
    ValueError naming the argument and the spellings otherwise."""
    key = value if isinstance(value, str) else str(value)
    key = (aliases or {}).get(key, key)
    if key not in table:
        raise ValueError(f"{name}: expected one of {', '.join(repr(k) for k in table)}, got {value!r}")
    return table[key]


def _c_int(name, value, expected, lo=_abi.INT32_MIN, hi=_abi.INT32_MAX):
    """value as the C integer field it fills (int32_t unless lo/hi say otherwise):
    ValueError naming the argument for a non-int or a value the field cannot
    hold, which ctypes would otherwise wrap (2**32 + 8 -> 8)."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return value


def _torch_device():
    """torch's current CUDA device when torch is already imported and has one, else 0."""
    import sys

    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.current_device()
    except Exception:  # a broken CUDA setup: the C query reports it
        pass
    return 0


class _Config:
    """A kdajit_config_t with the bytes of its arch string kept alive."""

    def __init__(self, heads, op="single", state_dtype="f32", conv_layout="sd", tokens=None, gate="bounded",
                 arch=None, device=None, state_indices_mode="unique_or_null", sm_count=0):
        lib = _abi.load()
        limits = lib.tables
        c = _abi.Config()
        lib.kdajit_config_init(byref(c), sizeof(c))
        c.op = _pick("op", op, lib.enum("op"))
        c.heads = _c_int("heads", heads, f"an int in 1..{limits['max_heads']}")
        c.state_dtype = _pick("state_dtype", state_dtype, lib.enum("state_dtype"), _TORCH_DTYPE_NAMES)
        c.conv_layout = _pick("conv_layout", conv_layout, lib.enum("conv_layout"))
        if tokens is None:
            if c.op == _abi.OP_PACKED:
                raise ValueError(f"tokens: expected T (1..{limits['max_tokens']} tokens per sequence) for the "
                                 "packed op, got None")
            # The prefill and chunk ops' key field t is their chunk size.
            tokens = limits["prefill_chunk"] if c.op in (_abi.OP_PREFILL, _abi.OP_CHUNK) else 1
        c.tokens = _c_int("tokens", tokens, f"an int in 1..{limits['max_tokens']} (1 for the single op, "
                          f"{limits['prefill_chunk']} for prefill and chunk)")
        c.gate = _pick("gate", gate, lib.enum("gate"))
        if arch is not None and not isinstance(arch, (str, bytes)):
            raise ValueError(f"arch: expected None or one of {', '.join(map(repr, _abi.arches()))}, got {arch!r}")
        self._arch = arch.encode() if isinstance(arch, str) else arch
        c.arch = self._arch
        c.device = _c_int("device", _torch_device() if device is None else device,
                          "None or a CUDA device ordinal", lo=-1)
        c.state_indices_mode = _pick("state_indices_mode", state_indices_mode, lib.enum("indices_mode"))
        c.sm_count = _c_int("sm_count", sm_count, "0 (the device's or the arch's reference part) or an SM count",
                            lo=0)
        self.struct = c
        self.arch_given = arch is not None


class Support:
    """The answer of supported(): truthy when supported; `reason` says why not."""

    __slots__ = ("ok", "reason")

    def __init__(self, ok, reason):
        self.ok = ok
        self.reason = reason

    def __bool__(self):
        return self.ok

    def __repr__(self):
        return f"Support(ok={self.ok}, reason={self.reason!r})"


def supported(heads, *, op="single", state_dtype="f32", conv_layout="sd", tokens=None, gate="bounded", arch=None,
              device=None):
    """Whether kdajit serves this configuration, without compiling or launching.

    arch None means the CUDA device's (torch's current one unless device= says).
    Returns Support (truthy or not, with the reason); a malformed configuration
    (heads 0, an unknown layout name, ...) raises ValueError."""
    cfg = _Config(heads, op, state_dtype, conv_layout, tokens, gate, arch, device)
    lib = _abi.load()
    reason = create_string_buffer(1024)
    status = lib.kdajit_query_support(byref(cfg.struct), reason, len(reason))
    if status == _abi.OK:
        return Support(True, "")
    if status == _abi.ERROR_INVALID_ARGUMENT:
        raise ValueError(reason.value.decode(errors="replace"))
    return Support(False, reason.value.decode(errors="replace"))


def _with_default_arch(call, cfg):
    """Runs call(cfg) and, when arch was not given and the device cannot be read
    (no GPU), again for the library's arch without a device: the CLI's default
    ("the local GPU's, else sm_90")."""
    status, out = call(cfg)
    if status not in (_abi.OK, _abi.ERROR_INVALID_ARGUMENT, _abi.ERROR_UNSUPPORTED) and not cfg.arch_given:
        cfg._arch = _abi.arch_without_device().encode()
        cfg.struct.arch = cfg._arch
        status, out = call(cfg)
    if status != _abi.OK:
        _abi.load().raise_for(status)
    return out


def key_for(heads, *, rows=1, op="single", state_dtype="f32", conv_layout="sd", tokens=None, gate="bounded",
            arch=None, device=None, state_indices_mode="unique_or_null", sm_count=0):
    """The kernel key name the selector picks for this configuration at `rows`
    rows (single op) or sequences (packed op). arch None: the local GPU's, else sm_90."""
    cfg = _Config(heads, op, state_dtype, conv_layout, tokens, gate, arch, device, state_indices_mode, sm_count)
    rows = _c_int("rows", rows, "an int in 1..2147483647 (rows, or sequences of the packed op)",
                  lo=_abi.INT64_MIN, hi=_abi.INT64_MAX)
    fn = _abi.load().kdajit_config_key
    buf = create_string_buffer(_KEY_BYTES)

    def call(c):
        return fn(byref(c.struct), rows, buf, len(buf)), buf

    return _with_default_arch(call, cfg).value.decode()


def keys_for(heads, *, op="single", state_dtype="f32", conv_layout="sd", tokens=None, gate="bounded", arch=None,
             device=None, state_indices_mode="unique_or_null", sm_count=0):
    """Every kernel key name the selector can pick for this configuration, at
    any number of rows (what to pre-warm). arch None: the local GPU's, else sm_90.
    op: 'single', 'packed', 'prefill' or 'chunk' (chunk_kda: its keys carry conv sd
    and t 64, the defaults, e.g. kda_chunk.h16.state_f32.conv_sd.t64.gate_bounded.route_rowcta.sm_90)."""
    cfg = _Config(heads, op, state_dtype, conv_layout, tokens, gate, arch, device, state_indices_mode, sm_count)
    fn = _abi.load().kdajit_config_keys

    def call(c):
        needed = c_size_t(0)
        status = fn(byref(c.struct), None, 0, byref(needed))
        if status != _abi.OK:
            return status, None
        buf = create_string_buffer(max(needed.value, 1))
        return fn(byref(c.struct), buf, len(buf), byref(needed)), buf

    text = _with_default_arch(call, cfg).value.decode()
    return [k for k in text.split("\n") if k]


class PrewarmResult:
    """One key of a prewarm: status 'compiled', 'cached' or 'failed' (error set)."""

    __slots__ = ("key", "status", "seconds", "error")

    def __init__(self, key, status, seconds, error=None):
        self.key, self.status, self.seconds, self.error = key, status, seconds, error

    def __repr__(self):
        extra = f", error={self.error!r}" if self.error else ""
        return f"PrewarmResult({self.key!r}, {self.status!r}, {self.seconds:.3f}s{extra})"


def _values(v):
    return list(v) if isinstance(v, (list, tuple, set, frozenset)) else [v]


def prewarm(keys=None, *, heads=None, op="single", state_dtype="f32", conv_layout="sd", tokens=None,
            gate="bounded", arch=None, device=None, state_indices_mode="unique_or_null", sm_count=0, jobs=None,
            progress=None, runtime=None, strict=False):
    """Makes sure kernels are in the cache, compiling the missing ones with NVRTC
    (no GPU needed), as `kdajit prewarm` does. Call it before CUDA-graph capture:
    a compile during capture is an error.

    keys: kernel key names; and/or a pattern: heads (required for a pattern) and
    the other configuration arguments, each a value or a list of values (every
    combination; tokens other than 1 apply to the packed op only, and the packed
    op needs them given; the prefill and chunk ops take 64 only, the chunk op
    conv 'sd' only, and the combinations that break this are left out). Each
    combination contributes every key the selector can pick at any batch size
    (keys_for).
    jobs: parallel compiles (default: the core count). progress(done, total,
    result): called after each key, from the calling thread. runtime: a
    kdajit.Runtime (default: the process runtime, so its cache dir).
    Returns the PrewarmResult list (sorted by key); strict=True raises
    KdajitError when a key failed.
    """
    names = [] if keys is None else ([keys] if isinstance(keys, str) else list(keys))
    if heads is not None:
        ops = _values(op)
        for combo in itertools.product(_values(heads), ops, _values(state_dtype), _values(conv_layout),
                                       _values(tokens), _values(gate), _values(state_indices_mode)):
            h, o, sd, cl, t, g, mode = combo
            if o == "single" and t not in (None, 1):
                continue  # a token list applies to the packed op
            if o in ("prefill", "chunk") and t not in (None, _abi.load().tables["prefill_chunk"]):
                continue  # their t is the chunk size
            if o == "chunk" and cl != "sd":
                continue  # chunk keys carry conv sd (the op has no conv)
            if o == "packed" and mode == "repeated_positive":
                continue  # the packed op has no repeated_positive mode
            names += keys_for(h, op=o, state_dtype=sd, conv_layout=cl, tokens=t, gate=g, arch=arch, device=device,
                              state_indices_mode=mode, sm_count=sm_count)
    elif keys is None:
        raise ValueError("prewarm: expected keys=[names] or a pattern (heads=...)")
    names = sorted(set(names))
    rt = runtime or _runtime.runtime()
    lib = _abi.load()
    fn = lib.kdajit_runtime_prewarm

    def one(name):
        t0 = time.perf_counter()
        compiled = c_int32(0)
        status = fn(rt.handle, name.encode(), byref(compiled))
        dt = time.perf_counter() - t0
        if status != _abi.OK:
            # kdajit_last_error() is per thread: read it here, in the worker.
            return PrewarmResult(name, "failed", dt, f"{lib.status_name(status)}: {lib.last_error()}"), status
        return PrewarmResult(name, "compiled" if compiled.value else "cached", dt), status

    results, invalid = [], []
    workers = max(1, min(jobs or os.cpu_count() or 1, len(names) or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(one, n) for n in names]
        for fut in as_completed(futures):
            r, status = fut.result()
            results.append(r)
            if status == _abi.ERROR_INVALID_ARGUMENT:
                invalid.append(r)
            if progress is not None:
                progress(len(results), len(names), r)
    if invalid:
        raise ValueError(f"prewarm: {invalid[0].key!r}: {invalid[0].error}")
    results.sort(key=lambda r: r.key)
    failed = [r for r in results if r.status == "failed"]
    if strict and failed:
        raise _abi.KdajitError(f"prewarm: {len(failed)} of {len(results)} keys failed; first: {failed[0].key}: "
                               f"{failed[0].error}", _abi.ERROR_COMPILE)
    return results
