"""The C ABI of libkdajit.so (runtime/include/kdajit/kdajit.h) through ctypes.

This module is the one place that knows the C struct layouts and the entry
points: a header change is an edit here (tests/python compares every size and
offset with what the C compiler says). The spellings of the enums (ops,
dtypes, gates, layouts, modes, log levels), the arches and the routes are the
library's: read once from kdajit_tables_json() (enum(), arches(), routes());
only the enum numbers, which are the ABI, are written here. It does not
import torch.

The library is looked up, in order: next to this package (the copy that
`pip install ./python` puts there), the path in KDAJIT_LIBRARY, then the
system (`ldconfig`, LD_LIBRARY_PATH: "libkdajit.so.0"). On load it is handed
the NVRTC of the nvidia pip packages on the Python path (nvrtc_candidates).
"""
import ctypes
import ctypes.util
import glob
import json
import os
import re
import sys
import threading
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p

# The library's version this package was written against: major.minor must
# match (0.x: a minor release may change the ABI). A test compares it with
# the CMake project version.
ABI_VERSION = "0.1.0"
SONAME = "libkdajit.so.0"

MAX_DIMS = 4

# kdajit_status_t
OK = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_UNSUPPORTED = 2
ERROR_COMPILE = 3
ERROR_CUDA = 4
ERROR_CACHE = 5
ERROR_JIT_DISABLED = 6
ERROR_CAPTURE = 7
ERROR_IO = 8
ERROR_INTERNAL = 9

# kdajit_dtype_t, kdajit_gate_t, kdajit_conv_layout_t, kdajit_op_t,
# kdajit_indices_mode_t, kdajit_log_level_t: the numbers the code below passes
# itself. The names the Python API takes for them come from the library (enum()).
DTYPE_F32, DTYPE_BF16, DTYPE_INT32 = 0, 1, 2
GATE_BOUNDED, GATE_SOFTPLUS = 0, 1
CONV_SD, CONV_DS = 0, 1
OP_SINGLE, OP_PACKED, OP_PREFILL, OP_CHUNK = 0, 1, 2, 3
INDICES_UNIQUE_OR_NULL, INDICES_POSITIVE_UNIQUE, INDICES_REPEATED_POSITIVE = 0, 1, 2
LOG_DEFAULT, LOG_QUIET, LOG_INFO, LOG_DEBUG = -1, 0, 1, 2

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


# --- Struct layouts (C enums are int-sized on every platform kdajit supports) ---

# Every struct a caller passes starts with struct_size (kdajit.h, docs/CONTRACT.md
# §9): the *_init functions take sizeof the ctypes struct and set it.
class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("dtype", c_int32),
        ("ndim", c_int32),
        ("shape", c_int64 * MAX_DIMS),
        ("strides", c_int64 * MAX_DIMS),
    ]


# The tensor fields of kdajit_decode_args_t, in header order. The Python ops
# name the conv weight `weight` (FlashInfer's name); the struct `conv_weight`.
TENSOR_FIELDS = (
    "x", "conv_weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias",
    "state_indices", "state", "output_gate", "norm_weight", "output",
    "query_start_loc", "num_accepted_tokens",
)
# The field before them and the scalar fields after them, in header order, with
# their struct format codes.
HEAD_FIELDS = (("struct_size", "Q"),)
SCALAR_FIELDS = (("gate", "i"), ("lower_bound", "f"), ("norm_eps", "f"),
                 ("state_indices_mode", "i"), ("oob_counter", "Q"))


