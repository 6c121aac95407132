"""fused_kda_decode / packed_fused_kda_decode over torch tensors.

The hot path is built for host cost (the target: <= 15 us per eager call):
- a call reads each tensor's shape, stride(), dtype and device once, into one
  tuple that keys a cache of mappings (what the torch tensors look like as
  kdajit_tensor_t views: leading 1 dims dropped, [R, H*128] split, A_log's
  [1, 1, H, 1] flattened, ...). A miss computes the views (and checks the
  torch-side facts the C ABI cannot see: device placement, dtypes torch has
  and kdajit does not); a hit reuses their bytes;
- the whole kdajit_decode_args_t is then one struct.pack of struct_size, the
  14 data pointers interleaved with those cached bytes, and the scalars; the bytes
  object goes straight to the C call (its full validation runs there on every
  call, before anything is launched or written);
- the stream is torch's current raw stream of x's device.

One module on purpose (about 600 lines): the mapping, its cache, the packer and
the launch share the cached layouts, and each op's key tuple is spelled out
tensor by tensor rather than built in a loop, because the loop costs more host
time per call than the whole C launch.
"""
import ctypes
import struct

import torch

from . import _abi, _runtime

D = 128  # head dim (spec: fixed)

_TORCH_DTYPES = {torch.float32: _abi.DTYPE_F32, torch.bfloat16: _abi.DTYPE_BF16, torch.int32: _abi.DTYPE_INT32}

# The arguments of the ops in FlashInfer's order, each with the struct field it
# fills, how its torch shape maps onto the view the contract describes, and the
# dtype it must have (for the message when torch's dtype has no kdajit code).
#   asis     the tensor's own dims
#   rows     [R, n] or [1, R, n]
#   rows_h   [R, H] or [1, R, H]
#   rows_hd  [R, H, 128], [1, R, H, 128], [R, H*128] or [1, R, H*128] -> [R, H, 128]
#   flat     any shape whose elements lie on one stride (A_log [H] or [1, 1, H, 1], ...) -> 1-D
#   bt       the chunk op's [T, H, 128] or FLA's [B, T, H, 128] -> [B*T, H, 128] (B and T on one stride)
#   bt_h     [T, H] or [B, T, H] -> [B*T, H]
_COMMON = (
    ("x", "x", "rows", "bf16"),
    ("weight", "conv_weight", "asis", "f32"),
    ("conv_state", "conv_state", "asis", "bf16"),
    ("raw_gate", "raw_gate", "rows_hd", "bf16"),
    ("raw_beta", "raw_beta", "rows_h", "bf16"),
    ("A_log", "A_log", "flat", "f32"),
    ("dt_bias", "dt_bias", "flat", "f32"),
)
_TAIL = (
    ("state", "state", "asis", "f32 or bf16"),
    ("output_gate", "output_gate", "rows_hd", "bf16"),
    ("norm_weight", "norm_weight", "flat", "f32"),
    ("output", "output", "rows_hd", "bf16"),
)
SINGLE_ARGS = _COMMON + (("state_indices", "state_indices", "flat", "int32"),) + _TAIL
PACKED_ARGS = _COMMON + (("state_indices", "state_indices", "asis", "int32"),) + _TAIL + (
    ("query_start_loc", "query_start_loc", "flat", "int32"),
    ("num_accepted_tokens", "num_accepted_tokens", "flat", "int32"),
)
_FIELD_TO_ARG = {field: name for name, field, _, _ in PACKED_ARGS}


# --- The packer: derived from the ctypes layout (_abi), checked against it -----

def _make_packer(DA=_abi.DecodeArgs, tensor_fields=_abi.TENSOR_FIELDS, scalar_fields=_abi.SCALAR_FIELDS,
                 c_name="kdajit_decode_args_t"):
    """struct.Struct over an args struct (kdajit_decode_args_t by default):
    struct_size, then per tensor field its data pointer ('Q') and the rest of
    its kdajit_tensor_t as one bytes chunk, then the scalar fields; gaps become
    pad bytes. Any field not covered fails here."""
    T = _abi.Tensor
    covered = set(tensor_fields) | {name for name, _ in _abi.HEAD_FIELDS + scalar_fields}
    declared = {name for name, _ in DA._fields_}
    if covered != declared or T._fields_[0][0] != "data" or T.data.offset != 0:
        raise ImportError(f"kdajit: the packer expects {c_name} = struct_size + tensor views (data "
                          f"first) + {[n for n, _ in scalar_fields]}; the ctypes layout in _abi.py differs")
    chunk = ctypes.sizeof(T) - T.data.size
    fmt, pos = "<", 0
    for name, code in _abi.HEAD_FIELDS:
        f = getattr(DA, name)
        fmt += (f"{f.offset - pos}x" if f.offset > pos else "") + code
        pos = f.offset + f.size
    for name in tensor_fields:
        off = getattr(DA, name).offset
        fmt += (f"{off - pos}x" if off > pos else "") + f"Q{chunk}s"
        pos = off + ctypes.sizeof(T)
    for name, code in scalar_fields:
        f = getattr(DA, name)
        fmt += (f"{f.offset - pos}x" if f.offset > pos else "") + code
        pos = f.offset + f.size
    end = ctypes.sizeof(DA)
    fmt += f"{end - pos}x" if end > pos else ""
    packer = struct.Struct(fmt)
    if packer.size != end:
        raise ImportError(f"kdajit: packer size {packer.size} != sizeof({c_name}) {end}")
    return packer, T.data.size


def _op_table(spec_name, spec, DA, tensor_fields_name, scalar_fields_name, c_name):
    """An op's argument table `spec` ((argument, struct field, form, dtype) in
    the struct's field order), checked against _abi's field lists: (struct field
    -> argument name, the packer of struct `DA`, sizeof(DA))."""
    tensor_fields = getattr(_abi, tensor_fields_name)
    if tuple(f for _, f, _, _ in spec) != tensor_fields:
        raise ImportError(f"kdajit: {spec_name} and _abi.{tensor_fields_name} list different fields")
    packer, _ = _make_packer(DA, tensor_fields, getattr(_abi, scalar_fields_name), c_name)
    return {field: name for name, field, _, _ in spec}, packer, ctypes.sizeof(DA)


