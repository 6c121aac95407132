"""The kdajit runtime handle: one per process, created on first use."""
import threading
import weakref
from ctypes import byref, c_uint64, c_void_p, sizeof

from . import _abi


def _encode(value, name):
    if value is None:
        return None
    if not isinstance(value, (str, bytes)) or not value:
        raise ValueError(f"{name}: expected None or a non-empty string, got {value!r}")
    return value.encode() if isinstance(value, str) else value


class Runtime:
    """A kdajit_runtime_t: the kernel cache and the loaded kernels.

    cache_dir: None means KDAJIT_CACHE_DIR, $XDG_CACHE_HOME/kdajit, ~/.cache/kdajit.
    arch: None means each call's device (e.g. "sm_90a" to pin one).
    device: -1 means the context of each call's stream.
    log_level: None (KDAJIT_LOG, else info), "quiet", "info" or "debug".
    route: None lets the selector pick per call; a route name (`kdajit routes`)
      pins every call to it (tests and benchmarks: a call it cannot serve raises).
    use_tuning: prefer a `kdajit tune` table found in the cache (default True).
    pdl: launch with programmatic stream serialization (default False).
    """

    def __init__(self, cache_dir=None, arch=None, device=-1, log_level=None, route=None, use_tuning=True,
                 pdl=False):
        lib = _abi.load()
        log_levels = {None: _abi.LOG_DEFAULT, **lib.enum("log_level")}
        if not isinstance(log_level, (str, type(None))) or log_level not in log_levels:
            raise ValueError(f"log_level: expected one of {', '.join(map(repr, log_levels))}, got {log_level!r}")
        if isinstance(device, bool) or not isinstance(device, int) or not -1 <= device <= _abi.INT32_MAX:
            raise ValueError(f"device: expected -1 or a CUDA device ordinal, got {device!r}")
        for name, flag in (("use_tuning", use_tuning), ("pdl", pdl)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name}: expected True or False, got {flag!r}")
        self.options = {"cache_dir": cache_dir, "arch": arch, "device": device, "log_level": log_level,
                        "route": route, "use_tuning": use_tuning, "pdl": pdl}
        opts = _abi.RuntimeOptions()
        lib.kdajit_runtime_options_init(byref(opts), sizeof(opts))
        # ctypes keeps no reference to the bytes behind a c_char_p field.
        self._keep = (_encode(cache_dir, "cache_dir"), _encode(arch, "arch"), _encode(route, "route"))
        opts.cache_dir, opts.arch, opts.route = self._keep
        opts.device = device
        opts.log_level = log_levels[log_level]
        opts.use_tuning = int(use_tuning)
        opts.pdl = int(pdl)
        handle = c_void_p()
        status = lib.kdajit_runtime_create(byref(opts), byref(handle))
        if status != _abi.OK:
            lib.raise_for(status, "kdajit_runtime_create")
        self._lib = lib
        self.handle = handle.value  # an int: what the decode entry points take
        self._finalizer = weakref.finalize(self, lib.kdajit_runtime_destroy, handle.value)

    STAT_NAMES = ("serving_compiles", "serving_compile_ms", "disk_loads", "memory_loads", "prewarm_compiled",
                  "prewarm_failed", "prewarm_pending")

    def stats(self):
        """Where this runtime's kernels came from: serving_compiles (cache misses a
        call compiled, each logged) and their total serving_compile_ms, disk_loads,
        memory_loads, and the background pre-warm's prewarm_compiled,
        prewarm_failed, prewarm_pending."""
        values = (c_uint64 * len(self.STAT_NAMES))()
        status = self._lib.lib.kdajit_runtime_stats(self.handle, values, len(values))
        if status != _abi.OK:
            self._lib.raise_for(status, "kdajit_runtime_stats")
        out = dict(zip(self.STAT_NAMES, values))
        out["serving_compile_ms"] = out["serving_compile_ms"] / 1000.0
        return out

    def prewarm_async(self, keys, threads=1):
        """Compiles these kernel key names into the cache in `threads` background
        threads and returns at once; calls meanwhile run on what is ready (a call
        whose key is compiling waits for it). wait_prewarm() blocks until done."""
        if isinstance(keys, str) or not all(isinstance(k, str) and k and "\n" not in k for k in keys):
            raise ValueError(f"keys: expected a list of kernel key names, got {keys!r}"[:200])
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads: expected an integer >= 1, got {threads!r}")
        status = self._lib.lib.kdajit_runtime_prewarm_async(self.handle, "\n".join(keys).encode(), threads)
        if status != _abi.OK:
            self._lib.raise_for(status, "kdajit_runtime_prewarm_async")

    def wait_prewarm(self):
        """Blocks until every key given to prewarm_async is compiled (or failed)."""
        status = self._lib.lib.kdajit_runtime_wait_prewarm(self.handle)
        if status != _abi.OK:
            self._lib.raise_for(status, "kdajit_runtime_wait_prewarm")

    def close(self):
        """Destroys the runtime now (kernels stay loaded in their CUDA contexts)."""
        self._finalizer()
        self.handle = None

    def __repr__(self):
        return f"kdajit.Runtime({', '.join(f'{k}={v!r}' for k, v in self.options.items())})"


_lock = threading.Lock()
_runtime = None
_options = {}


def configure(**options):
    """Sets the options of the process runtime (Runtime's arguments) before its
    first use; raises RuntimeError once it exists with other options."""
    global _options
    known = ("cache_dir", "arch", "device", "log_level", "route", "use_tuning", "pdl")
    unknown = set(options) - set(known)
    if unknown:
        raise TypeError(f"configure: unknown option(s) {sorted(unknown)}; expected {', '.join(known)}")
    with _lock:
        if _runtime is not None:
            current = {k: _runtime.options[k] for k in options}
            if current != options:
                raise RuntimeError(f"kdajit.configure: the process runtime already exists with {current}; "
                                   "configure it before the first kdajit call")
            return
        _options = dict(options)


def runtime():
    """The process runtime, created on first use with the configured options."""
    global _runtime
    rt = _runtime
    if rt is not None:
        return rt
    with _lock:
        if _runtime is None:
            _runtime = Runtime(**_options)
        return _runtime


def _reset_for_tests():
    """Drops the process runtime (tests only: kernels of live contexts stay loaded)."""
    global _runtime, _options
    with _lock:
        if _runtime is not None:
            _runtime.close()
        _runtime = None
        _options = {}