class DecodeArgs(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [(name, Tensor) for name in TENSOR_FIELDS] + [
        ("gate", c_int32),
        ("lower_bound", c_float),
        ("norm_eps", c_float),
        ("state_indices_mode", c_int32),
        ("oob_counter", c_void_p),
    ]


# kdajit_prefill_args_t: its tensor fields and scalars, in header order.
PREFILL_TENSOR_FIELDS = (
    "x", "conv_weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias",
    "state_indices", "has_initial_state", "state", "output_gate", "norm_weight", "output",
    "query_start_loc",
)
PREFILL_SCALAR_FIELDS = (("gate", "i"), ("lower_bound", "f"), ("norm_eps", "f"), ("max_seq_len", "q"),
                         ("oob_counter", "Q"), ("workspace", "Q"), ("workspace_bytes", "q"))


class PrefillArgs(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [(name, Tensor) for name in PREFILL_TENSOR_FIELDS] + [
        ("gate", c_int32),
        ("lower_bound", c_float),
        ("norm_eps", c_float),
        ("max_seq_len", c_int64),
        ("oob_counter", c_void_p),
        ("workspace", c_void_p),
        ("workspace_bytes", c_int64),
    ]


# kdajit_chunk_args_t: its tensor fields and scalars, in header order.
CHUNK_TENSOR_FIELDS = (
    "q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "final_state", "output", "cu_seqlens",
)
CHUNK_SCALAR_FIELDS = (("gate", "i"), ("lower_bound", "f"), ("scale", "f"), ("qk_l2norm", "i"),
                       ("beta_sigmoid", "i"), ("state_v_first", "i"), ("max_seq_len", "q"), ("workspace", "Q"),
                       ("workspace_bytes", "q"))


class ChunkArgs(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t)] + [(name, Tensor) for name in CHUNK_TENSOR_FIELDS] + [
        ("gate", c_int32),
        ("lower_bound", c_float),
        ("scale", c_float),
        ("qk_l2norm", c_int32),
        ("beta_sigmoid", c_int32),
        ("state_v_first", c_int32),
        ("max_seq_len", c_int64),
        ("workspace", c_void_p),
        ("workspace_bytes", c_int64),
    ]


class RuntimeOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("cache_dir", c_char_p),
        ("arch", c_char_p),
        ("device", c_int32),
        ("log_level", c_int32),
        ("route", c_char_p),
        ("use_tuning", c_int32),
        ("pdl", c_int32),
    ]


class Config(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("op", c_int32),
        ("heads", c_int32),
        ("state_dtype", c_int32),
        ("conv_layout", c_int32),
        ("tokens", c_int32),
        ("gate", c_int32),
        ("arch", c_char_p),
        ("device", c_int32),
        ("state_indices_mode", c_int32),
        ("sm_count", c_int32),
    ]


# Every struct this module mirrors, by its C name (the layout test walks these).
STRUCTS = {
    "kdajit_tensor_t": Tensor,
    "kdajit_decode_args_t": DecodeArgs,
    "kdajit_prefill_args_t": PrefillArgs,
    "kdajit_chunk_args_t": ChunkArgs,
    "kdajit_runtime_options_t": RuntimeOptions,
    "kdajit_config_t": Config,
}


# --- Errors ---------------------------------------------------------------------

class KdajitError(RuntimeError):
    """A kdajit status other than invalid argument / unsupported (compile, CUDA,
    cache, capture, ...). `status` is the kdajit_status_t value."""

    def __init__(self, message, status=ERROR_INTERNAL):
        super().__init__(message)
        self.status = status


class LibraryNotFound(KdajitError, OSError):
    """libkdajit.so could not be found or loaded."""

    def __init__(self, message):
        KdajitError.__init__(self, message, ERROR_IO)


def error_for(status, message):
    """The Python exception for a failed kdajit status: ValueError for a contract
    violation, NotImplementedError for an unsupported configuration, else KdajitError."""
    if status == ERROR_INVALID_ARGUMENT:
        return ValueError(message)
    if status == ERROR_UNSUPPORTED:
        return NotImplementedError(message)
    return KdajitError(message, status)


# --- Loading --------------------------------------------------------------------

def _package_copy():
    here = os.path.dirname(os.path.abspath(__file__))
    for name in (SONAME, "libkdajit.so"):
        path = os.path.join(here, name)
        if os.path.exists(path):
            return path
    return None


def candidates():
    """Where the library is looked for, in order: (origin, path or name)."""
    found = []
    copy = _package_copy()
    if copy:
        found.append(("package", copy))
    env = os.environ.get("KDAJIT_LIBRARY")
    if env:
        found.append(("KDAJIT_LIBRARY", env))
    system = ctypes.util.find_library("kdajit")
    found.append(("system", system or SONAME))
    return found


