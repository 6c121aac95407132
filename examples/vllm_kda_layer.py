#!/usr/bin/env python3
"""A KDA decode layer shaped like vLLM's decode step of Kimi Delta Attention,
switching between kdajit and a pure-torch path.

    python3 examples/vllm_kda_layer.py --check   # kdajit against the torch path, eager and in a CUDA graph
    python3 examples/vllm_kda_layer.py --bench   # time one decode step of each

What it mirrors (vLLM's KimiDeltaAttention at decode time):
- per layer, a conv state pool [num_blocks, W-1, 3*H*128] bf16 (state length before
  channels) that the conv kernels see transposed, [num_blocks, 3*H*128, W-1] with
  strides (block, 1, 3*H*128): kdajit's SD layout, read from the strides;
- a recurrent state pool [num_blocks, H, 128, 128] (f32 or bf16), element [s, h, v, k];
- block 0 is the null block: CUDA-graph padding rows point at it and are left alone;
- the q/k/v projections before the conv [T, 3*H*128], the gate g1 [1, T, H, 128],
  beta [1, T, H], the output gate g2 [T, H, 128], A_log [1, 1, H, 1], dt_bias [H*128];
- the decode conv weight [3, 4, H*128], prepared once from conv1d's [3*H*128, 1, 4].

kdajit takes FlashInfer's argument names and order, so the call below is the one
an engine makes to FlashInfer's fused_kda_decode with only the import changed.
--check exits 77 when there is no CUDA device (CTest reports it as skipped).
"""
import argparse
import copy
import sys
import time

import torch
import torch.nn.functional as F

D = 128  # head dim
W = 4  # conv width


def torch_fused_kda_decode(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state,
                           output_gate, norm_weight, lower_bound=-5.0, norm_eps=1e-5, output=None):
    """The same step in plain torch (f32 math, the kernel's four bf16 rounding
    points): the fallback path, and the yardstick of --check."""
    T = x.shape[-2]
    H = A_log.numel()
    hidden = H * D
    S = state.shape[0]
    si = state_indices.reshape(T).long()
    live = (si > 0) & (si < S)  # null (<= 0) and out-of-range rows: zeros, no writes
    slot = torch.where(live, si, torch.zeros_like(si))
    x = x.reshape(T, 3 * hidden)

    hist = conv_state[slot].float()  # [T, qkv, W-1], oldest tap first
    taps = weight.float().permute(0, 2, 1).reshape(3 * hidden, W)  # channel j*hidden + i: weight[j, :, i]
    a = (hist * taps[:, :W - 1]).sum(-1) + taps[:, W - 1] * x.float()
    m = (a * torch.sigmoid(a)).to(torch.bfloat16).float()  # rounding point 1
    q, k, v = m.view(T, 3, H, D).unbind(1)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * D ** -0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)

    g = raw_gate.reshape(T, H, D).float() + dt_bias.reshape(H, D).float()
    A = torch.exp(A_log.reshape(H).float())[:, None]
    gv = -A * F.softplus(g) if lower_bound is None else lower_bound * torch.sigmoid(A * g)
    beta = torch.sigmoid(raw_beta.reshape(T, H).float())

    s = state[slot].float() * torch.exp(gv)[:, :, None, :]  # [T, H, V, K]
    u = torch.einsum("thvk,thk->thv", s, k)
    s = s + (beta[..., None] * (v - u))[..., None] * k[:, :, None, :]
    o = torch.einsum("thvk,thk->thv", s, q).to(torch.bfloat16).float()  # rounding point 3
    y = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + norm_eps) * norm_weight.float() * \
        torch.sigmoid(output_gate.reshape(T, H, D).float())
    y = torch.where(live[:, None, None], y, torch.zeros_like(y))

    rows = si[live]
    state[rows] = s[live].to(state.dtype)  # rounding point 2
    conv_state[rows] = torch.cat([hist[:, :, 1:], x.float()[:, :, None]], dim=-1)[live].to(conv_state.dtype)
    if output is None:
        output = torch.empty(1, T, H, D, dtype=torch.bfloat16, device=x.device)
    output.copy_(y.to(torch.bfloat16).reshape(output.shape))  # rounding point 4
    return output


