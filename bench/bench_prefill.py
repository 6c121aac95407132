"""kdajit's fused prefill and chunk_kda against FLA's chunk_kda, bare and inside an engine, and two floors.

One process, one GPU, per cell (shape x H x state dtype f32 / bf16):

- kdajit: `kdajit.fused_kda_prefill` (this checkout's python/kdajit; the
  library from --lib or KDAJIT_LIBRARY) with the route the selector picks, and
  with --routes also each route forced (rowcta, split2, split4, split8,
  twopass; a route that cannot serve the cell is reported as such). Every
  kdajit call gets a workspace of kdajit.prefill_workspace_bytes (allocated
  once per cell, as an engine would), so the selector may pick twopass. A route is forced by
  a `kdajit.Runtime(route=...)` installed as the process runtime around that
  route's calls (the package reads the process runtime on every call). A cell
  whose call fails reports the error and the run goes on. The route column is
  the selector's key's (kdajit.selected_key: kdajit_selected_prefill_key,
  kdajit_selected_chunk_key); '-' where the package cannot say.
- FLA bare: `chunk_kda` exactly as bench/peers/bench_fla_chunk_kda.py calls it
  (varlen, gate / beta sigmoid / q,k L2 norm in the kernels, fp32 initial
  state, final state returned), on the engine's own post-conv q, k, v. FLA
  keeps fp32 states only: the call is the same for both state dtypes, so a bf16
  cell shows the figure of the f32 cell of its shape and H (marked *).
- kdajit chunk: `kdajit.chunk_kda` (FLA's chunk_kda on kdajit's kernels) with
  FLA bare's arguments, tensor for tensor (q, k, v, raw gate, raw beta, A_log,
  dt_bias, lower_bound, the int32 cu_seqlens and its host copy,
  output_final_state), the initial state in the cell's state dtype (a bf16
  cell's fp32 h0 holds bf16 values: the conversion is exact; FLA gets fp32 in
  both) and max_seq_len the longest prompt (the selector's hint); with
  --routes also each route forced. The apples-to-apples pair of the issue's
  targets: FLA bare / kdajit chunk.
- FLA engine: what an engine runs around chunk_kda for the same op as kdajit's,
  timed as one sequence (class Engine): gather the initial states of the
  batch's slots (index_select, transposed to FLA's [K, V], fp32), the causal
  conv1d + SiLU of every sequence with its conv history (one grouped conv1d
  over the packed tokens with each sequence's 3 history rows put before it),
  the q / k / v split, chunk_kda, the gated RMSNorm in torch ops, and the
  scatter of the final states (transposed, in the pool's dtype) and of each
  sequence's last 3 inputs back to its slots. Index tensors that depend only
  on the batch's lengths are built once per cell, as an engine's metadata
  step does per batch outside the layer.

Timing (all alike, as the peer script): warm-up calls (FLA's first
autotunes), then --iters eager calls (--route-iters for the forced routes),
each after a 256 MiB memset that flushes the L2, timed with CUDA events around
the call; the median. Every cell is measured first; with --routes, the forced
routes of every cell follow in a second pass (on a fresh draw of the cell's
problem), so that a run stopped by a time limit loses forced-route rows before
it loses a cell of the main table.

Floors, from numbers measured in the same run:
- memory: the op's minimum bytes over the copy bandwidth (a 2 GiB
  device-to-device copy, read + write):
  tokens * H * 1538 (x 768, gate 256, beta 2, output gate 256, output 256, bf16)
  + sequences * H * (2 * 128 * 128 * b + 4608)  (the state read and written once,
  b = 4 f32 / 2 bf16; the 3-tap conv history of 384 channels read and written once);
- tensor core: the matrix work of the chunked algorithm over the dense bf16
  rate (the median of 8192^3 torch bf16 matmuls). Per chunk of C = 64 tokens
  and head (D = 128):
    Q K^T 2*C*C*D + K K^T 2*C*C*D + the triangular solve applied to K and V 2*C*C*2D
    + W S^T 2*C*D*D + Q S^T 2*C*D*D + A Delta 2*C*C*D + Delta^T K 2*C*D*D
    = 11 * 2^20 FLOP (11,534,336), over sum(ceil(L / 64)) chunks x H.
The table reports kdajit / max(memory floor, tensor-core floor) and which binds.

Checks. The first shape of each H, both state dtypes: kdajit's output, final
states and conv history against the FLA engine's, from the same pristine
inputs: output relative L2 < 2e-2 (printed with the state's relative L2 and
whether the conv history is bit-identical). Every cell: kdajit.chunk_kda's o
and final state against FLA chunk_kda's on the same inputs (relative L2; both
printed): o < 2e-2, final state < 1e-2 (f32) or 2e-2 (bf16, rounded to bf16 on
the way in and out). Both sides round in their own ways, so the bounds only
catch a wrong mapping or a broken kernel; the tolerances proper are tested in
tests/python/test_gpu_chunk.py.

    python3 bench/bench_prefill.py --fla .peers --lib build-device/runtime/libkdajit.so --routes \\
        --json /tmp/prefill.json

--kdajit-only times kdajit's two ops alone (no FLA package, no FLA columns,
no checks against FLA; kdajit.chunk_kda on the engine's post-conv q, k, v as
above): the A/B of two kdajit libraries, one process each with --lib, each
cell's problem drawn from the same seed.

Exit status: 0 every cell measured and every check passed; 1 a kdajit call
(fused or chunk) failed, a check did not pass (the tables say which) or no FLA
package; 2 bad arguments; 77 no CUDA GPU.
"""
import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, os.pardir))
PACKAGE_ROOT = os.path.join(REPO, "python")  # the kdajit package of this checkout, ahead of any installed copy

_spec = importlib.util.spec_from_file_location("bench_fla_chunk_kda", os.path.join(HERE, "peers",
                                                                                    "bench_fla_chunk_kda.py"))
peer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer)