# The entry points that take the sized structs: kdajit.h maps each name to its
# NAME_v1 export (the plain symbols serve binaries of the 0.1.0 header).
SIZED_ENTRY_POINTS = frozenset((
    "kdajit_runtime_options_init", "kdajit_decode_args_init", "kdajit_config_init", "kdajit_runtime_create",
    "kdajit_single_decode", "kdajit_packed_decode", "kdajit_validate_args", "kdajit_query_support",
    "kdajit_config_key", "kdajit_config_keys", "kdajit_selected_key"))


# The prefill op's entry points (name as in kdajit.h, restype, argtypes),
# bound by Library.prefill_entry_points: the args struct goes in as bytes.
PREFILL_ENTRY_POINTS = (
    ("kdajit_prefill_args_init", None, [POINTER(PrefillArgs), c_size_t]),
    ("kdajit_prefill", c_int, [c_void_p, c_char_p, c_void_p]),
    ("kdajit_validate_prefill_args", c_int, [c_char_p]),
    ("kdajit_prefill_workspace_bytes", c_int64, [c_int64, c_int64, c_int64]),
)


# The chunk op's entry points, bound by Library.chunk_entry_points as the prefill op's.
CHUNK_ENTRY_POINTS = (
    ("kdajit_chunk_args_init", None, [POINTER(ChunkArgs), c_size_t]),
    ("kdajit_chunk", c_int, [c_void_p, c_char_p, c_void_p]),
    ("kdajit_validate_chunk_args", c_int, [c_char_p]),
)


