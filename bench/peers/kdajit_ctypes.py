"""kdajit's C ABI (runtime/include/kdajit/kdajit.h) through ctypes, on torch tensors.

The structs mirror the header field by field. A layout mistake here would not
crash: kdajit would read a shifted struct and either reject it or, worse, launch
on wrong pointers. So `check_layout()` compares every offset against numbers
taken from the C compiler (offsetof on x86-64 Linux), and `check_defaults()`
reads back what the library's own init functions wrote: both run before any
GPU work.
"""
import ctypes
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_int32, c_int64, c_void_p

MAX_DIMS = 4

# kdajit_dtype_t, kdajit_op_t, kdajit_gate_t, kdajit_indices_mode_t, kdajit_log_level_t
DTYPE_F32, DTYPE_BF16, DTYPE_INT32 = 0, 1, 2
OP_SINGLE, OP_PACKED = 0, 1
GATE_BOUNDED, GATE_SOFTPLUS = 0, 1
INDICES_UNIQUE_OR_NULL, INDICES_POSITIVE_UNIQUE, INDICES_REPEATED_POSITIVE = 0, 1, 2
LOG_DEFAULT, LOG_QUIET, LOG_INFO, LOG_DEBUG = -1, 0, 1, 2
STATUS_OK = 0


class Tensor(ctypes.Structure):
    # C enums are int-sized on the platforms kdajit supports, hence c_int32 for dtype.
    _fields_ = [
        ("data", c_void_p),
        ("dtype", c_int32),
        ("ndim", c_int32),
        ("shape", c_int64 * MAX_DIMS),
        ("strides", c_int64 * MAX_DIMS),
    ]


# Order of the tensor fields of kdajit_decode_args_t, exactly as in the header.
TENSOR_FIELDS = (
    "x", "conv_weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias",
    "state_indices", "state", "output_gate", "norm_weight", "output",
    "query_start_loc", "num_accepted_tokens",
)


class DecodeArgs(ctypes.Structure):
    _fields_ = [(name, Tensor) for name in TENSOR_FIELDS] + [
        ("gate", c_int32),
        ("lower_bound", c_float),
        ("norm_eps", c_float),
        ("state_indices_mode", c_int32),
        ("oob_counter", c_void_p),
    ]


class RuntimeOptions(ctypes.Structure):
    _fields_ = [
        ("cache_dir", c_char_p),
        ("arch", c_char_p),
        ("device", c_int32),
        ("log_level", c_int32),
    ]


# sizeof / offsetof printed by a C program compiled against kdajit.h (gcc,
# x86-64 Linux). Update both sides together when the header changes.
C_LAYOUT = {
    "Tensor": (Tensor, 80, {"data": 0, "dtype": 8, "ndim": 12, "shape": 16, "strides": 48}),
    "DecodeArgs": (DecodeArgs, 1144, {
        **{name: 80 * i for i, name in enumerate(TENSOR_FIELDS)},
        "gate": 1120, "lower_bound": 1124, "norm_eps": 1128, "state_indices_mode": 1132, "oob_counter": 1136,
    }),
    "RuntimeOptions": (RuntimeOptions, 24, {"cache_dir": 0, "arch": 8, "device": 16, "log_level": 20}),
}


class KdajitError(RuntimeError):
    pass


def check_layout():
    """Raises KdajitError naming the first field whose ctypes layout differs from C."""
    for name, (cls, size, offsets) in C_LAYOUT.items():
        if ctypes.sizeof(cls) != size:
            raise KdajitError(f"ctypes {name}: expected sizeof {size} (C), got {ctypes.sizeof(cls)}")
        for field, off in offsets.items():
            got = getattr(cls, field).offset
            if got != off:
                raise KdajitError(f"ctypes {name}.{field}: expected offset {off} (C), got {got}")


def _torch_dtype_code(t):
    import torch  # only the tensor helpers need torch

    codes = {torch.float32: DTYPE_F32, torch.bfloat16: DTYPE_BF16, torch.int32: DTYPE_INT32}
    if t.dtype not in codes:
        raise KdajitError(f"tensor dtype: expected float32, bfloat16 or int32, got {t.dtype}")
    return codes[t.dtype]


def tensor_view(t):
    """A kdajit_tensor_t over a torch tensor: data pointer, shape and strides in elements."""
    if t.dim() > MAX_DIMS:
        raise KdajitError(f"tensor ndim: expected at most {MAX_DIMS}, got {t.dim()}")
    v = Tensor()
    v.data = t.data_ptr()
    v.dtype = _torch_dtype_code(t)
    v.ndim = t.dim()
    for i, (n, s) in enumerate(zip(t.shape, t.stride())):
        v.shape[i] = n
        v.strides[i] = s
    return v