D = peer.D
CHUNK = 64
BYTES_PER_TOKEN_HEAD = peer.BYTES_PER_TOKEN_HEAD  # 1538
CONV_BYTES_PER_SEQ_HEAD = 2 * 3 * (3 * D) * 2  # 3 taps x 384 channels, bf16, read and written: 4608
STATE_BYTES = {"f32": 4, "bf16": 2}
FLOP_PER_CHUNK_HEAD = (2 * CHUNK * CHUNK * D * 2      # Q K^T, K K^T
                       + 2 * CHUNK * CHUNK * 2 * D    # the triangular solve applied to K and V
                       + 2 * CHUNK * D * D * 2        # W S^T, Q S^T
                       + 2 * CHUNK * CHUNK * D        # A Delta
                       + 2 * CHUNK * D * D)           # Delta^T K (the state update)
ROUTES = ("rowcta", "split2", "split4", "split8", "twopass", "rowcta16", "pipe16")
# Routes the selector never picks: kdajit.keys_for lists no key of theirs, so a
# forced call's first call (a warm-up) compiles it.
FORCED_ONLY = ("rowcta", "split2", "split4", "split8", "rowcta16")
LOWER_BOUND = -5.0
NORM_EPS = 1e-6
CHECK_LIMIT = 2e-2  # output relative L2, kdajit vs the FLA engine
# kdajit.chunk_kda vs FLA chunk_kda, relative L2: o, and the final state per state dtype.
CHUNK_CHECK_LIMITS = {"o": 2e-2, "f32": 1e-2, "bf16": 2e-2}
# The ops timed, by the name the library's route table gives them: the package function of each.
OPS = {"prefill": "fused_kda_prefill", "chunk": "chunk_kda"}
STAGES = ("gather", "conv", "chunk_kda", "norm", "scatter")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# --- Arguments ---------------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fla", help="the folder that holds the built fla/ package (e.g. .peers); required to measure, "
                   "unless --kdajit-only")
    p.add_argument("--kdajit-only", action="store_true",
                   help="time kdajit's fused prefill and chunk_kda alone: no FLA, no FLA columns, no checks")
    p.add_argument("--lib", help="libkdajit.so for the package (sets KDAJIT_LIBRARY; default: the package's search)")
    p.add_argument("--heads", default="16,32,64", help="H values, comma-separated (default 16,32,64)")
    p.add_argument("--shapes", default="8x2048,4x8192,1x16384,mix64",
                   help="NxL (N prompts of L tokens) or mixN (N prompts of 100-2000 tokens, seed 0)")
    p.add_argument("--states", default="f32,bf16", help="state dtypes, comma-separated: f32, bf16 (default both)")
    p.add_argument("--routes", action="store_true",
                   help="also time kdajit (fused_kda_prefill and chunk_kda) with each route forced: "
                   + ", ".join(ROUTES))
    p.add_argument("--iters", type=int, default=20, help="timed calls per measurement (default 20)")
    p.add_argument("--route-iters", type=int, default=10,
                   help="timed calls per forced-route measurement, with --routes (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first; FLA's first autotunes (default 3)")
    p.add_argument("--matmul-n", type=int, default=8192, help="n of the n^3 bf16 matmul of the rate (default 8192)")
    p.add_argument("--json", help="write every number to this file (outside the repository)")
    p.add_argument("--tables", metavar="JSON", help="print the tables of a run's --json file (also a partial one) "
                   "and exit; measures nothing")
    a = p.parse_args(argv)
    if a.tables:
        return a
    if not a.fla and not a.kdajit_only:
        p.error("--fla: expected the folder that holds the built fla/ package (e.g. .peers), or --kdajit-only")
    try:
        a.heads = [int(h) for h in a.heads.split(",")]
    except ValueError:
        p.error(f"--heads: expected comma-separated integers, got {a.heads!r}")
    if any(h < 1 or h > 128 for h in a.heads):
        p.error(f"--heads: expected values in 1..128, got {a.heads}")
    a.shapes = a.shapes.split(",")
    for shape in a.shapes:
        try:
            lengths = peer.lengths_of(shape)
        except ValueError:
            lengths = None
        if not lengths or any(n < 1 for n in lengths):
            p.error(f"--shapes: expected NxL or mixN with N, L >= 1, got {shape!r}")
    a.states = a.states.split(",")
    if not a.states or any(s not in STATE_BYTES for s in a.states) or len(set(a.states)) != len(a.states):
        p.error(f"--states: expected f32, bf16 or both, comma-separated, got {','.join(a.states)!r}")
    if a.iters < 3:
        p.error(f"--iters: expected at least 3, got {a.iters}")
    if a.route_iters < 3:
        p.error(f"--route-iters: expected at least 3, got {a.route_iters}")
    if a.warmup < 1:
        p.error(f"--warmup: expected at least 1 (the first call compiles or autotunes), got {a.warmup}")
    if a.matmul_n < 256:
        p.error(f"--matmul-n: expected at least 256, got {a.matmul_n}")
    if a.json:
        path = os.path.realpath(a.json)
        if path == REPO or path.startswith(REPO + os.sep):
            p.error(f"--json: expected a path outside the repository (raw results stay outside the tree), "
                    f"got {a.json!r}")
    return a


def cells_of(a):
    """The grid in run order: (shape, H, state dtype), shapes outermost."""
    return [(shape, h, state) for shape in a.shapes for h in a.heads for state in a.states]


# --- Floors ------------------------------------------------------------------------------------------------


def memory_floor_bytes(lengths, heads, state):
    """The op's minimum bytes: activations per token and head, state and conv history once per sequence and head."""
    per_seq_head = 2 * D * D * STATE_BYTES[state] + CONV_BYTES_PER_SEQ_HEAD
    return sum(lengths) * heads * BYTES_PER_TOKEN_HEAD + len(lengths) * heads * per_seq_head