_PACKER, _PTR_BYTES = _make_packer()
_pack = _PACKER.pack
_ARGS_SIZE = ctypes.sizeof(_abi.DecodeArgs)  # the struct_size every packed call carries
_EMPTY = bytes(ctypes.sizeof(_abi.Tensor) - _PTR_BYTES)  # an unused view: all zero


def _view_bytes(dtype_code, shape, strides):
    t = _abi.Tensor()
    t.dtype = dtype_code
    t.ndim = len(shape)
    for i, (n, s) in enumerate(zip(shape, strides)):
        t.shape[i] = n
        t.strides[i] = s
    return bytes(t)[_PTR_BYTES:]


def _fmt(seq, open_, close):
    return open_ + ", ".join(str(v) for v in seq) + close


# --- Views: torch shapes -> the contract's views ------------------------------

def _flat(name, shape, strides):
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if not dims:
        n = 1
        for v in shape:
            n *= v
        return (n,), (1,)
    for (n0, s0), (n1, s1) in zip(dims, dims[1:]):
        if s0 != s1 * n1:
            raise ValueError(f"{name}: expected its elements on one stride (e.g. a contiguous 1-D tensor), "
                             f"got shape {_fmt(shape, '[', ']')} strides {_fmt(strides, '(', ')')}")
    n = 1
    for v, _ in dims:
        n *= v
    return (n,), (dims[-1][1],)


def _view(name, form, shape, strides, heads):
    """(shape, strides) of the view kdajit gets for one argument."""
    shape, strides = tuple(shape), tuple(strides)
    if form == "flat":
        return _flat(name, shape, strides)
    if form in ("rows", "rows_h"):
        if len(shape) == 3 and shape[0] == 1:
            shape, strides = shape[1:], strides[1:]
    elif form == "rows_hd":
        if len(shape) == 4 and shape[0] == 1:
            shape, strides = shape[1:], strides[1:]
        elif len(shape) == 3 and shape[1:] != (heads, D) and shape[0] == 1 and shape[2] == heads * D:
            shape, strides = shape[1:], strides[1:]
        if len(shape) == 2 and shape[1] == heads * D:
            # [R, H*128] -> [R, H, 128] (a view: the channel stride splits into head and element)
            shape, strides = (shape[0], heads, D), (strides[0], D * strides[1], strides[1])
    elif form in ("bt", "bt_h") and len(shape) == (4 if form == "bt" else 3):
        # FLA's [B, T, ...] -> [B*T, ...] rows: B and T must lie on one stride.
        (b, t), (sb, st) = shape[:2], strides[:2]
        if b == 1 or t == 1 or sb == t * st:
            rows, row_stride = b * t, (sb if t == 1 and b != 1 else st)
            shape, strides = (rows,) + shape[2:], (row_stride,) + strides[2:]
        else:
            raise ValueError(f"{name}: expected [B, T, ...] whose batch stride is T times its token stride (the "
                             f"B*T rows on one stride), got shape {_fmt(shape, '[', ']')} strides "
                             f"{_fmt(strides, '(', ')')}")
    if len(shape) > _abi.MAX_DIMS:
        raise ValueError(f"{name}: expected at most {_abi.MAX_DIMS} dims, got shape {_fmt(shape, '[', ']')}")
    return shape, strides


class _Mapping:
    """One cached mapping: the view bytes per struct tensor field, and what the
    views were made from (for error messages)."""

    __slots__ = ("chunks", "device", "device_name", "notes")

    def __init__(self, chunks, device, device_name, notes):
        self.chunks = chunks
        self.device = device  # torch's get_device(): -1 for host tensors
        self.device_name = device_name
        self.notes = notes


def _heads_of(A_log):
    n = 1
    for v in A_log.shape:
        n *= v
    return n