class Library:
    """The loaded libkdajit.so with typed entry points."""

    def __init__(self, path):
        check_layout()
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise KdajitError(f"cannot load kdajit library '{path}': {e} "
                              f"(build it: cmake --build <build dir> --target kdajit)") from e
        lib = self.lib
        lib.kdajit_version.restype = c_char_p
        lib.kdajit_version.argtypes = []
        lib.kdajit_status_string.restype = c_char_p
        lib.kdajit_status_string.argtypes = [c_int]
        lib.kdajit_last_error.restype = c_char_p
        lib.kdajit_last_error.argtypes = []
        lib.kdajit_runtime_options_init.restype = None
        lib.kdajit_runtime_options_init.argtypes = [POINTER(RuntimeOptions)]
        lib.kdajit_runtime_create.restype = c_int
        lib.kdajit_runtime_create.argtypes = [POINTER(RuntimeOptions), POINTER(c_void_p)]
        lib.kdajit_runtime_destroy.restype = None
        lib.kdajit_runtime_destroy.argtypes = [c_void_p]
        lib.kdajit_decode_args_init.restype = None
        lib.kdajit_decode_args_init.argtypes = [POINTER(DecodeArgs)]
        lib.kdajit_single_decode.restype = c_int
        lib.kdajit_single_decode.argtypes = [c_void_p, POINTER(DecodeArgs), c_void_p]
        lib.kdajit_validate_args.restype = c_int
        lib.kdajit_validate_args.argtypes = [c_int, POINTER(DecodeArgs)]
        self.check_defaults()

    def version(self):
        return self.lib.kdajit_version().decode()

    def fail(self, status, what):
        name = (self.lib.kdajit_status_string(status) or b"?").decode()
        msg = (self.lib.kdajit_last_error() or b"").decode()
        return KdajitError(f"{what}: kdajit status {status} ({name}): {msg}")

    def check(self, status, what):
        if status != STATUS_OK:
            raise self.fail(status, what)

    def check_defaults(self):
        """The library's init functions fill known values: reading them back at the
        ctypes offsets proves the trailing fields line up in the real binary too."""
        o = RuntimeOptions()
        ctypes.memset(byref(o), 0x5A, ctypes.sizeof(o))
        self.lib.kdajit_runtime_options_init(byref(o))
        if (o.cache_dir, o.arch, o.device, o.log_level) != (None, None, -1, LOG_DEFAULT):
            raise KdajitError("kdajit_runtime_options_init: expected (NULL, NULL, -1, -1) at the ctypes offsets, got "
                              f"({o.cache_dir}, {o.arch}, {o.device}, {o.log_level}): struct layout mismatch")
        a = DecodeArgs()
        ctypes.memset(byref(a), 0x5A, ctypes.sizeof(a))
        self.lib.kdajit_decode_args_init(byref(a))
        got = (a.gate, a.lower_bound, a.norm_eps, a.state_indices_mode, a.oob_counter, a.x.data, a.x.ndim)
        want = (GATE_BOUNDED, -5.0, c_float(1e-6).value, INDICES_UNIQUE_OR_NULL, None, None, 0)
        if got != want:
            raise KdajitError(f"kdajit_decode_args_init: expected {want} at the ctypes offsets, got {got}: "
                              "struct layout mismatch")

    def create_runtime(self, cache_dir=None, log_level=LOG_DEFAULT):
        return Runtime(self, cache_dir, log_level)


class Runtime:
    def __init__(self, lib, cache_dir, log_level):
        self.lib = lib
        opts = RuntimeOptions()
        lib.lib.kdajit_runtime_options_init(byref(opts))
        # ctypes keeps no reference to the bytes behind a c_char_p field: hold it here.
        self._cache_dir = cache_dir.encode() if cache_dir else None
        opts.cache_dir = self._cache_dir
        opts.log_level = log_level
        handle = c_void_p()
        lib.check(lib.lib.kdajit_runtime_create(byref(opts), byref(handle)), "kdajit_runtime_create")
        self.handle = handle

    def close(self):
        if self.handle:
            self.lib.lib.kdajit_runtime_destroy(self.handle)
            self.handle = None

    def single_decode(self, args, stream):
        """stream: a cudaStream_t as an int (torch: current_stream().cuda_stream)."""
        status = self.lib.lib.kdajit_single_decode(self.handle, byref(args), stream)
        if status != STATUS_OK:
            raise self.lib.fail(status, "kdajit_single_decode")


def decode_args(lib, p, mode=INDICES_UNIQUE_OR_NULL):
    """kdajit_decode_args_t for the single-token op over Problem p's tensors.

    The struct holds raw pointers: p must outlive it."""
    a = DecodeArgs()
    lib.lib.kdajit_decode_args_init(byref(a))
    for name in ("x", "conv_weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias",
                 "state_indices", "state", "output_gate", "norm_weight", "output"):
        setattr(a, name, tensor_view(getattr(p, name)))
    a.gate = GATE_SOFTPLUS if p.gate_softplus else GATE_BOUNDED
    a.lower_bound = p.lower_bound
    a.norm_eps = p.norm_eps
    a.state_indices_mode = mode
    return a