class Library:
    """libkdajit.so with typed entry points: each one an attribute of this object
    under its kdajit.h name (e.g. lib.kdajit_config_key), bound to the export that
    name maps to. The *_init entry points take the struct and its size."""

    def __init__(self, path, origin):
        self.path = path
        self.origin = origin
        self.lib = ctypes.CDLL(path)
        lib = self.lib
        self._proto("kdajit_version", c_char_p, [])
        self._proto("kdajit_tables_json", c_char_p, [])
        self._proto("kdajit_status_string", c_char_p, [c_int])
        self._proto("kdajit_last_error", c_char_p, [])
        self._proto("kdajit_last_error_detail", c_char_p, [])
        self._proto("kdajit_runtime_options_init", None, [POINTER(RuntimeOptions), c_size_t])
        self._proto("kdajit_runtime_create", c_int, [POINTER(RuntimeOptions), POINTER(c_void_p)])
        self._proto("kdajit_runtime_destroy", None, [c_void_p])
        self._proto("kdajit_decode_args_init", None, [POINTER(DecodeArgs), c_size_t])
        # The decode entry points take the packed struct as bytes (c_char_p
        # passes a pointer to the bytes object's buffer; the C side only reads).
        self._proto("kdajit_single_decode", c_int, [c_void_p, c_char_p, c_void_p])
        self._proto("kdajit_packed_decode", c_int, [c_void_p, c_char_p, c_void_p])
        self._proto("kdajit_validate_args", c_int, [c_int, c_char_p])
        self._proto("kdajit_query_support", c_int, [POINTER(Config), c_char_p, c_size_t])
        self._proto("kdajit_config_init", None, [POINTER(Config), c_size_t])
        self._proto("kdajit_config_key", c_int, [POINTER(Config), c_int64, c_char_p, c_size_t])
        self._proto("kdajit_config_keys", c_int, [POINTER(Config), c_char_p, c_size_t, POINTER(c_size_t)])
        self._proto("kdajit_runtime_prewarm", c_int, [c_void_p, c_char_p, POINTER(c_int32)])
        self._proto("kdajit_selected_key", c_int, [c_void_p, c_int, c_char_p, c_void_p, c_char_p, c_size_t])
        self._proto("kdajit_add_nvrtc_candidate", c_int, [c_char_p])
        self._proto("kdajit_runtime_prewarm_async", c_int, [c_void_p, c_char_p, c_uint32])
        self._proto("kdajit_runtime_wait_prewarm", c_int, [c_void_p])
        self._proto("kdajit_runtime_stats", c_int, [c_void_p, POINTER(c_uint64), c_size_t])
        self.version = self.kdajit_version().decode()
        self._check_version()
        self.tables = json.loads(self.kdajit_tables_json().decode())
        self._check_defaults()
        self.nvrtc_candidates = []
        for path in nvrtc_candidates():
            if self.kdajit_add_nvrtc_candidate(path.encode()) == OK:
                self.nvrtc_candidates.append(path)

    def _proto(self, name, restype, argtypes):
        symbol = name + "_v1" if name in SIZED_ENTRY_POINTS else name
        try:
            fn = getattr(self.lib, symbol)
        except AttributeError:
            raise LibraryNotFound(f"{self.path}: expected the kdajit {ABI_VERSION} C ABI, but {symbol} is missing") \
                from None
        fn.restype = restype
        fn.argtypes = argtypes
        setattr(self, name, fn)

    def _optional_entry_points(self, entry_points, op, fn_name):
        """The functions of entry_points ((name, restype, argtypes) triples), each
        bound to its _v1 export (kdajit.h), else to the plain name; a library
        without them raises NotImplementedError naming op and the Python function."""
        fns = []
        for name, restype, argtypes in entry_points:
            fn = None
            for symbol in (name + "_v1", name):  # the _v1 export, else the plain one of this header
                fn = getattr(self.lib, symbol, None)
                if fn is not None:
                    break
            if fn is None:
                raise NotImplementedError(f"{self.path} (kdajit {self.version}) has no {name}_v1: a library "
                                          f"built without the {op} op; {fn_name} needs one with it")
            fn.restype = restype
            fn.argtypes = argtypes
            fns.append(fn)
        return fns

    def key_query(self, name, op, fn_name):
        """kdajit_selected_prefill_key / kdajit_selected_chunk_key (`name`), bound on
        first use: (runtime, args bytes, stream, buffer, size) -> status."""
        fn = self.__dict__.get("_q_" + name)
        if fn is None:
            (fn,) = self._optional_entry_points(((name, c_int, [c_void_p, c_char_p, c_void_p, c_char_p, c_size_t]),),
                                                op, fn_name)
            self.__dict__["_q_" + name] = fn
        return fn

    def _check_init(self, init, struct_type, c_name, read, want):
        """init (a *_init_v1) over a struct of 0x5A bytes, read back at the ctypes
        offsets: read(struct) must give want, else the layouts differ."""
        a = struct_type()
        ctypes.memset(byref(a), 0x5A, ctypes.sizeof(a))
        init(byref(a), ctypes.sizeof(a))
        got = read(a)
        if got != want:
            raise LibraryNotFound(f"{self.path}: {c_name}_init wrote {got} at the ctypes offsets, "
                                  f"expected {want}: struct layout mismatch")

    def prefill_entry_points(self):
        """(kdajit_prefill, kdajit_validate_prefill_args), bound on first use (only
        fused_kda_prefill needs them), after kdajit_prefill_args_init's defaults
        are read back at the ctypes offsets. The C names map to their _v1 exports
        (kdajit.h); a library built before the prefill op raises NotImplementedError."""
        eps = self.__dict__.get("_prefill")
        if eps is not None:
            return eps
        with _lock:
            if "_prefill" not in self.__dict__:
                init, prefill, validate, workspace_bytes = self._optional_entry_points(
                    PREFILL_ENTRY_POINTS, "prefill", "fused_kda_prefill")
                self._check_init(
                    init, PrefillArgs, "kdajit_prefill_args",
                    lambda a: (a.struct_size, a.gate, a.lower_bound, a.norm_eps, a.max_seq_len, a.oob_counter,
                               a.x.data, a.x.ndim, a.has_initial_state.ndim, a.workspace, a.workspace_bytes),
                    (ctypes.sizeof(PrefillArgs), GATE_BOUNDED, -5.0, c_float(1e-6).value, 0, None, None, 0, 0, None,
                     0))
                self.kdajit_prefill_workspace_bytes = workspace_bytes
                self._prefill = (prefill, validate)
        return self._prefill

    def chunk_entry_points(self):
        """(kdajit_chunk, kdajit_validate_chunk_args), bound on first use (only
        chunk_kda needs them), after kdajit_chunk_args_init's defaults are read
        back at the ctypes offsets; a library without the chunk op raises
        NotImplementedError."""
        eps = self.__dict__.get("_chunk")
        if eps is not None:
            return eps
        with _lock:
            if "_chunk" not in self.__dict__:
                init, chunk, validate = self._optional_entry_points(CHUNK_ENTRY_POINTS, "chunk", "chunk_kda")
                self._check_init(
                    init, ChunkArgs, "kdajit_chunk_args",
                    lambda a: (a.struct_size, a.gate, a.lower_bound, a.scale, a.qk_l2norm, a.beta_sigmoid,
                               a.state_v_first, a.max_seq_len, a.q.data, a.q.ndim, a.dt_bias.ndim,
                               a.initial_state.ndim, a.final_state.ndim, a.workspace, a.workspace_bytes),
                    (ctypes.sizeof(ChunkArgs), GATE_BOUNDED, -5.0, c_float(128 ** -0.5).value, 1, 1, 0, 0, None, 0,
                     0, 0, 0, None, 0))
                self._chunk = (chunk, validate)
        return self._chunk

    def enum(self, name):
        """{spelling: C value} of one enum of kdajit_tables_json() ("op", "dtype",
        "state_dtype", "gate", "conv_layout", "indices_mode", "log_level"), in value order."""
        return dict(sorted(self.tables["enums"][name].items(), key=lambda kv: kv[1]))

    def last_error(self, with_detail=False):
        """The calling thread's last message; with_detail adds the detail (a compile's
        options, NVRTC log and failing source line) on the following lines."""
        msg = (self.kdajit_last_error() or b"").decode(errors="replace")
        if with_detail:
            detail = (self.kdajit_last_error_detail() or b"").decode(errors="replace")
            if detail:
                msg += "\n" + detail
        return msg

    def status_name(self, status):
        return (self.kdajit_status_string(status) or b"?").decode()

    def raise_for(self, status, what=None):
        """Raises the exception for status (not OK), with kdajit_last_error()."""
        msg = self.last_error(with_detail=True) or self.status_name(status)
        if what and status not in (ERROR_INVALID_ARGUMENT, ERROR_UNSUPPORTED):
            msg = f"{what}: {self.status_name(status)}: {msg}"
        raise error_for(status, msg)

    def _check_version(self):
        want = ABI_VERSION.split(".")[:2]
        got = self.version.split(".")[:2]
        if want != got:
            raise LibraryNotFound(f"{self.path}: expected kdajit {'.'.join(want)}.x (the C ABI of this package), "
                                  f"got {self.version}")

    def _check_defaults(self):
        """The init functions fill known values: read back at the ctypes offsets,
        they prove that the binary's struct layout is the one declared here."""
        o = RuntimeOptions()
        ctypes.memset(byref(o), 0x5A, ctypes.sizeof(o))
        self.kdajit_runtime_options_init(byref(o), ctypes.sizeof(o))
        got = (o.struct_size, o.cache_dir, o.arch, o.device, o.log_level, o.route, o.use_tuning, o.pdl)
        want = (ctypes.sizeof(o), None, None, -1, LOG_DEFAULT, None, 1, 0)
        if got != want:
            raise LibraryNotFound(f"{self.path}: kdajit_runtime_options_init wrote {got} at the ctypes offsets, "
                                  f"expected {want}: struct layout mismatch")
        c = Config()
        ctypes.memset(byref(c), 0x5A, ctypes.sizeof(c))
        self.kdajit_config_init(byref(c), ctypes.sizeof(c))
        got = (c.struct_size, c.op, c.heads, c.state_dtype, c.conv_layout, c.tokens, c.gate, c.arch, c.device,
               c.state_indices_mode, c.sm_count)
        want = (ctypes.sizeof(c), OP_SINGLE, 64, DTYPE_F32, CONV_SD, 1, GATE_BOUNDED, None, -1,
                INDICES_UNIQUE_OR_NULL, 0)
        if got != want:
            raise LibraryNotFound(f"{self.path}: kdajit_config_init wrote {got} at the ctypes offsets, "
                                  f"expected {want}: struct layout mismatch")
        a = DecodeArgs()
        ctypes.memset(byref(a), 0x5A, ctypes.sizeof(a))
        self.kdajit_decode_args_init(byref(a), ctypes.sizeof(a))
        got = (a.struct_size, a.gate, a.lower_bound, a.norm_eps, a.state_indices_mode, a.oob_counter, a.x.data,
               a.x.ndim)
        want = (ctypes.sizeof(a), GATE_BOUNDED, -5.0, c_float(1e-6).value, INDICES_UNIQUE_OR_NULL, None, None, 0)
        if got != want:
            raise LibraryNotFound(f"{self.path}: kdajit_decode_args_init wrote {got} at the ctypes offsets, "
                                  f"expected {want}: struct layout mismatch")