def chunk_flops(lengths, heads):
    """The chunked algorithm's matrix FLOPs: FLOP_PER_CHUNK_HEAD per chunk of 64 (partial chunks count whole)."""
    return sum((n + CHUNK - 1) // CHUNK for n in lengths) * heads * FLOP_PER_CHUNK_HEAD


def floors(lengths, heads, state, copy_bw, bf16_rate):
    """Both floors in us and which binds ('memory' or 'tensor core')."""
    mem_bytes = memory_floor_bytes(lengths, heads, state)
    flops = chunk_flops(lengths, heads)
    mem_us = mem_bytes / copy_bw * 1e6
    tc_us = flops / bf16_rate * 1e6
    return {"memory_bytes": mem_bytes, "flops": flops, "memory_us": mem_us, "tensor_core_us": tc_us,
            "floor_us": max(mem_us, tc_us), "binds": "memory" if mem_us >= tc_us else "tensor core"}


def bf16_matmul_rate(torch, n, reps=10):
    """Dense bf16 FLOP/s: the median of reps n^3 torch matmuls (after 3 untimed)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.matmul(a, b, out=c)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    del a, b, c
    return 2 * n ** 3 / statistics.median(times)


# --- The problem -------------------------------------------------------------------------------------------


class Problem:
    """One cell's tensors, named and laid out as fused_kda_prefill takes them
    (docs/CONTRACT.md §1 with R = T rows; conv_state SD), drawn as §8 says.
    Every sequence has initial state and a distinct valid slot, in shuffled
    order, in a pool of N + 4 slots."""

    def __init__(self, torch, lengths, heads, state, device, seed):
        self._torch = torch
        self.lengths = list(lengths)
        self.heads = heads
        self.state_name = state
        T, N, hidden = sum(lengths), len(lengths), heads * D
        qkv = 3 * hidden
        S = N + 4
        self.tokens, self.sequences, self.slots = T, N, S
        gen = torch.Generator(device=device).manual_seed(seed)
        host_gen = torch.Generator().manual_seed(seed)

        def randn(*shape, dtype=torch.float32, scale=1.0, shift=0.0):
            t = torch.randn(*shape, generator=gen, device=device, dtype=dtype)
            return t if scale == 1.0 and shift == 0.0 else t * scale + shift

        bf16 = torch.bfloat16
        self.x = randn(T, qkv, dtype=bf16)
        self.conv_weight = randn(3, 4, hidden, scale=0.5)
        self.conv_state = torch.empty_strided((S, qkv, 3), (3 * qkv, 1, qkv), dtype=bf16, device=device)
        self.conv_state.copy_(randn(S, qkv, 3, dtype=bf16))
        self.raw_gate = randn(T, heads, D, dtype=bf16)
        self.raw_beta = randn(T, heads, dtype=bf16)
        self.A_log = randn(heads, scale=0.5)
        self.dt_bias = randn(hidden, scale=0.1)
        slots = 1 + torch.randperm(S - 1, generator=host_gen)[:N]
        self.state_indices = slots.to(torch.int32).to(device)
        self.state = (randn(S, heads, D, D, scale=0.1)).to(torch.float32 if state == "f32" else bf16)
        self.output_gate = randn(T, heads, D, dtype=bf16)
        self.norm_weight = randn(D, scale=0.1, shift=1.0)
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        self.query_start_loc_cpu = torch.tensor(offsets, dtype=torch.int32)
        self.query_start_loc = self.query_start_loc_cpu.to(device)
        # The pool as drawn, for checks that start from it.
        self.pristine_conv_state = self.conv_state.clone()
        self.pristine_state = self.state.clone()
        # The scratch an engine gives kdajit's calls (route twopass), from attach_workspace.
        self.workspace = None

    def attach_workspace(self, kdajit):
        """A workspace of kdajit.prefill_workspace_bytes for this problem, as an
        engine allocates once per batch shape (none where the package has no
        such function: a library before route twopass)."""
        size_of = getattr(kdajit, "prefill_workspace_bytes", None)
        if size_of is not None:
            nbytes = size_of(self.sequences, self.tokens, self.heads)
            self.workspace = self._torch.empty(nbytes, dtype=self._torch.uint8, device=self.x.device)

    def fresh_pools(self):
        """Copies of the pristine conv_state (same strides) and state."""
        t = self.pristine_conv_state
        conv_state = self._torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        conv_state.copy_(t)
        return conv_state, self.pristine_state.clone()

    def new_output(self):
        return self.x.new_empty(self.tokens, self.heads, D)


def kdajit_arguments(p, conv_state=None, state=None, out=None):
    """fused_kda_prefill's positional arguments and keywords over Problem p."""
    args = (p.x, p.conv_weight, p.conv_state if conv_state is None else conv_state, p.raw_gate, p.raw_beta,
            p.A_log, p.dt_bias, p.state_indices, p.state if state is None else state, p.output_gate,
            p.norm_weight, p.query_start_loc)
    kwargs = {"has_initial_state": None, "gate": "bounded", "lower_bound": LOWER_BOUND, "norm_eps": NORM_EPS,
              "max_seq_len": max(p.lengths), "out": p.new_output() if out is None else out}
    if p.workspace is not None:
        kwargs["workspace"] = p.workspace
    return args, kwargs


def kdajit_chunk_arguments(p, q, k, v, h0):
    """kdajit.chunk_kda's positional arguments and keywords over Problem p and the
    engine's post-conv q, k, v [1, T, H, 128] and fp32 initial states h0 [N, H,
    K, V]: FLA bare's call (peer.varlen_call) argument for argument, with the
    initial state in the pool's dtype (exact for a bf16 pool: h0 was converted
    from it) and max_seq_len the longest prompt (the route selector's hint)."""
    state = h0 if h0.dtype == p.state.dtype else h0.to(p.state.dtype)
    args = (q, k, v, p.raw_gate.unsqueeze(0), p.raw_beta.unsqueeze(0))
    kwargs = {"scale": D ** -0.5, "initial_state": state, "output_final_state": True,
              "use_qk_l2norm_in_kernel": True, "use_gate_in_kernel": True, "A_log": p.A_log, "dt_bias": p.dt_bias,
              "lower_bound": LOWER_BOUND, "safe_gate": True, "use_beta_sigmoid_in_kernel": True,
              "cu_seqlens": p.query_start_loc, "cu_seqlens_cpu": p.query_start_loc_cpu,
              "max_seq_len": max(p.lengths)}
    if p.workspace is not None:
        kwargs["workspace"] = p.workspace
    return args, kwargs


def problem_of(torch, shape, heads, state):
    """The cell's Problem on the GPU, drawn from the cell's seed (the same tensors on every draw)."""
    lengths = peer.lengths_of(shape)
    return Problem(torch, lengths, heads, state, "cuda", seed=sum(lengths) + heads)


# --- The engine around FLA ---------------------------------------------------------------------------------


class Engine:
    """What an engine runs around chunk_kda for the prefill op, in torch ops.

    The conv works on a padded, channel-major copy of the batch ([3*H*128, T +
    3N], the layout conv1d reads): sequence n's 3 history columns (from its
    conv slot) then its tokens, from column qsl[n] + 3n, so one depthwise conv1d
    over the whole buffer gives every token's output (the outputs that would mix
    two sequences are skipped); gathering those back token-major gives q, k and v
    contiguous, as chunk_kda takes them. The last 3 columns of each sequence's
    stretch are its new conv history (for sequences shorter than 3 they include
    old history, as the conv state must)."""

    def __init__(self, torch, chunk_kda, p, norm_eps=NORM_EPS):
        import torch.nn.functional as F

        self.torch, self.F, self.chunk_kda, self.p, self.norm_eps = torch, F, chunk_kda, p, norm_eps
        N, T, H = p.sequences, p.tokens, p.heads
        device = p.x.device
        lengths = torch.tensor(p.lengths, dtype=torch.int64)
        seq_of_token = torch.repeat_interleave(torch.arange(N), lengths)
        token = torch.arange(T)
        pad_start = p.query_start_loc_cpu[:-1].long() + 3 * torch.arange(N)
        three = torch.arange(3)
        self.padded_len = T + 3 * N
        self.token_cols = (token + 3 * (seq_of_token + 1)).to(device)
        self.history_cols = (pad_start[:, None] + three).reshape(-1).to(device)
        self.new_history_cols = (pad_start[:, None] + lengths[:, None] + three).reshape(-1).to(device)
        self.conv_out_cols = (token + 3 * seq_of_token).to(device)  # conv output j covers padded columns j..j+3
        self.slots = p.state_indices.long()
        # The conv weight as the engine keeps it: [3*H*128, 1, 4] in the activations' dtype.
        self.weight = p.conv_weight.permute(0, 2, 1).reshape(3 * H * D, 1, 4).to(p.x.dtype)
        self.marks = None

    def _mark(self, i):
        if self.marks is not None:
            self.marks[i].record()

    def gather_and_conv(self, conv_state, state):
        """Stages gather and conv: (q, k, v [1, T, H, 128] contiguous, h0 [N, H, K, V] fp32, padded x)."""
        torch, F, p = self.torch, self.F, self.p
        N, T, H = p.sequences, p.tokens, p.heads
        hidden, qkv = H * D, 3 * H * D
        self._mark(0)
        history = conv_state.transpose(1, 2).index_select(0, self.slots)  # [N, 3, qkv]
        h0 = torch.empty(N, H, D, D, dtype=torch.float32, device=state.device)
        h0.copy_(state.index_select(0, self.slots).transpose(-1, -2))
        self._mark(1)
        xp = p.x.new_empty(qkv, self.padded_len)
        xp.index_copy_(1, self.token_cols, p.x.t())
        xp.index_copy_(1, self.history_cols, history.reshape(3 * N, qkv).t())
        y = F.conv1d(xp.unsqueeze(0), self.weight, groups=qkv)[0]  # [qkv, T + 3N - 3]
        q, k, v = (F.silu(y[j * hidden:(j + 1) * hidden].t().index_select(0, self.conv_out_cols), inplace=True)
                   .view(1, T, H, D) for j in range(3))
        return q, k, v, h0, xp

    def fla(self, q, k, v, h0):
        p = self.p
        return peer.varlen_call(self.chunk_kda, q, k, v, p.raw_gate.unsqueeze(0), p.raw_beta.unsqueeze(0), h0,
                                p.A_log, p.dt_bias, p.query_start_loc, p.query_start_loc_cpu)

    def __call__(self, conv_state, state, out):
        """The whole op: writes out [T, H, 128] and the slots' state and conv history."""
        torch, p = self.torch, self.p
        q, k, v, h0, xp = self.gather_and_conv(conv_state, state)
        self._mark(2)
        o, ht = self.fla(q, k, v, h0)
        self._mark(3)
        y = o[0].float()
        y.mul_(torch.rsqrt(y.square().mean(-1, keepdim=True).add_(self.norm_eps))).mul_(p.norm_weight)
        out.copy_(y.mul_(p.output_gate.float().sigmoid_()))
        self._mark(4)
        state.index_copy_(0, self.slots, ht.transpose(-1, -2).to(state.dtype))
        conv_state.transpose(1, 2).index_copy_(
            0, self.slots, xp.index_select(1, self.new_history_cols).t().reshape(p.sequences, 3, 3 * p.heads * D))
        self._mark(5)
        return out


def time_stages(torch, engine, out, iters):
    """The engine's stages (STAGES) timed with events between them, each call
    after an L2 flush; the median of each stage in us."""
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    per_stage = {s: [] for s in STAGES}
    for i in range(iters):
        flush.fill_(i & 0xff)
        engine.marks = [torch.cuda.Event(enable_timing=True) for _ in range(len(STAGES) + 1)]
        engine(engine.p.conv_state, engine.p.state, out)
        engine.marks[-1].synchronize()
        for j, s in enumerate(STAGES):
            per_stage[s].append(engine.marks[j].elapsed_time(engine.marks[j + 1]) * 1e3)
    engine.marks = None
    return {s: statistics.median(v) for s, v in per_stage.items()}


# --- kdajit ------------------------------------------------------------------------------------------------


class Kdajit:
    """The kdajit side of the run: module, library path, route forcer, or the error every cell reports."""

    def __init__(self, lib):
        self.module, self.library, self.error = load_kdajit(lib)
        self.forcer = RouteForcer(self.module) if self.error is None else None
        self.prewarm_pending = False  # keys compiling in the background, not waited for yet


def load_kdajit(lib):
    """The repository's kdajit package with its library loaded: (module or None, library path or None,
    error text or None). Never raises: the kdajit side of a cell reports what went wrong."""
    if lib:
        os.environ["KDAJIT_LIBRARY"] = os.path.abspath(lib)
    if PACKAGE_ROOT not in sys.path:
        sys.path.insert(0, PACKAGE_ROOT)
    try:
        import kdajit
    except Exception as e:  # noqa: BLE001 - any failure is the cell's error, not the run's
        return None, None, f"import kdajit: {type(e).__name__}: {e}"
    try:
        path, origin = kdajit.library_path()
        kdajit.runtime()
    except Exception as e:  # noqa: BLE001
        return kdajit, None, f"kdajit library: {type(e).__name__}: {e}"
    if lib and os.path.realpath(path) != os.path.realpath(lib):
        return kdajit, path, f"kdajit loaded {path} ({origin}), not --lib {lib}"
    if not hasattr(kdajit, "fused_kda_prefill"):
        return kdajit, path, f"kdajit.fused_kda_prefill: not in the package at {os.path.dirname(kdajit.__file__)}"
    return kdajit, path, None


class RouteUnavailable(Exception):
    """A route that cannot be forced here (not in the library's route table, or not for this op)."""


class RouteForcer:
    """Installs a kdajit.Runtime(route=...) as the package's process runtime
    inside `with forced(route, op)` (route None: the selector's runtime)."""

    def __init__(self, kdajit):
        self.kdajit = kdajit
        self.runtimes = {}
        try:
            from kdajit import _abi
            table = _abi.routes()  # {route: [ops]}
        except Exception:  # noqa: BLE001 - a package without the table: every route is tried
            table = {}
        served = {op: [r for r, ops in table.items() if op in ops] for op in OPS}
        # The routes to force: the four of the prefill design, then any other route the table gives either op.
        self.routes = list(ROUTES) + [r for r in table if r not in ROUTES and any(r in v for v in served.values())]
        # Why a route cannot be forced, per op: not in the table, or not serving the op (judged only where
        # the table knows the op; elsewhere the call says what is wrong).
        self.unavailable = {op: {} for op in OPS}
        for op in OPS:
            for r in self.routes:
                if table and r not in table:
                    self.unavailable[op][r] = f"route {r} is not in this library's route table ({', '.join(table)})"
                elif served[op] and r not in served[op]:
                    self.unavailable[op][r] = (f"route {r} does not serve the {op} op (route table: "
                                               f"{', '.join(table[r])})")

    @contextlib.contextmanager
    def forced(self, route, op="prefill"):
        if route is None:
            yield
            return
        from kdajit import _runtime as process
        if route in self.unavailable[op]:
            raise RouteUnavailable(self.unavailable[op][route])
        base = self.kdajit.runtime()
        if route not in self.runtimes:
            try:
                self.runtimes[route] = self.kdajit.Runtime(route=route, cache_dir=base.options["cache_dir"])
            except ValueError as e:
                for why in self.unavailable.values():
                    why[route] = error_text(e)
                raise RouteUnavailable(error_text(e)) from e
        saved = process._runtime
        process._runtime = self.runtimes[route]
        try:
            yield
        finally:
            process._runtime = saved


def route_of_key(key):
    for part in (key or "").split("."):
        if part.startswith("route_"):
            return part[len("route_"):]
    return None


def error_text(e):
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]