class KDADecode(torch.nn.Module):
    """One KDA layer's decode step with its cache pools. backend: 'kdajit' or 'torch'."""

    def __init__(self, num_heads, num_blocks, *, state_dtype=torch.float32, lower_bound=-5.0, norm_eps=1e-5,
                 backend="kdajit", device=None):
        super().__init__()
        H, hidden = num_heads, num_heads * D
        qkv = 3 * hidden
        self.num_heads, self.lower_bound, self.norm_eps, self.backend = H, lower_bound, norm_eps, backend
        kw = dict(device=device)
        self.conv1d_weight = torch.nn.Parameter(torch.empty(qkv, 1, W, **kw), requires_grad=False)
        self.A_log = torch.nn.Parameter(torch.empty(1, 1, H, 1, **kw), requires_grad=False)
        self.dt_bias = torch.nn.Parameter(torch.empty(hidden, **kw), requires_grad=False)
        self.o_norm_weight = torch.nn.Parameter(torch.empty(D, **kw), requires_grad=False)
        self.register_buffer("decode_conv_weight", torch.empty(3, W, hidden, **kw))
        self.register_buffer("conv_cache", torch.zeros(num_blocks, W - 1, qkv, dtype=torch.bfloat16, **kw))
        self.register_buffer("ssm_cache", torch.zeros(num_blocks, H, D, D, dtype=state_dtype, **kw))

    def reset_parameters(self, generator):
        """Weights and caches drawn as the KDA decode spec's tests draw them."""
        def randn(t, scale=1.0, shift=0.0):
            src = torch.randn(t.shape, generator=generator) * scale + shift
            t.copy_(src.to(t.dtype))

        randn(self.conv1d_weight, 0.5)
        randn(self.A_log, 0.5)
        randn(self.dt_bias, 0.1)
        randn(self.o_norm_weight, 0.1, 1.0)
        randn(self.conv_cache)
        randn(self.ssm_cache, 0.1)
        self.prepare()

    def prepare(self):
        """The decode conv weight [3, 4, H*128] from conv1d's [3*H*128, 1, 4] (once, after loading)."""
        w = self.conv1d_weight.detach().view(3, self.num_heads * D, W)
        self.decode_conv_weight.copy_(w.transpose(1, 2))

    def forward(self, mixed_qkv, g1, beta, g2, state_indices, out=None):
        """mixed_qkv [T, 3*H*128] bf16 (before the conv), g1 [1, T, H, 128], beta [1, T, H],
        g2 [T, H, 128] bf16, state_indices [T] int32 (0: a padding row). Returns [1, T, H, 128]."""
        conv_state = self.conv_cache.transpose(-1, -2)  # [blocks, 3*H*128, W-1]: what the conv kernels take
        if self.backend == "kdajit":
            import kdajit

            decode = kdajit.fused_kda_decode
        else:
            decode = torch_fused_kda_decode
        return decode(x=mixed_qkv, weight=self.decode_conv_weight, conv_state=conv_state, raw_gate=g1,
                      raw_beta=beta, A_log=self.A_log, dt_bias=self.dt_bias, state_indices=state_indices,
                      state=self.ssm_cache, output_gate=g2, norm_weight=self.o_norm_weight,
                      lower_bound=self.lower_bound, norm_eps=self.norm_eps, output=out)


class Batch:
    """Static input buffers of one padded decode batch (what a CUDA graph replays)."""

    def __init__(self, rows, heads, device):
        hidden = heads * D
        bf16 = dict(dtype=torch.bfloat16, device=device)
        self.in_proj = torch.zeros(rows, 3 * hidden + 2 * hidden, **bf16)  # one projection, sliced (strided views)
        self.mixed_qkv = self.in_proj[:, :3 * hidden]
        self.g1 = torch.zeros(1, rows, heads, D, **bf16)
        self.beta = torch.zeros(1, rows, heads, **bf16)
        self.g2 = self.in_proj[:, 3 * hidden:4 * hidden].view(rows, heads, D)
        self.state_indices = torch.zeros(rows, dtype=torch.int32, device=device)
        self.out = torch.zeros(1, rows, heads, D, **bf16)

    def fill(self, generator, live, num_blocks):
        """New inputs; the first `live` rows get distinct blocks in 1..num_blocks-1, the rest are padding (0)."""
        rows = self.state_indices.shape[0]
        for t in (self.in_proj, self.g1, self.beta):
            t.copy_(torch.randn(t.shape, generator=generator).to(t.dtype))
        slots = torch.zeros(rows, dtype=torch.int32)
        slots[:live] = (torch.randperm(num_blocks - 1, generator=generator)[:live] + 1).to(torch.int32)
        self.state_indices.copy_(slots)

    def args(self):
        return self.mixed_qkv, self.g1, self.beta, self.g2, self.state_indices


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def compare(kd, ref, out_kd, out_ref, live, what):
    """kdajit's step against the torch path's on the same inputs and caches (spec tolerances)."""
    problems = []
    err = rel_l2(out_kd[:, :live], out_ref[:, :live])
    if not err <= 1e-2:
        problems.append(f"output relative L2 {err:.3g} > 1e-2")
    if not torch.allclose(out_kd.float(), out_ref.float(), rtol=3e-2, atol=2e-2):
        problems.append("output outside rtol 3e-2 / atol 2e-2")
    if bool((out_kd[:, live:] != 0).any()):
        problems.append("a padding row's output is not zero")
    if not torch.equal(kd.conv_cache.view(torch.int16), ref.conv_cache.view(torch.int16)):
        problems.append("conv cache differs")
    tol = 1e-3 if kd.ssm_cache.dtype == torch.float32 else 6e-3
    err = rel_l2(kd.ssm_cache, ref.ssm_cache)
    if not err <= tol:
        problems.append(f"recurrent state relative L2 {err:.3g} > {tol}")
    if problems:
        raise SystemExit(f"vllm_kda_layer: {what}: " + "; ".join(problems))
    print(f"  {what}: ok (output rel L2 {rel_l2(out_kd[:, :live], out_ref[:, :live]):.2e})")


