"""Random single-token KDA decode problems (docs/CONTRACT.md §8) on torch tensors laid
out as docs/CONTRACT.md §1 says, and the project's float64 reference of one call
(docs/CONTRACT.md §2) on them."""
import dataclasses
import importlib.util
import math
import os

import torch

D = 128
W = 4
TAPS = W - 1  # conv history per channel for T = 1

TESTS_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "tests",
                                          "python"))
_kt = None


@dataclasses.dataclass
class Problem:
    x: torch.Tensor             # [R, qkv] bf16
    conv_weight: torch.Tensor   # [3, W, hidden] f32
    conv_state: torch.Tensor    # [S, qkv, 3] bf16, SD strides (slot, 1, qkv)
    raw_gate: torch.Tensor      # [R, H, D] bf16
    raw_beta: torch.Tensor      # [R, H] bf16
    A_log: torch.Tensor         # [H] f32
    dt_bias: torch.Tensor       # [hidden] f32
    state_indices: torch.Tensor  # [R] int32
    state: torch.Tensor         # [S, H, D(v), D(k)] f32 | bf16
    output_gate: torch.Tensor   # [R, H, D] bf16
    norm_weight: torch.Tensor   # [D] f32
    output: torch.Tensor        # [R, H, D] bf16, written by the op
    lower_bound: float = -5.0
    norm_eps: float = 1e-5
    gate_softplus: bool = False

    @property
    def heads(self):
        return self.A_log.shape[0]

    @property
    def rows(self):
        return self.x.shape[0]

    @property
    def slots(self):
        return self.state.shape[0]

    def live_rows(self):
        """Row indices with a valid slot (1 <= s < S), on the tensors' device."""
        s = self.state_indices.long()
        return torch.nonzero((s > 0) & (s < self.slots)).flatten()

    def to(self, device):
        """A copy on `device` that keeps every stride (row padding, the SD layout)."""
        fields = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            fields[f.name] = _copy_strided(v, device) if isinstance(v, torch.Tensor) else v
        return Problem(**fields)

    def with_fresh_state(self, state, conv_state, output):
        """The same inputs over other (mutable) state, conv_state and output tensors."""
        return dataclasses.replace(self, state=state, conv_state=conv_state, output=output)


def _copy_strided(t, device=None):
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device or t.device)
    out.copy_(t)
    return out


def clone_strided(t):
    """A copy with the same strides (clone() would not keep the padding of a padded view)."""
    return _copy_strided(t)


def _rows(R, n, pad, dtype, device):
    # Row stride n + pad: engines hand over slices of wider buffers.
    base = torch.empty(R, n + pad, dtype=dtype, device=device)
    return base[:, :n]


def make_problem(heads, live_rows, state_dtype, device, seed, *, null_rows=0, oob_rows=0, spare_slots=3,
                 row_pad=0, norm_eps=1e-5, lower_bound=-5.0):
    """Inputs drawn as docs/CONTRACT.md §8 says; live rows get distinct slots in a shuffled
    order, null rows slot 0, out-of-range rows a slot >= S. S = live rows + the null
    slot + spare_slots (R + 4 by default, as kdajit_bench). The output is poisoned (NaN)."""
    H, hidden = heads, heads * D
    qkv = 3 * hidden
    R = live_rows + null_rows + oob_rows
    S = live_rows + 1 + spare_slots  # slot 0 is the null slot
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def randn(*shape, scale=1.0, shift=0.0):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * scale + shift

    def fill_rows(n, pad, dtype, scale=1.0):
        t = _rows(R, n, pad, dtype, device)
        t.copy_(randn(R, n, scale=scale))
        return t

    x = fill_rows(qkv, row_pad, torch.bfloat16)
    raw_gate = fill_rows(hidden, row_pad, torch.bfloat16).unflatten(1, (H, D))
    raw_beta = fill_rows(H, row_pad, torch.bfloat16)
    output_gate = fill_rows(hidden, row_pad, torch.bfloat16).unflatten(1, (H, D))
    output = _rows(R, hidden, row_pad, torch.bfloat16, device).unflatten(1, (H, D))
    output.fill_(float("nan"))

    # SD layout: taps slow, channels contiguous: a [S, 3, qkv] buffer seen as [S, qkv, 3].
    conv_state = torch.empty(S, TAPS, qkv, dtype=torch.bfloat16, device=device).transpose(1, 2)
    conv_state.copy_(randn(S, qkv, TAPS))
    state = (randn(S, H, D, D, scale=0.1)).to(state_dtype)

    slots = torch.randperm(S - 1, generator=gen, device=device)[:live_rows] + 1
    special = [0] * null_rows + [S + 7 + i for i in range(oob_rows)]
    idx = torch.cat([slots, torch.tensor(special, dtype=slots.dtype, device=device)])
    idx = idx[torch.randperm(R, generator=gen, device=device)].to(torch.int32).contiguous()

    return Problem(
        x=x,
        conv_weight=randn(3, W, hidden, scale=0.5),
        conv_state=conv_state,
        raw_gate=raw_gate,
        raw_beta=raw_beta,
        A_log=randn(H, scale=0.5),
        dt_bias=randn(hidden, scale=0.1),
        state_indices=idx,
        state=state,
        output_gate=output_gate,
        norm_weight=randn(D, scale=0.1, shift=1.0),
        output=output,
        lower_bound=lower_bound,
        norm_eps=norm_eps,
    )


def kda_testing():
    """tests/python/kda_testing.py, imported by path: the tests' problems and the
    project's float64 reference (the C++ one, through libkdajit_reference_shim.so,
    whose path $KDAJIT_REFERENCE_LIB holds)."""
    global _kt
    if _kt is None:
        path = os.path.join(TESTS_DIR, "kda_testing.py")
        spec = importlib.util.spec_from_file_location("kda_testing", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _kt = mod
    return _kt


def reference(p):
    """docs/CONTRACT.md §2 in float64 on the CPU with rounding points 1-4: the C++
    reference (kda_testing.reference_call) on host copies of p's tensors.

    Returns (output, state, conv_state) after the call: full tensors, untouched
    slots copied from p, null and out-of-range rows zero."""
    q = p.to("cpu")
    kda_testing().reference_call(
        "single", x=q.x, weight=q.conv_weight, conv_state=q.conv_state, raw_gate=q.raw_gate, raw_beta=q.raw_beta,
        A_log=q.A_log, dt_bias=q.dt_bias, state_indices=q.state_indices, state=q.state, output_gate=q.output_gate,
        norm_weight=q.norm_weight, lower_bound=None if q.gate_softplus else q.lower_bound, norm_eps=q.norm_eps,
        output=q.output)
    return q.output, q.state, q.conv_state


def rel_l2(got, ref):
    """||got - ref|| / ||ref|| in float64; NaN anywhere (e.g. an unwritten poisoned
    output) gives NaN, which fails every `<` tolerance test."""
    g, r = got.double(), ref.double()
    den = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(g - r).item()
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den