def synchronize(torch, t):
    """Waits for the GPU when t is a CUDA tensor (the CPU tests run the calls on host tensors)."""
    if t.is_cuda:
        torch.cuda.synchronize()


def selected_key(kdajit, fn, args, kwargs):
    """The kernel key the selector picks for this call, or None when the package cannot say
    (a library without the key queries, or no device to select on)."""
    try:
        return kdajit.selected_key(fn, *args, **kwargs)
    except Exception:  # noqa: BLE001 - the key is information only
        return None


def prewarm_keys(kdajit, heads, states):
    """Every kernel key the grid can call: per op (prefill, chunk), H and state
    dtype, the key of each route that serves it (kdajit.keys_for: the selector
    picks one of these, --routes forces each; FORCED_ONLY's keys are not
    listed). Returns (keys, error texts of the ops whose keys the package
    could not give)."""
    keys, errors = [], []
    for op in OPS:
        try:
            for h in heads:
                for state in states:
                    keys += [k for k in kdajit.keys_for(h, op=op, state_dtype=state) if k not in keys]
        except Exception as e:  # noqa: BLE001 - that op's first calls compile instead
            errors.append(f"{op}: {error_text(e)}")
    return keys, errors


def prewarm_kdajit(kd, heads, states):
    """Starts compiling, in the background (CPU only), the kernels the grid will
    call (prewarm_keys). Returns the number of keys, or an error text."""
    kdajit = kd.module
    try:
        keys, errors = prewarm_keys(kdajit, heads, states)
        for e in errors:
            log(f"kdajit: no pre-warm keys for {e}")
        if not keys:
            return "no kernel keys (kdajit.keys_for serves neither the prefill nor the chunk op)"
        kdajit.runtime().prewarm_async(keys, threads=max(1, (os.cpu_count() or 2) // 2))
        return len(keys)
    except Exception as e:  # noqa: BLE001 - the first calls compile instead
        return error_text(e)


# --- Measuring one cell ------------------------------------------------------------------------------------


def rel_l2(got, ref):
    ref = ref.double()
    den = ref.norm().item()
    return (got.double() - ref).norm().item() / den if den else float("inf")


def measure(torch, call, a, iters=None):
    med, lo, hi, warm_s = peer.time_call(torch, call, a.iters if iters is None else iters, a.warmup)
    return {"us": med, "us_min": lo, "us_max": hi, "warmup_s": warm_s}


def kdajit_function(kd, op):
    """The package function of op ('prefill' or 'chunk'), or None when the package lacks it."""
    return getattr(kd.module, OPS[op], None)


def missing_function(kd, op):
    return f"kdajit.{OPS[op]}: not in the package at {os.path.dirname(kd.module.__file__)}"


def measure_kdajit(torch, kd, op, args, kwargs, a, route=None):
    """kdajit's op ('prefill': fused_kda_prefill, 'chunk': chunk_kda) on these
    arguments, with route forced (None: the selector's, --iters calls; a route:
    --route-iters calls): timing, or the error."""
    if kd.error:
        return {"error": kd.error}
    fn = kdajit_function(kd, op)
    if fn is None:
        return {"error": missing_function(kd, op)}
    try:
        with kd.forcer.forced(route, op):
            key = selected_key(kd.module, fn, args, kwargs)
            r = measure(torch, lambda: fn(*args, **kwargs), a, a.iters if route is None else a.route_iters)
    except RouteUnavailable as e:
        return {"error": str(e), "eligible": False}
    except Exception as e:  # noqa: BLE001 - a failing kdajit cell is reported, the run goes on
        synchronize(torch, args[0])
        return {"error": error_text(e), "eligible": not isinstance(e, NotImplementedError)}
    r["key"] = key
    r["route"] = route or route_of_key(key)
    return r


def check_cell(torch, kd, engine, p):
    """kdajit vs the FLA engine from the same pristine pools: output, slots' states, conv history."""
    if kd.error:
        return {"status": "error", "why": kd.error}
    kdajit = kd.module
    cs_k, st_k = p.fresh_pools()
    cs_e, st_e = p.fresh_pools()
    out_k, out_e = p.new_output(), p.new_output()
    try:
        args, kwargs = kdajit_arguments(p, cs_k, st_k, out_k)
        got = kdajit.fused_kda_prefill(*args, **kwargs)
        got = out_k if got is None else got
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        torch.cuda.synchronize()
        return {"status": "error", "why": error_text(e)}
    engine(cs_e, st_e, out_e)
    slots = engine.slots
    r = {"output_rel_l2": rel_l2(got.reshape(out_e.shape), out_e),
         "state_rel_l2": rel_l2(st_k.index_select(0, slots), st_e.index_select(0, slots)),
         "conv_history_exact": bool(torch.equal(cs_k.index_select(0, slots), cs_e.index_select(0, slots))),
         "output_finite": bool(torch.isfinite(got.float()).all())}
    ok = r["output_rel_l2"] < CHECK_LIMIT and r["output_finite"]
    r["status"] = "ok" if ok else "MISMATCH"
    return r


def check_chunk_cell(torch, kd, engine, p, q, k, v, h0):
    """kdajit.chunk_kda vs FLA chunk_kda (engine.fla, FLA bare's call) on the same
    inputs: o and the final state, relative L2 against CHUNK_CHECK_LIMITS."""
    if kd.error:
        return {"status": "error", "why": kd.error}
    fn = kdajit_function(kd, "chunk")
    if fn is None:
        return {"status": "error", "why": missing_function(kd, "chunk")}
    try:
        args, kwargs = kdajit_chunk_arguments(p, q, k, v, h0)
        o_k, ht_k = fn(*args, **kwargs)
        synchronize(torch, q)
    except Exception as e:  # noqa: BLE001
        synchronize(torch, q)
        return {"status": "error", "why": error_text(e)}
    o_f, ht_f = engine.fla(q, k, v, h0)
    state = p.state_name
    r = {"state": state, "o_rel_l2": rel_l2(o_k.reshape(o_f.shape), o_f), "state_rel_l2": rel_l2(ht_k, ht_f),
         "finite": bool(torch.isfinite(o_k.float()).all() and torch.isfinite(ht_k.float()).all())}
    ok = r["finite"] and r["o_rel_l2"] < CHUNK_CHECK_LIMITS["o"] and r["state_rel_l2"] < CHUNK_CHECK_LIMITS[state]
    r["status"] = "ok" if ok else "MISMATCH"
    return r


# --- Tables ------------------------------------------------------------------------------------------------


def cell_name(c):
    return f"{c['shape']} H{c['heads']} {c['state']}"


def _us(v):
    return "-" if v is None else f"{v:.0f}"


def _ratio(num, den):
    return "-" if num is None or den is None or den <= 0 else f"{num / den:.2f}"


def tables(cells, routes=False):
    """The tables as lines: forced routes of each op (with --routes), engine
    stages, checks, and the main table last with its notes."""
    lines = []
    notes = []  # distinct kdajit errors, numbered in order of appearance

    def note(text):
        if text not in notes:
            notes.append(text)
        return f"[{notes.index(text) + 1}]"

    def kd_us(r):
        return r.get("us") if r and "error" not in r else None

    if routes:
        for title, selector, forced in (("kdajit.fused_kda_prefill", "kdajit", "forced"),
                                        ("kdajit.chunk_kda", "kdajit_chunk", "chunk_forced")):
            names = list(ROUTES) + [r for c in cells for r in c.get(forced, {}) if r not in ROUTES]
            names = list(dict.fromkeys(names))
            lines += [f"{title}, each route forced (us):", "",
                      "| cell | selector | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
            for c in cells:
                kd = c.get(selector, {})
                sel = f"{kd.get('route') or '?'}" if "error" not in kd else "error " + note(kd["error"])
                row = []
                for r in names:
                    f = c.get(forced, {}).get(r)
                    if f is None:
                        row.append("-")
                    elif "error" in f:
                        row.append(("n/a " if not f.get("eligible", True) else "error ") + note(f["error"]))
                    else:
                        row.append(_us(f["us"]))
                lines.append(f"| {cell_name(c)} | {sel} | " + " | ".join(row) + " |")
            lines.append("")
    if any(c.get("engine_stages") for c in cells):
        lines += ["| cell | " + " | ".join(f"{s} us" for s in STAGES) + " |", "|---" * (len(STAGES) + 1) + "|"]
        for c in cells:
            st = c.get("engine_stages")
            if st:
                lines.append(f"| {cell_name(c)} | " + " | ".join(_us(st[s]) for s in STAGES) + " |")
        lines.append("")
    for c in cells:
        ch = c.get("check")
        if ch:
            if "output_rel_l2" in ch:
                lines.append(f"check {cell_name(c)}: {ch['status']}: output rel L2 {ch['output_rel_l2']:.2e} "
                             f"(limit {CHECK_LIMIT:g}), state rel L2 {ch['state_rel_l2']:.2e}, conv history "
                             f"{'bit-identical' if ch['conv_history_exact'] else 'DIFFERS'}")
            else:
                lines.append(f"check {cell_name(c)}: {ch['status']}: {ch['why']}")
    for c in cells:
        ch = c.get("chunk_check")
        if ch:
            if "o_rel_l2" in ch:
                lines.append(f"check chunk {cell_name(c)}: {ch['status']}: kdajit.chunk_kda vs FLA chunk_kda: o rel "
                             f"L2 {ch['o_rel_l2']:.2e} (limit {CHUNK_CHECK_LIMITS['o']:g}), final state "
                             f"({ch['state']}) rel L2 {ch['state_rel_l2']:.2e} (limit "
                             f"{CHUNK_CHECK_LIMITS[ch['state']]:g})" + ("" if ch["finite"] else ", NOT FINITE"))
            else:
                lines.append(f"check chunk {cell_name(c)}: {ch['status']}: {ch['why']}")
    if any(c.get("check") or c.get("chunk_check") for c in cells):
        lines.append("")
    head = ("| cell | kdajit us | route | kdajit chunk us | FLA bare us | FLA engine us | bare / chunk | "
            "bare / kdajit | engine / kdajit | floor us | kdajit / floor | binds |")
    lines += [head, "|---" * 12 + "|"]
    reused = bf16_chunk = False
    for c in cells:
        kd = c.get("kdajit", {})
        k = kd_us(kd)
        ch = c.get("kdajit_chunk")
        chunk = kd_us(ch)
        bare = c.get("fla_bare", {}).get("us")
        eng = c.get("fla_engine", {}).get("us")
        fl = c["floors"]
        kcol = _us(k) if k is not None else "error " + note(kd.get("error", "not measured"))
        ccol = "-" if ch is None else _us(chunk) if chunk is not None else "error " + note(ch["error"])
        if chunk is not None and ch.get("state", c["state"]) == "bf16":
            ccol += "+"
            bf16_chunk = True
        bcol = _us(bare)
        if c.get("fla_bare", {}).get("reused_from"):
            bcol += "*"
            reused = True
        lines.append(f"| {cell_name(c)} | {kcol} | {kd.get('route') or '-'} | {ccol} | {bcol} | {_us(eng)} | "
                     f"{_ratio(bare, chunk)} | {_ratio(bare, k)} | {_ratio(eng, k)} | {_us(fl['floor_us'])} | "
                     f"{_ratio(k, fl['floor_us'])} | {fl['binds']} |")
    if reused:
        lines.append("* the figure of the other state dtype's cell of that shape and H: FLA keeps fp32 states, so "
                     "its bare call is the same for an f32 and a bf16 pool (the engine column converts a bf16 pool).")
    if bf16_chunk:
        lines.append("+ kdajit.chunk_kda with the cell's bf16 states (initial_state bf16, final state bf16) on "
                     "FLA bare's other inputs; FLA bare takes and returns fp32 states in every cell.")
    for i, text in enumerate(notes):
        lines.append(f"[{i + 1}] {text}")
    return lines


# --- Main --------------------------------------------------------------------------------------------------


def write_json(path, doc):
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)


def run_cell(torch, a, kd, chunk_kda, shape, h, state, copy_bw, rate, bare_of, doc):
    """Measures one cell into doc["cells"] (no forced routes: run_forced does those);
    True when its kdajit side failed or a check did not pass."""
    lengths = peer.lengths_of(shape)
    t_cell = time.time()
    failed = False
    p = problem_of(torch, shape, h, state)
    if not kd.error:
        p.attach_workspace(kd.module)
    c = {"shape": shape, "heads": h, "state": state, "sequences": len(lengths), "tokens": sum(lengths),
         "max_seq_len": max(lengths), "floors": floors(lengths, h, state, copy_bw, rate)}
    doc["cells"].append(c)
    engine = Engine(torch, chunk_kda, p)
    out = p.new_output()
    if not a.kdajit_only:
        log(f"{shape} H{h} {state}: FLA engine")
        # FLA's first call (it autotunes for each new H) while kdajit compiles in the background; nothing is
        # timed until that compile is done, so that no timed eager call competes with it for the CPU.
        engine(p.conv_state, p.state, out)
        torch.cuda.synchronize()
    if kd.prewarm_pending:
        kd.prewarm_pending = False
        try:
            kd.module.runtime().wait_prewarm()
        except Exception as e:  # noqa: BLE001 - the first calls compile what the pre-warm did not
            log(f"kdajit: pre-warm: {error_text(e)}")
    if not a.kdajit_only:
        c["fla_engine"] = measure(torch, lambda: engine(p.conv_state, p.state, out), a)
        c["engine_stages"] = time_stages(torch, engine, out, min(a.iters, 10))
    failed |= bare_and_chunk(torch, a, kd, engine, c, bare_of)
    if shape == a.shapes[0] and not a.kdajit_only:  # the first cell of each H, for each state dtype
        c["check"] = check_cell(torch, kd, engine, p)
        failed |= c["check"]["status"] in ("error", "MISMATCH")
        log(f"  check: {c['check']}")
    log(f"{shape} H{h} {state}: kdajit")
    args, kwargs = kdajit_arguments(p)
    c["kdajit"] = measure_kdajit(torch, kd, "prefill", args, kwargs, a)
    failed |= "error" in c["kdajit"]
    c["seconds"] = time.time() - t_cell
    return failed


def bare_and_chunk(torch, a, kd, engine, c, bare_of):
    """FLA bare (or its twin's figure), the chunk check and kdajit chunk of cell c,
    on the same post-conv q, k, v and initial states (freed on return); with
    --kdajit-only kdajit chunk alone. True when the kdajit chunk call failed or
    its check did not pass."""
    p, key = engine.p, (c["shape"], c["heads"])
    q, k, v, h0, _ = engine.gather_and_conv(p.conv_state, p.state)
    failed = False
    if not a.kdajit_only:
        if key in bare_of:
            c["fla_bare"] = dict(bare_of[key], reused_from=bare_of[key]["state"])
        else:
            c["fla_bare"] = dict(measure(torch, lambda: engine.fla(q, k, v, h0), a), state=c["state"])
            bare_of[key] = c["fla_bare"]
        c["chunk_check"] = check_chunk_cell(torch, kd, engine, p, q, k, v, h0)
        log(f"  check chunk: {c['chunk_check']}")
        failed = c["chunk_check"]["status"] in ("error", "MISMATCH")
    log(f"{cell_name(c)}: kdajit chunk")
    args, kwargs = kdajit_chunk_arguments(p, q, k, v, h0)
    c["kdajit_chunk"] = dict(measure_kdajit(torch, kd, "chunk", args, kwargs, a), state=c["state"])
    return failed or "error" in c["kdajit_chunk"]


def forced_chunk(torch, a, kd, chunk_kda, p):
    """kdajit chunk with each route forced, on p's post-conv q, k, v (freed on return)."""
    q, k, v, h0, _ = Engine(torch, chunk_kda, p).gather_and_conv(p.conv_state, p.state)
    args, kwargs = kdajit_chunk_arguments(p, q, k, v, h0)
    return {r: measure_kdajit(torch, kd, "chunk", args, kwargs, a, r) for r in kd.forcer.routes}


def run_forced(torch, a, kd, chunk_kda, c):
    """Times each route forced for cell c (already measured by run_cell), for the
    fused op and the chunk op whose selector call succeeded, on a fresh draw of
    the cell's problem; True when an eligible route failed."""
    t_cell = time.time()
    p = problem_of(torch, c["shape"], c["heads"], c["state"])
    if not kd.error:
        p.attach_workspace(kd.module)
    failed = False
    if "error" not in c.get("kdajit_chunk", {"error": ""}):
        log(f"{cell_name(c)}: kdajit chunk, forced routes")
        c["chunk_forced"] = forced_chunk(torch, a, kd, chunk_kda, p)
        failed |= any(f.get("eligible") and "error" in f for f in c["chunk_forced"].values())
    if "error" not in c.get("kdajit", {"error": ""}):
        log(f"{cell_name(c)}: kdajit, forced routes")
        args, kwargs = kdajit_arguments(p)
        c["forced"] = {r: measure_kdajit(torch, kd, "prefill", args, kwargs, a, r) for r in kd.forcer.routes}
        failed |= any(f.get("eligible") and "error" in f for f in c["forced"].values())
    c["forced_seconds"] = time.time() - t_cell
    return failed


def print_tables(doc):
    st = doc["settings"]
    forced = f" ({st['route_iters']} per forced route)" if st["routes"] and "route_iters" in st else ""
    who = ("kdajit prefill alone (--kdajit-only)" if st.get("kdajit_only")
           else f"kdajit prefill vs FLA chunk_kda @ {doc['versions']['fla_commit'][:12]}")
    print(f"# {who} on {doc['gpu']}: copy bandwidth "
          f"{doc['copy_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s, dense bf16 {doc['bf16_matmul_flop_per_s'] / 1e12:.0f} "
          f"TFLOP/s ({doc['matmul_n']}^3 matmul); median of {st['iters']} calls{forced}, L2 flushed; "
          f"status {doc['status']}")
    if doc.get("stopped"):
        print(f"# stopped at {doc['stopped']}")
    print("\n".join(tables(doc["cells"], routes=bool(st["routes"]))), flush=True)


def main(argv=None):
    a = parse_args(argv)
    if a.tables:
        with open(a.tables) as f:
            print_tables(json.load(f))
        return 0
    import torch
    if not torch.cuda.is_available():
        print("bench_prefill: no CUDA GPU; skipped")
        return 77
    t_start = time.time()
    chunk_kda, commit = (None, "-") if a.kdajit_only else peer.load_fla(a.fla)
    kd = Kdajit(a.lib)
    if kd.error:
        log(f"kdajit: {kd.error} (every kdajit cell reports it)")
    routes = (kd.forcer.routes if kd.forcer else list(ROUTES)) if a.routes else []
    if kd.error is None:
        pre = prewarm_kdajit(kd, a.heads, a.states)
        kd.prewarm_pending = isinstance(pre, int)
        log(f"kdajit: pre-warming {pre} kernel keys in the background" if isinstance(pre, int)
            else f"kdajit: no pre-warm ({pre}); the first calls compile")
    copy_bw = peer.copy_bandwidth(torch)
    rate = bf16_matmul_rate(torch, a.matmul_n)
    gpu = torch.cuda.get_device_name()
    log(f"# {gpu}: copy bandwidth {copy_bw / 1e9:.0f} GB/s, dense bf16 {rate / 1e12:.0f} TFLOP/s; "
        f"FLA chunk_kda @ {commit[:12]}; kdajit {kd.library or '-'}")
    doc = {"schema": "kdajit-bench-prefill/1", "status": "running", "gpu": gpu,
           "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                        "torch_cuda": torch.version.cuda, "fla_commit": commit},
           "kdajit_library": kd.library, "kdajit_error": kd.error,
           "copy_bandwidth_bytes_per_s": copy_bw, "bf16_matmul_flop_per_s": rate, "matmul_n": a.matmul_n,
           "settings": {"iters": a.iters, "route_iters": a.route_iters, "warmup": a.warmup, "heads": a.heads,
                        "kdajit_only": a.kdajit_only,
                        "shapes": a.shapes, "states": a.states, "routes": list(routes), "lower_bound": LOWER_BOUND,
                        "norm_eps": NORM_EPS, "check_limit": CHECK_LIMIT, "chunk_check_limits": CHUNK_CHECK_LIMITS},
           "flop_per_chunk_head": FLOP_PER_CHUNK_HEAD, "cells": []}
    bare_of = {}
    failed = False
    for shape, h, state in cells_of(a):
        try:
            failed |= run_cell(torch, a, kd, chunk_kda, shape, h, state, copy_bw, rate, bare_of, doc)
        except Exception as e:  # noqa: BLE001 - e.g. a lost CUDA context: keep what was measured
            log(f"{shape} H{h} {state}: stopped: {error_text(e)}")
            doc["stopped"] = f"{shape} H{h} {state}: {error_text(e)}"
            failed = True
            break
        write_json(a.json, doc)
        torch.cuda.empty_cache()
    # The forced routes, after every cell's main figures: a run stopped by a time limit loses these first.
    if routes and kd.error is None and not doc.get("stopped"):
        for c in doc["cells"]:
            try:
                failed |= run_forced(torch, a, kd, chunk_kda, c)
            except Exception as e:  # noqa: BLE001
                log(f"{cell_name(c)}: forced routes: stopped: {error_text(e)}")
                doc["stopped"] = f"{cell_name(c)} (forced routes): {error_text(e)}"
                failed = True
                break
            write_json(a.json, doc)
            torch.cuda.empty_cache()
    doc["status"] = "failed" if failed else "ok"
    doc["total_seconds"] = time.time() - t_start
    write_json(a.json, doc)
    print_tables(doc)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