def nvrtc_candidates(paths=None):
    """NVRTC libraries of nvidia pip packages on the Python path (what a PyTorch
    image without a CUDA toolkit has: nvidia/cuda_nvrtc/lib/libnvrtc.so.12 for
    cu12 wheels, nvidia/cu13/lib/libnvrtc.so.13 for cu13), newest major first,
    then in Python path order.
    libkdajit.so tries them after KDAJIT_NVRTC and before the system's."""
    found = {}
    for root in (sys.path if paths is None else paths):
        base = os.path.join(root or ".", "nvidia")
        if not os.path.isdir(base):
            continue
        for path in glob.glob(os.path.join(base, "*", "lib", "libnvrtc.so*")):
            m = re.fullmatch(r"libnvrtc\.so\.(\d+)(?:\.[\d.]+)?", os.path.basename(path))
            real = os.path.realpath(path)
            if m and os.path.isfile(path) and real not in found:
                found[real] = (int(m.group(1)), path)
    # Newest major first; within a major, Python path order (the stable sort keeps it).
    return [p for _, p in sorted(found.values(), key=lambda mp: -mp[0])]


_lock = threading.Lock()
_library = None


def load():
    """The process's Library, loaded on first use (thread-safe)."""
    global _library
    lib = _library
    if lib is not None:
        return lib
    with _lock:
        if _library is None:
            # The first candidate that is there is the one: a package copy or a
            # KDAJIT_LIBRARY that fails to load is an error, not a reason to
            # silently pick another build.
            origin, path = candidates()[0]
            try:
                _library = Library(path, origin)
            except OSError as e:  # LibraryNotFound is an OSError too
                hint = ("install the package with the library (README: Python) or set KDAJIT_LIBRARY to a "
                        "built libkdajit.so" if origin == "system" else "")
                raise LibraryNotFound(f"cannot load libkdajit.so ({origin}: {path}): {e}"
                                      + (f"; {hint}" if hint else "")) from e
        return _library


def library_path():
    """The path (or soname) of the loaded library and where it came from."""
    lib = load()
    return lib.path, lib.origin


def version():
    return load().version


def enum(name):
    """{spelling: C value} of one of the library's enums (Library.enum)."""
    return load().enum(name)


def arches():
    """The arch spellings the library accepts, in its order, and their compute capability."""
    return {a["name"]: a["compute_capability"] for a in load().tables["arches"]}


def arch_for_compute_capability(major, minor):
    """The arch the runtime and the CLI build for on a device of this compute
    capability, or None when kdajit has none for it."""
    return load().tables["arch_for_compute_capability"].get(f"{major}.{minor}")


def arch_without_device():
    """The arch keys are named for when there is no GPU to ask (the CLI's default)."""
    return load().tables["arch_without_device"]


def routes():
    """{route name: [the ops it serves]}, in the route table's order."""
    return {r["name"]: r["ops"] for r in load().tables["routes"]}