def check(args):
    if not torch.cuda.is_available():
        print("SKIPPED: --check needs a CUDA device")
        return 77
    dev = "cuda"
    gen = torch.Generator().manual_seed(args.seed)
    checks = 0
    for state_dtype in (torch.float32, torch.bfloat16):
        for lower_bound in (-5.0, None):
            kd = KDADecode(args.heads, args.blocks, state_dtype=state_dtype, lower_bound=lower_bound,
                           backend="kdajit").to(dev)
            kd.reset_parameters(gen)
            ref = copy.deepcopy(kd)
            ref.backend = "torch"
            name = f"H={args.heads} state {str(state_dtype).split('.')[-1]} " + \
                   ("bounded" if lower_bound is not None else "softplus")
            batch = Batch(args.graph_rows, args.heads, dev)
            # Eager steps with different live row counts (the rest padding rows on block 0).
            for step, live in enumerate((1, args.graph_rows // 2, args.graph_rows)):
                batch.fill(gen, live, args.blocks)
                ref.load_state_dict(kd.state_dict())  # the same caches before the step
                out_ref = ref(*batch.args())
                out_kd = kd(*batch.args())
                torch.cuda.synchronize()
                compare(kd, ref, out_kd, out_ref, live, f"{name} eager step {step} ({live} live rows)")
                checks += 1
            # A CUDA graph of the kdajit step over the static buffers, replayed with new batches.
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                kd(*batch.args(), out=batch.out)
            for step, live in enumerate((args.graph_rows, 3, args.graph_rows - 1)):
                batch.fill(gen, live, args.blocks)
                ref.load_state_dict(kd.state_dict())
                graph.replay()
                out_ref = ref(*batch.args())
                torch.cuda.synchronize()
                compare(kd, ref, batch.out, out_ref, live, f"{name} graph replay {step} ({live} live rows)")
                checks += 1
    print(f"vllm_kda_layer: {checks} passed, 0 failed")
    return 0


def bench(args):
    if not torch.cuda.is_available():
        print("SKIPPED: --bench needs a CUDA device")
        return 77
    dev = "cuda"
    gen = torch.Generator().manual_seed(args.seed)
    print(f"one decode step, H={args.heads}, {args.graph_rows} rows, {args.blocks} blocks (median of {args.iters})")
    for backend in ("kdajit", "torch"):
        layer = KDADecode(args.heads, args.blocks, backend=backend).to(dev)
        layer.reset_parameters(gen)
        batch = Batch(args.graph_rows, args.heads, dev)
        batch.fill(gen, args.graph_rows, args.blocks)
        layer(*batch.args(), out=batch.out)
        torch.cuda.synchronize()
        host = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            layer(*batch.args(), out=batch.out)
            host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        # The pure-torch path indexes with a data-dependent mask (a host sync), so it
        # cannot be captured: its device time is the eager step, synchronised.
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        step = lambda: layer(*batch.args(), out=batch.out)  # noqa: E731
        how = "eager step"
        if backend == "kdajit":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            step, how = graph.replay, "graph replay"
        device = []
        for _ in range(args.iters):
            start.record()
            step()
            end.record()
            end.synchronize()
            device.append(start.elapsed_time(end) * 1e3)
        host.sort()
        device.sort()
        print(f"  {backend:7s} eager host {host[len(host) // 2] * 1e6:8.1f} us   {how} "
              f"{device[len(device) // 2]:8.1f} us")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare kdajit with the torch path (exit 77 without CUDA)")
    ap.add_argument("--bench", action="store_true", help="time one decode step of each backend")
    ap.add_argument("--heads", type=int, default=32, help="heads per rank (64 heads over TP 2)")
    ap.add_argument("--blocks", type=int, default=64, help="cache blocks per pool, block 0 the null block")
    ap.add_argument("--graph-rows", type=int, default=16, help="the padded batch size of the CUDA graph")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args(argv)
    if args.graph_rows < 4 or args.blocks <= args.graph_rows:
        ap.error("expected --graph-rows >= 4 and --blocks > --graph-rows")
    if args.bench:
        return bench(args)
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