def _check_torch_side(spec, tensors):
    """Tensors, all on x's device, with dtypes kdajit has codes for."""
    for (name, _, _, want), t in zip(spec, tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor ({want}), got {type(t).__name__}")
        if t.layout != torch.strided:
            raise ValueError(f"{name}: expected a strided (dense) tensor ({want}), got layout {t.layout}")
    x, lead = tensors[0], spec[0][0]  # x, or the chunk op's q
    for (name, _, _, want), t in zip(spec, tensors):
        if t.device != x.device:
            raise ValueError(f"{name}: expected a tensor on {x.device} (the device of {lead}), got {t.device}")
        if t.dtype not in _TORCH_DTYPES:
            raise ValueError(f"{name}: expected dtype {want}, got {t.dtype}")


def _map(spec, tensors, num_fields=len(_abi.TENSOR_FIELDS)):
    """The mapping for one call's tensors (a cache miss). Raises ValueError for
    the torch-side contract violations: mixed devices and dtypes that kdajit
    has no code for. Whether the device is a CUDA one is checked per call.
    A tensor given as None (an optional argument) gets the empty view; the
    chunks are padded with empty views to the struct's num_fields."""
    given = [(s, t) for s, t in zip(spec, tensors) if t is not None]
    _check_torch_side([s for s, _ in given], [t for _, t in given])
    x = tensors[0]
    device = x.get_device()
    heads = _heads_of(tensors[5])
    chunks, notes = [], {}
    for (name, field, form, _), t in zip(spec, tensors):
        if t is None:
            chunks.append(_EMPTY)
            continue
        shape, strides = _view(name, form, t.shape, t.stride(), heads)
        chunks.append(_view_bytes(_TORCH_DTYPES[t.dtype], shape, strides))
        if t.numel() == 0 and t.data_ptr() == 0:
            notes[field] = f"given shape {_fmt(t.shape, '[', ']')}: an empty tensor, which torch gives no data pointer"
        elif shape != tuple(t.shape) or strides != tuple(t.stride()):
            notes[field] = (f"given shape {_fmt(t.shape, '[', ']')} strides {_fmt(t.stride(), '(', ')')}, "
                            f"viewed as shape {_fmt(shape, '[', ']')} strides {_fmt(strides, '(', ')')}")
    chunks += [_EMPTY] * (num_fields - len(chunks))
    return _Mapping(tuple(chunks), device, str(x.device), notes)


def _not_tensors(spec, tensors):
    """A call whose key could not be built: name the argument that is not a
    tensor, or not a strided one (sparse tensors have no strides)."""
    for (name, _, _, want), t in zip(spec, tensors):
        if not isinstance(t, torch.Tensor):
            return ValueError(f"{name}: expected a torch.Tensor ({want}), got {type(t).__name__}")
        if t.layout != torch.strided:
            return ValueError(f"{name}: expected a strided (dense) tensor ({want}), got layout {t.layout}")
    return ValueError("expected strided torch tensors")


def _mode_of(state_indices_mode):
    """The kdajit_indices_mode_t of a mode name; -1 for anything else (unhashable values included)."""
    try:
        return _MODES.get(state_indices_mode, -1)
    except TypeError:
        return -1


def _scalar_error(lower_bound, norm_eps, mode, mode_given=None):
    if mode < 0:
        names = list(_MODES)
        return ValueError(f"state_indices_mode: expected {', '.join(map(repr, names[:-1]))} or {names[-1]!r}, "
                          f"got {mode_given!r}")
    for name, v in (("lower_bound", lower_bound), ("norm_eps", norm_eps)):
        try:
            struct.pack("<f", 0.0 if v is None else v)
        except (struct.error, TypeError, OverflowError) as e:
            return ValueError(f"{name}: expected a float representable as f32, got {v!r} ({e})")
    return ValueError("lower_bound / norm_eps: expected floats")


# --- The C calls ---------------------------------------------------------------

_MODES = {}  # the library's indices_mode spellings, filled by _bind()
_CACHE_LIMIT = 4096
_cache_single = {}
_cache_packed = {}
# The last call's (key, mapping) per op: an engine passes one layout step after step,
# and comparing the new key with the last one is the dict's work without the hash
# (the hash of the 48-56 element key is a third of the lookup). A mapping is a value
# of its key alone, so this pair stays right whatever happens to the dicts.
_last_single = (None, None)
_last_packed = (None, None)


def _clear_caches():
    """Forgets every mapping (tests)."""
    global _last_single, _last_packed
    _cache_single.clear()
    _cache_packed.clear()
    _cache_prefill.clear()
    _cache_chunk.clear()
    _last_single = _last_packed = (None, None)
    if _hot_module is not None:
        _hot_module.clear()


_c = None  # (kdajit_single_decode, kdajit_packed_decode, kdajit_validate_args), bound on first use


# kdajit._hotpath (python/hotpath/hotpath.cpp), the C++ cache-hit path: its
# launch() and remember() once loaded; None means every call takes the Python path.
_hot = None
_hot_remember = None
_hot_module = None
_hot_info = {"enabled": False, "path": None, "reason": "not loaded yet (the first call loads it)"}


def _load_hotpath(lib):
    """Loads kdajit._hotpath from the directory of the libkdajit.so in use, if it
    is there and was built for this torch; returns (module or None, info)."""
    import importlib.machinery
    import importlib.util
    import os
    import sysconfig

    def off(reason, path=None):
        return None, {"enabled": False, "path": path, "reason": reason}

    flag = os.environ.get("KDAJIT_PYTHON_HOTPATH", "1")
    if flag not in ("0", "1"):
        raise ValueError(f"KDAJIT_PYTHON_HOTPATH: expected 0 or 1, got {flag!r}")
    if flag == "0":
        return off("off: KDAJIT_PYTHON_HOTPATH=0")
    if not os.path.dirname(lib.path):
        return off(f"libkdajit.so came from the system's search path ({lib.path}), not a directory")
    path = os.path.join(os.path.dirname(os.path.realpath(lib.path)), "_hotpath" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not os.path.exists(path):
        return off(f"not built: {path} is missing (CMake builds it when torch's C++ headers are found)", path)
    try:
        loader = importlib.machinery.ExtensionFileLoader("kdajit._hotpath", path)
        spec = importlib.util.spec_from_file_location("kdajit._hotpath", path, loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
    except ImportError as e:
        return off(f"cannot load {path}: {e}", path)
    if mod.torch_version != torch.__version__:
        return off(f"built for torch {mod.torch_version}, running torch {torch.__version__}", path)
    if mod.args_size != ctypes.sizeof(_abi.DecodeArgs):
        return off(f"built for a kdajit_decode_args_t of {mod.args_size} bytes, this package's is "
                   f"{ctypes.sizeof(_abi.DecodeArgs)}", path)
    cuda = hasattr(torch._C, "_cuda_getCurrentRawStream") and hasattr(torch._C, "_cuda_getDevice")
    mod.bind(ctypes.cast(lib.kdajit_single_decode, ctypes.c_void_p).value,
             ctypes.cast(lib.kdajit_packed_decode, ctypes.c_void_p).value,
             torch._C._cuda_getCurrentRawStream if cuda else None, torch._C._cuda_getDevice if cuda else None)
    return mod, {"enabled": True, "path": path, "reason": f"loaded, built for torch {mod.torch_version}"}


def hotpath_info():
    """Whether eager calls take the C++ cache-hit path (kdajit._hotpath): a dict with
    'enabled', 'path' and 'reason'. Loads the library (and the extension) if needed."""
    if _c is None:
        _bind()
    return dict(_hot_info)


def _bind():
    global _c, _hot, _hot_remember, _hot_module, _hot_info
    lib = _abi.load()
    _MODES.update(lib.enum("indices_mode"))
    mod, _hot_info = _load_hotpath(lib)
    if mod is not None:
        _hot_module, _hot, _hot_remember = mod, mod.launch, mod.remember
    _c = (lib.kdajit_single_decode, lib.kdajit_packed_decode, lib.kdajit_validate_args)
    return _c


def _retry_on_python_path(status, x):
    """A failed _hotpath call that the Python path retries: a CUDA error on the
    legacy default stream (maybe a thread without a current context; see _launch)."""
    return status == _abi.ERROR_CUDA and not _raw_stream(x.get_device())


def _handle():
    rt = _runtime._runtime
    return rt.handle if rt is not None else _runtime.runtime().handle


if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    _raw_stream = torch._C._cuda_getCurrentRawStream
else:  # pragma: no cover (every torch this package supports has it)
    def _raw_stream(device):
        return torch.cuda.current_stream(device).cuda_stream


def _current_device():
    return torch._C._cuda_getDevice()


def _fail(status, op, mapping, field_to_arg=None):
    """The exception for a failed C call; the argument's view is named when the
    Python mapping changed its dims. field_to_arg: the op's argument names per
    struct field, where they differ (default: the decode ops')."""
    lib = _abi.load()
    msg = lib.last_error()
    field = msg.split(":", 1)[0]
    if status in (_abi.ERROR_INVALID_ARGUMENT, _abi.ERROR_UNSUPPORTED):
        arg = (_FIELD_TO_ARG if field_to_arg is None else field_to_arg).get(field)
        if arg and arg != field:
            msg = f"{arg} ({field}){msg[len(field):]}"
        if field in mapping.notes:
            msg += f" [{arg or field}: {mapping.notes[field]}]"
        return _abi.error_for(status, msg)
    return _abi.KdajitError(f"kdajit {op}: {lib.status_name(status)}: {msg}", status)


# Tests set this to run the real decode entry points on host tensors: the C
# library validates before it needs a GPU, so contract violations surface
# exactly as on a device, and a valid call fails at the driver (nothing launched).
_allow_host_tensors = False


def _launch(fn_index, op, args, mapping):
    """Runs the decode entry point on the current stream of the tensors' device."""
    c = _c or _bind()
    _run(c[fn_index], op, args, mapping)


def _run(fn, op, args, mapping, field_to_arg=None, lead="x"):
    """Runs entry point fn(runtime, args, stream) on the current stream of the
    tensors' device; raises _fail's exception for a failed status. lead: the
    argument whose device the call runs on (x, or the chunk op's q)."""
    device = mapping.device
    if device < 0:
        if not _allow_host_tensors:
            raise ValueError(f"{lead}: expected a CUDA tensor, got device {mapping.device_name}")
        status = fn(_handle(), args, 0)
    else:
        stream = _raw_stream(device)
        if stream or _current_device() == device:
            status = fn(_handle(), args, stream)
        else:
            # The legacy default stream means "the current context": make it x's device's.
            with torch.cuda.device(device):
                status = fn(_handle(), args, stream)
        if status == _abi.ERROR_CUDA and not stream:
            # Maybe a thread without a current CUDA context (nothing was launched):
            # a runtime API call in this thread makes the device's primary context
            # current; retry once. (The legacy stream is never a capturing one.)
            with torch.cuda.device(device):
                torch.cuda.synchronize(device)
                status = fn(_handle(), args, stream)
    if status:
        raise _fail(status, op, mapping, field_to_arg)


def _dry(op_code, op, args, mapping, what):
    """what True: kdajit_validate_args, returns the args bytes; "key": the kernel key
    name kdajit_selected_key gives for a call on the current stream."""
    c = _c or _bind()
    if what == "key":
        lib = _abi.load()
        stream = _raw_stream(mapping.device) if mapping.device >= 0 else 0
        buf = ctypes.create_string_buffer(256)
        status = lib.kdajit_selected_key(_handle(), op_code, args, stream, buf, len(buf))
        if status:
            raise _fail(status, op, mapping)
        return buf.value.decode()
    status = c[2](op_code, args)
    if status:
        raise _fail(status, op, mapping)
    return args


def _single_args(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate,
                 norm_weight, lower_bound, norm_eps, output, state_indices_mode):
    """The Python path of the single op: (mapping, kdajit_decode_args_t bytes)."""
    global _last_single
    try:
        key = (x.shape, x.stride(), x.dtype, x.get_device(),
               weight.shape, weight.stride(), weight.dtype, weight.get_device(),
               conv_state.shape, conv_state.stride(), conv_state.dtype, conv_state.get_device(),
               raw_gate.shape, raw_gate.stride(), raw_gate.dtype, raw_gate.get_device(),
               raw_beta.shape, raw_beta.stride(), raw_beta.dtype, raw_beta.get_device(),
               A_log.shape, A_log.stride(), A_log.dtype, A_log.get_device(),
               dt_bias.shape, dt_bias.stride(), dt_bias.dtype, dt_bias.get_device(),
               state_indices.shape, state_indices.stride(), state_indices.dtype, state_indices.get_device(),
               state.shape, state.stride(), state.dtype, state.get_device(),
               output_gate.shape, output_gate.stride(), output_gate.dtype, output_gate.get_device(),
               norm_weight.shape, norm_weight.stride(), norm_weight.dtype, norm_weight.get_device(),
               output.shape, output.stride(), output.dtype, output.get_device())
    except (AttributeError, TypeError, RuntimeError):
        raise _not_tensors(SINGLE_ARGS, (x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices,
                                         state, output_gate, norm_weight, output)) from None
    last_key, m = _last_single
    if key != last_key:
        m = _cache_single.get(key)
        if m is None:
            m = _map(SINGLE_ARGS, (x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                                   output_gate, norm_weight, output))
            if len(_cache_single) >= _CACHE_LIMIT:
                _cache_single.clear()
            _cache_single[key] = m
        _last_single = (key, m)
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13 = m.chunks
    mode = _mode_of(state_indices_mode)
    try:
        if mode < 0:
            raise ValueError
        args = _pack(_ARGS_SIZE, x.data_ptr(), c0, weight.data_ptr(), c1, conv_state.data_ptr(), c2, raw_gate.data_ptr(), c3,
                     raw_beta.data_ptr(), c4, A_log.data_ptr(), c5, dt_bias.data_ptr(), c6,
                     state_indices.data_ptr(), c7, state.data_ptr(), c8, output_gate.data_ptr(), c9,
                     norm_weight.data_ptr(), c10, output.data_ptr(), c11, 0, c12, 0, c13,
                     _abi.GATE_SOFTPLUS if lower_bound is None else _abi.GATE_BOUNDED,
                     0.0 if lower_bound is None else lower_bound, norm_eps, mode, 0)
    except RuntimeError:  # data_ptr() of a tensor without storage (sparse)
        raise _not_tensors(SINGLE_ARGS, (x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices,
                                         state, output_gate, norm_weight, output)) from None
    except (ValueError, struct.error, TypeError, OverflowError):
        raise _scalar_error(lower_bound, norm_eps, mode, state_indices_mode) from None
    return m, args


def single_impl(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate,
                norm_weight, lower_bound, norm_eps, output, state_indices_mode, dry=False):
    """The single op on given tensors (output allocated by the caller). dry=True: validate
    in the C library instead of launching and return the kdajit_decode_args_t bytes;
    dry="key": return the kernel key name the call would launch (nothing launched)."""
    if _c is None:
        _bind()
    if _hot is not None and not dry:
        status = _hot(0, _handle(), lower_bound, norm_eps, _mode_of(state_indices_mode), x, weight,
                      conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate, norm_weight,
                      output)
        if status == 0:
            return None
        if status > 0 and not _retry_on_python_path(status, x):
            m, _ = _single_args(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                                output_gate, norm_weight, lower_bound, norm_eps, output, state_indices_mode)
            raise _fail(status, "fused_kda_decode", m)
    m, args = _single_args(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                           output_gate, norm_weight, lower_bound, norm_eps, output, state_indices_mode)
    if dry or m.device < 0:
        # The key tells CUDA devices apart, not host ones (get_device() is -1 for cpu and meta).
        _check_torch_side(SINGLE_ARGS, (x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices,
                                        state, output_gate, norm_weight, output))
    if dry:
        return _dry(_abi.OP_SINGLE, "fused_kda_decode", args, m, dry)
    _launch(0, "fused_kda_decode", args, m)
    if _hot is not None and m.device >= 0:
        _hot_remember(0, args, x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                      output_gate, norm_weight, output)
    return None


def _packed_args(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate,
                 norm_weight, lower_bound, norm_eps, output, query_start_loc, num_accepted_tokens):
    """The Python path of the packed op: (mapping, kdajit_decode_args_t bytes)."""
    global _last_packed
    try:
        key = (x.shape, x.stride(), x.dtype, x.get_device(),
               weight.shape, weight.stride(), weight.dtype, weight.get_device(),
               conv_state.shape, conv_state.stride(), conv_state.dtype, conv_state.get_device(),
               raw_gate.shape, raw_gate.stride(), raw_gate.dtype, raw_gate.get_device(),
               raw_beta.shape, raw_beta.stride(), raw_beta.dtype, raw_beta.get_device(),
               A_log.shape, A_log.stride(), A_log.dtype, A_log.get_device(),
               dt_bias.shape, dt_bias.stride(), dt_bias.dtype, dt_bias.get_device(),
               state_indices.shape, state_indices.stride(), state_indices.dtype, state_indices.get_device(),
               state.shape, state.stride(), state.dtype, state.get_device(),
               output_gate.shape, output_gate.stride(), output_gate.dtype, output_gate.get_device(),
               norm_weight.shape, norm_weight.stride(), norm_weight.dtype, norm_weight.get_device(),
               output.shape, output.stride(), output.dtype, output.get_device(),
               query_start_loc.shape, query_start_loc.stride(), query_start_loc.dtype, query_start_loc.get_device(),
               num_accepted_tokens.shape, num_accepted_tokens.stride(), num_accepted_tokens.dtype,
               num_accepted_tokens.get_device())
    except (AttributeError, TypeError, RuntimeError):
        raise _not_tensors(PACKED_ARGS, (x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices,
                                         state, output_gate, norm_weight, output, query_start_loc,
                                         num_accepted_tokens)) from None
    last_key, m = _last_packed
    if key != last_key:
        m = _cache_packed.get(key)
        if m is None:
            m = _map(PACKED_ARGS, (x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                                   output_gate, norm_weight, output, query_start_loc, num_accepted_tokens))
            if len(_cache_packed) >= _CACHE_LIMIT:
                _cache_packed.clear()
            _cache_packed[key] = m
        _last_packed = (key, m)
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13 = m.chunks
    try:
        args = _pack(_ARGS_SIZE, x.data_ptr(), c0, weight.data_ptr(), c1, conv_state.data_ptr(), c2, raw_gate.data_ptr(), c3,
                     raw_beta.data_ptr(), c4, A_log.data_ptr(), c5, dt_bias.data_ptr(), c6,
                     state_indices.data_ptr(), c7, state.data_ptr(), c8, output_gate.data_ptr(), c9,
                     norm_weight.data_ptr(), c10, output.data_ptr(), c11, query_start_loc.data_ptr(), c12,
                     num_accepted_tokens.data_ptr(), c13,
                     _abi.GATE_SOFTPLUS if lower_bound is None else _abi.GATE_BOUNDED,
                     0.0 if lower_bound is None else lower_bound, norm_eps, _abi.INDICES_UNIQUE_OR_NULL, 0)
    except RuntimeError:  # data_ptr() of a tensor without storage (sparse)
        raise _not_tensors(PACKED_ARGS, (x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices,
                                         state, output_gate, norm_weight, output, query_start_loc,
                                         num_accepted_tokens)) from None
    except (struct.error, TypeError, OverflowError):
        raise _scalar_error(lower_bound, norm_eps, 0) from None
    return m, args


def packed_impl(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate,
                norm_weight, lower_bound, norm_eps, output, query_start_loc, num_accepted_tokens, dry=False):
    """The packed op on given tensors; see single_impl."""
    if _c is None:
        _bind()
    if _hot is not None and not dry:
        status = _hot(1, _handle(), lower_bound, norm_eps, _abi.INDICES_UNIQUE_OR_NULL, x, weight, conv_state,
                      raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate, norm_weight, output,
                      query_start_loc, num_accepted_tokens)
        if status == 0:
            return None
        if status > 0 and not _retry_on_python_path(status, x):
            m, _ = _packed_args(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                                output_gate, norm_weight, lower_bound, norm_eps, output, query_start_loc,
                                num_accepted_tokens)
            raise _fail(status, "packed_fused_kda_decode", m)
    m, args = _packed_args(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                           output_gate, norm_weight, lower_bound, norm_eps, output, query_start_loc,
                           num_accepted_tokens)
    if dry or m.device < 0:
        _check_torch_side(PACKED_ARGS, (x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices,
                                        state, output_gate, norm_weight, output, query_start_loc,
                                        num_accepted_tokens))
    if dry:
        return _dry(_abi.OP_PACKED, "packed_fused_kda_decode", args, m, dry)
    _launch(1, "packed_fused_kda_decode", args, m)
    if _hot is not None and m.device >= 0:
        _hot_remember(1, args, x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                      output_gate, norm_weight, output, query_start_loc, num_accepted_tokens)
    return None


def _extent(t):
    """Elements between t's first and last element, both included (0 when empty)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))


def new_output(x, A_log, validate):
    """FlashInfer's output: [1, R, H, 128] bf16 on x's device, allocated only
    when x spans at least as many elements as it (a valid x spans 3*H*128 per
    row). Otherwise x, or A_log's H, breaks the contract: validate(stand_in), the
    call's validation with a small stand-in output, raises the ValueError
    naming it, before anything is allocated. validate None (a traced call, whose
    tensors hold no memory): allocated as it is."""
    for name, t in (("x", x), ("A_log", A_log)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise ValueError(f"{name}: expected a strided (dense) tensor, got layout {t.layout}")
    rows = x.shape[-2] if x.dim() >= 2 else 0
    heads = A_log.numel()
    if validate is None or rows * heads * D <= _extent(x):
        return torch.empty((1, rows, heads, D), dtype=torch.bfloat16, device=x.device)
    try:
        validate(torch.empty((1, 1, 1, D), dtype=torch.bfloat16, device=x.device))
    except ValueError as e:
        if not str(e).startswith("output"):  # the stand-in's own mismatch is no news
            raise
    raise ValueError(f"x: expected R rows of 3*H*128 elements (H = {heads} from A_log), which the output of "
                     f"[1, R, H, 128] needs, got shape {_fmt(x.shape, '[', ']')} strides {_fmt(x.stride(), '(', ')')}")


# --- The prefill op ---------------------------------------------------------------
# kdajit_prefill_args_t from torch tensors: the decode ops' mapping of each tensor
# (the same forms), a cache of mappings per layout, and one struct.pack. A
# prefill call moves a whole prompt, so this path is plain Python: no C++ fast path.

# (argument, struct field, form, dtype), in the struct's field order.
PREFILL_ARGS = (
    ("x", "x", "rows", "bf16"),
    ("conv_weight", "conv_weight", "asis", "f32"),
    ("conv_state", "conv_state", "asis", "bf16"),
    ("raw_gate", "raw_gate", "rows_hd", "bf16"),
    ("raw_beta", "raw_beta", "rows_h", "bf16"),
    ("A_log", "A_log", "flat", "f32"),
    ("dt_bias", "dt_bias", "flat", "f32"),
    ("state_indices", "state_indices", "flat", "int32"),
    ("has_initial_state", "has_initial_state", "flat", "int32"),
    ("state", "state", "asis", "f32 or bf16"),
    ("output_gate", "output_gate", "rows_hd", "bf16"),
    ("norm_weight", "norm_weight", "flat", "f32"),
    ("out", "output", "rows_hd", "bf16"),
    ("query_start_loc", "query_start_loc", "flat", "int32"),
)
_PREFILL_FIELD_TO_ARG, _PREFILL_PACKER, _PREFILL_SIZE = _op_table(
    "PREFILL_ARGS", PREFILL_ARGS, _abi.PrefillArgs, "PREFILL_TENSOR_FIELDS", "PREFILL_SCALAR_FIELDS",
    "kdajit_prefill_args_t")
_PREFILL_OPTIONAL = frozenset(("has_initial_state",))
_cache_prefill = {}


def _check_tensors(spec, tensors, optional=frozenset()):
    """Names the first argument of `spec` that is not a strided torch.Tensor
    (None passes for the `optional` names: an empty view)."""
    for (name, _, _, want), t in zip(spec, tensors):
        if t is None and name in optional:
            continue
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor ({want}), got {type(t).__name__}")
        if t.layout != torch.strided:
            raise ValueError(f"{name}: expected a strided (dense) tensor ({want}), got layout {t.layout}")


def _mapped_views(spec, tensors, cache, num_fields):
    """(mapping, [data pointer, view chunk] per tensor) for the tensors of `spec`
    (None: an empty view), the mapping cached in `cache` by the tensors' shapes,
    strides, dtypes and devices."""
    key = tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in tensors)
    m = cache.get(key)
    if m is None:
        m = _map(spec, tensors, num_fields)
        if len(cache) >= _CACHE_LIMIT:
            cache.clear()
        cache[key] = m
    values = []
    for t, chunk in zip(tensors, m.chunks):
        values += (0 if t is None else t.data_ptr(), chunk)
    return m, values


def _check_f32(*named_values):
    """Each (name, value) must pack as an IEEE f32."""
    for name, v in named_values:
        try:
            struct.pack("<f", v)
        except (struct.error, TypeError, OverflowError) as e:
            raise ValueError(f"{name}: expected a float representable as f32, got {v!r} ({e})") from None


def _check_max_seq_len(max_seq_len):
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or not 0 <= max_seq_len <= _abi.INT64_MAX:
        raise ValueError(f"max_seq_len: expected an int >= 0 (an upper bound of the longest sequence; 0: T_total), "
                         f"got {max_seq_len!r}")


def _gate_code(gate):
    """The kdajit_gate_t of a gate name ('bounded' or 'softplus', the library's spellings)."""
    gates = _abi.enum("gate")
    code = gates.get(gate) if isinstance(gate, str) else None
    if code is None:
        names = list(gates)
        raise ValueError(f"gate: expected {' or '.join(map(repr, names))}, got {gate!r}")
    return code


def _prefill_scalars(x, gate, lower_bound, norm_eps, max_seq_len, oob_counter):
    """(gate code, max_seq_len, oob_counter address) after the Python-side checks."""
    code = _gate_code(gate)
    _check_max_seq_len(max_seq_len)
    counter = 0
    if oob_counter is not None:
        if not isinstance(oob_counter, torch.Tensor) or oob_counter.layout != torch.strided:
            raise ValueError(f"oob_counter: expected None or a strided int32 torch.Tensor, got "
                             f"{type(oob_counter).__name__}")
        if oob_counter.dtype != torch.int32 or oob_counter.numel() < 1:
            raise ValueError(f"oob_counter: expected an int32 tensor of at least one element, got "
                             f"{oob_counter.dtype} of shape {_fmt(oob_counter.shape, '[', ']')}")
        if isinstance(x, torch.Tensor) and oob_counter.device != x.device:
            raise ValueError(f"oob_counter: expected a tensor on {x.device} (the device of x), got "
                             f"{oob_counter.device}")
        counter = oob_counter.data_ptr()
    _check_f32(("lower_bound", lower_bound), ("norm_eps", norm_eps))
    return code, max_seq_len, counter


def _workspace(workspace, lead, lead_name):
    """(address, bytes) of a chunked op's workspace: None, or a strided tensor
    on the device of `lead` (its bytes are scratch; route twopass needs
    prefill_workspace_bytes() of them, 16-byte aligned, which the library checks)."""
    if workspace is None:
        return 0, 0
    if not isinstance(workspace, torch.Tensor) or workspace.layout != torch.strided:
        raise ValueError(f"workspace: expected None or a strided torch.Tensor, got {type(workspace).__name__}")
    if not workspace.is_contiguous():
        raise ValueError(f"workspace: expected a contiguous tensor, got strides {_fmt(workspace.stride(), '(', ')')}")
    if isinstance(lead, torch.Tensor) and workspace.device != lead.device:
        raise ValueError(f"workspace: expected a tensor on {lead.device} (the device of {lead_name}), got "
                         f"{workspace.device}")
    nbytes = workspace.numel() * workspace.element_size()
    return (workspace.data_ptr() if nbytes else 0), nbytes


def prefill_workspace_bytes(num_seqs, total_tokens, heads):
    """The workspace bytes route twopass needs for a prefill or chunk call (kdajit_prefill_workspace_bytes)."""
    for name, v in (("num_seqs", num_seqs), ("total_tokens", total_tokens), ("heads", heads)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _abi.INT64_MAX:
            raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
    lib = _abi.load()
    lib.prefill_entry_points()
    return lib.kdajit_prefill_workspace_bytes(num_seqs, total_tokens, heads)


def prefill_args(x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate,
                 norm_weight, query_start_loc, has_initial_state, gate, lower_bound, norm_eps, max_seq_len, out,
                 oob_counter, workspace=None):
    """The Python path of the prefill op: (mapping, kdajit_prefill_args_t bytes).
    Raises ValueError for what torch shows and the C ABI cannot see (non-tensors,
    mixed devices, dtypes without a kdajit code, the scalars' Python types); the
    library validates the rest."""
    tensors = (x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, has_initial_state,
               state, output_gate, norm_weight, out, query_start_loc)
    _check_tensors(PREFILL_ARGS, tensors, _PREFILL_OPTIONAL)
    gate_code, max_seq_len, counter = _prefill_scalars(x, gate, lower_bound, norm_eps, max_seq_len, oob_counter)
    m, values = _mapped_views(PREFILL_ARGS, tensors, _cache_prefill, len(_abi.PREFILL_TENSOR_FIELDS))
    ws = _workspace(workspace, x, "x")
    args = _PREFILL_PACKER.pack(_PREFILL_SIZE, *values, gate_code, lower_bound, norm_eps, max_seq_len, counter, *ws)
    return m, args


def _key_of(query, op_name, op, args, mapping, field_to_arg):
    """The kernel key name the library's `query` (kdajit_selected_prefill_key or
    kdajit_selected_chunk_key) gives for a call of these args bytes on the
    current stream of the tensors' device (validation and route selection only)."""
    fn = _abi.load().key_query(query, op_name, op)
    stream = _raw_stream(mapping.device) if mapping.device >= 0 else 0
    buf = ctypes.create_string_buffer(256)
    status = fn(_handle(), args, stream, buf, len(buf))
    if status:
        raise _fail(status, op, mapping, field_to_arg)
    return buf.value.decode()


def _validate_op(entry_points, op, args, mapping, field_to_arg):
    """The library's validation of an op's args bytes (the validate half of
    _abi's `entry_points`, e.g. "prefill_entry_points"), as the op's launch runs
    it; raises the error naming the argument."""
    _, validate = getattr(_abi.load(), entry_points)()
    status = validate(args)
    if status:
        raise _fail(status, op, mapping, field_to_arg)


def _launch_prefill(args, mapping):
    """Runs kdajit_prefill on the current stream of the tensors' device."""
    prefill, _ = _abi.load().prefill_entry_points()
    _run(prefill, "fused_kda_prefill", args, mapping, _PREFILL_FIELD_TO_ARG)


def prefill_impl(x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate,
                 norm_weight, query_start_loc, has_initial_state, gate, lower_bound, norm_eps, max_seq_len, out,
                 oob_counter, dry=False, workspace=None):
    """The prefill op on given tensors (out allocated by the caller). dry=True:
    validate in the C library (kdajit_validate_prefill_args) instead of
    launching and return the kdajit_prefill_args_t bytes; dry="key": the kernel
    key name the call would launch."""
    m, args = prefill_args(x, conv_weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                           output_gate, norm_weight, query_start_loc, has_initial_state, gate, lower_bound, norm_eps,
                           max_seq_len, out, oob_counter, workspace)
    if dry == "key":
        return _key_of("kdajit_selected_prefill_key", "prefill", "fused_kda_prefill", args, m, _PREFILL_FIELD_TO_ARG)
    if dry:
        _validate_op("prefill_entry_points", "fused_kda_prefill", args, m, _PREFILL_FIELD_TO_ARG)
        return args
    _launch_prefill(args, m)
    return None


# --- The chunk op -----------------------------------------------------------------
# kdajit_chunk_args_t from FLA chunk_kda's tensors: the same mapping, cache and
# packing as the prefill op. kdajit.chunk_kda (_ops) turns FLA's arguments into
# these (the gate name, the flags as ints, cu_seqlens as int32, the outputs).

# (argument, struct field, form, dtype), in the struct's field order.
CHUNK_ARGS = (
    ("q", "q", "bt", "bf16"),
    ("k", "k", "bt", "bf16"),
    ("v", "v", "bt", "bf16"),
    ("g", "g", "bt", "bf16 or f32"),
    ("beta", "beta", "bt_h", "bf16 or f32"),
    ("A_log", "A_log", "flat", "f32"),
    ("dt_bias", "dt_bias", "flat", "f32"),
    ("initial_state", "initial_state", "asis", "f32 or bf16"),
    ("final_state", "final_state", "asis", "f32 or bf16"),
    ("out", "output", "bt", "bf16"),
    ("cu_seqlens", "cu_seqlens", "flat", "int32"),
)
_CHUNK_FIELD_TO_ARG, _CHUNK_PACKER, _CHUNK_SIZE = _op_table(
    "CHUNK_ARGS", CHUNK_ARGS, _abi.ChunkArgs, "CHUNK_TENSOR_FIELDS", "CHUNK_SCALAR_FIELDS", "kdajit_chunk_args_t")
_CHUNK_OPTIONAL = frozenset(("dt_bias", "initial_state", "final_state"))
_cache_chunk = {}


def _chunk_scalars(gate, lower_bound, scale, qk_l2norm, beta_sigmoid, state_v_first, max_seq_len):
    """The scalar fields of kdajit_chunk_args_t after the Python-side checks
    (types; the library checks the values: lower_bound < 0, scale > 0, ...)."""
    code = _gate_code(gate)
    _check_f32(("lower_bound", lower_bound), ("scale", scale))
    flags = []
    for name, v in (("use_qk_l2norm_in_kernel", qk_l2norm), ("use_beta_sigmoid_in_kernel", beta_sigmoid),
                    ("state_v_first", state_v_first)):
        if not isinstance(v, (bool, int)) or v not in (0, 1):
            raise ValueError(f"{name}: expected True or False, got {v!r}")
        flags.append(int(v))
    _check_max_seq_len(max_seq_len)
    return (code, lower_bound, scale, *flags, max_seq_len)


def chunk_args(q, k, v, g, beta, A_log, dt_bias, initial_state, final_state, out, cu_seqlens, gate, lower_bound,
               scale, qk_l2norm, beta_sigmoid, state_v_first, max_seq_len, workspace=None):
    """The Python path of the chunk op: (mapping, kdajit_chunk_args_t bytes).
    dt_bias, initial_state and final_state may be None (empty views). Raises
    ValueError for what torch shows and the C ABI cannot see (non-tensors,
    mixed devices, dtypes without a kdajit code, batch dims that do not merge,
    the scalars' Python types); the library validates the rest."""
    tensors = (q, k, v, g, beta, A_log, dt_bias, initial_state, final_state, out, cu_seqlens)
    _check_tensors(CHUNK_ARGS, tensors, _CHUNK_OPTIONAL)
    scalars = _chunk_scalars(gate, lower_bound, scale, qk_l2norm, beta_sigmoid, state_v_first, max_seq_len)
    m, values = _mapped_views(CHUNK_ARGS, tensors, _cache_chunk, len(_abi.CHUNK_TENSOR_FIELDS))
    return m, _CHUNK_PACKER.pack(_CHUNK_SIZE, *values, *scalars, *_workspace(workspace, q, "q"))


def _launch_chunk(args, mapping):
    """Runs kdajit_chunk on the current stream of the tensors' device."""
    if mapping.device < 0 and not _allow_host_tensors:  # named before the library is asked for the op
        raise ValueError(f"q: expected a CUDA tensor, got device {mapping.device_name}")
    chunk, _ = _abi.load().chunk_entry_points()
    _run(chunk, "chunk_kda", args, mapping, _CHUNK_FIELD_TO_ARG, lead="q")


def chunk_impl(q, k, v, g, beta, A_log, dt_bias, initial_state, final_state, out, cu_seqlens, gate, lower_bound,
               scale, qk_l2norm, beta_sigmoid, state_v_first, max_seq_len, dry=False, workspace=None):
    """The chunk op on given tensors (out, final_state and an int32 cu_seqlens
    prepared by the caller). dry=True: validate in the C library
    (kdajit_validate_chunk_args) instead of launching and return the
    kdajit_chunk_args_t bytes; dry="key": the kernel key name the call would launch."""
    m, args = chunk_args(q, k, v, g, beta, A_log, dt_bias, initial_state, final_state, out, cu_seqlens, gate,
                         lower_bound, scale, qk_l2norm, beta_sigmoid, state_v_first, max_seq_len, workspace)
    if dry == "key":
        return _key_of("kdajit_selected_chunk_key", "chunk", "chunk_kda", args, m, _CHUNK_FIELD_TO_ARG)
    if dry:
        _validate_op("chunk_entry_points", "chunk_kda", args, m, _CHUNK_FIELD_TO_ARG)
        return args
    _launch_chunk(args, m)
    return None
