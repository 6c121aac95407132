"""examples/vllm_kda_layer.py on the CPU: its torch path against the float64
reference, its vLLM-shaped kdajit call accepted by the contract (dry run), and its
kdajit path, with the project's C++ reference standing in for the kernel, against
its torch path through the example's own comparison. The GPU run of the example
(`--check`, CTest python_example) compares the real kernels the same way."""
import importlib.util
import os
import unittest

import torch
import kda_testing as kt

import kdajit
from kdajit import _abi, _launch

_spec = importlib.util.spec_from_file_location("vllm_kda_layer",
                                               os.path.join(kt.SOURCE_DIR, "examples", "vllm_kda_layer.py"))
ex = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ex)


def layer_and_batch(heads=4, blocks=12, rows=6, live=4, seed=0, **kw):
    gen = torch.Generator().manual_seed(seed)
    layer = ex.KDADecode(heads, blocks, backend="torch", **kw)
    layer.reset_parameters(gen)
    batch = ex.Batch(rows, heads, "cpu")
    batch.fill(gen, live, blocks)
    return layer, batch


def as_problem(layer, batch):
    """The layer's step as a kda_testing.Problem over its own tensors (views alias them)."""
    H = layer.num_heads
    T = batch.state_indices.shape[0]
    views = {"x": batch.mixed_qkv, "weight": layer.decode_conv_weight, "conv_state": layer.conv_cache.transpose(1, 2),
             "raw_gate": batch.g1[0], "raw_beta": batch.beta[0], "A_log": layer.A_log.detach().view(H),
             "dt_bias": layer.dt_bias.detach(), "state_indices": batch.state_indices, "state": layer.ssm_cache,
             "output_gate": batch.g2, "norm_weight": layer.o_norm_weight.detach(),
             "output": batch.out.view(T, H, kt.D)}
    return kt.Problem("single", dict(views), views, layer.lower_bound, layer.norm_eps)


class TorchPath(unittest.TestCase):
    def test_torch_path_matches_the_reference(self):
        for state_dtype in (torch.float32, torch.bfloat16):
            for lower_bound in (-5.0, None):
                layer, batch = layer_and_batch(state_dtype=state_dtype, lower_bound=lower_bound, seed=11)
                p = as_problem(layer, batch)
                before = kt.snapshot(p)
                with torch.no_grad():
                    out = layer(*batch.args(), out=batch.out)
                self.assertIs(out, batch.out)
                kt.check(self, p, before, out, f"torch path {state_dtype} lower_bound={lower_bound}")

    def test_padding_rows_are_left_alone(self):
        layer, batch = layer_and_batch(rows=8, live=3, seed=12)
        conv0, state0 = layer.conv_cache.clone(), layer.ssm_cache.clone()
        with torch.no_grad():
            out = layer(*batch.args())
        self.assertTrue(bool((out[:, 3:] == 0).all()))
        touched = set(batch.state_indices[:3].tolist())
        for s in range(layer.ssm_cache.shape[0]):
            if s not in touched:
                self.assertTrue(torch.equal(layer.ssm_cache[s], state0[s]), s)
                self.assertTrue(torch.equal(layer.conv_cache[s].view(torch.int16), conv0[s].view(torch.int16)), s)


class KdajitPath(unittest.TestCase):
    def test_the_vllm_shaped_call_maps_to_the_contract_views(self):
        layer, batch = layer_and_batch(heads=3, rows=5, seed=13)
        layer.backend = "kdajit"
        recorded = []

        def record(**kw):
            recorded.append(kdajit.dry_run("fused_kda_decode", **kw))
            return kw["output"]

        real = kdajit.fused_kda_decode
        kdajit.fused_kda_decode = record
        try:
            with torch.no_grad():
                layer(*batch.args(), out=batch.out)
        finally:
            kdajit.fused_kda_decode = real
        a = _abi.DecodeArgs.from_buffer_copy(recorded[0])
        qkv = 3 * 3 * kt.D

        def view(t):
            return list(t.shape)[:t.ndim], list(t.strides)[:t.ndim]

        self.assertEqual(view(a.conv_state), ([12, qkv, 3], [3 * qkv, 1, qkv]))  # SD, from the strides
        self.assertEqual(view(a.x), ([5, qkv], [qkv + 2 * 3 * kt.D, 1]))  # a slice of the wider projection
        self.assertEqual(view(a.output_gate), ([5, 3, kt.D], [qkv + 2 * 3 * kt.D, kt.D, 1]))
        self.assertEqual(view(a.raw_gate), ([5, 3, kt.D], [3 * kt.D, kt.D, 1]))  # [1, T, H, 128]
        self.assertEqual(view(a.raw_beta), ([5, 3], [3, 1]))
        self.assertEqual(view(a.A_log), ([3], [1]))  # [1, 1, H, 1]
        self.assertEqual(a.state_indices_mode, _abi.INDICES_UNIQUE_OR_NULL)

    def test_kdajit_path_with_the_reference_kernel_matches_the_torch_path(self):
        if not os.environ.get(kt.REFERENCE_LIB_ENV):
            self.skipTest(f"{kt.REFERENCE_LIB_ENV} is not set")

        def reference_launch(fn_index, op, args, mapping):
            c = _launch._c or _launch._bind()
            status = c[2](fn_index, args)
            if status:
                raise _launch._fail(status, op, mapping)
            kt.run_reference(fn_index, args)

        launch = _launch._launch
        _launch._launch, _launch._allow_host_tensors = reference_launch, True
        try:
            for state_dtype, lower_bound in ((torch.float32, -5.0), (torch.bfloat16, None)):
                kd, batch = layer_and_batch(rows=6, live=5, seed=14, state_dtype=state_dtype, lower_bound=lower_bound)
                kd.backend = "kdajit"
                ref = ex.copy.deepcopy(kd)
                ref.backend = "torch"
                with torch.no_grad():
                    out_ref = ref(*batch.args())
                    out_kd = kd(*batch.args(), out=batch.out)
                ex.compare(kd, ref, out_kd, out_ref, 5, f"reference kernel, {state_dtype}")
        finally:
            _launch._launch, _launch._allow_host_tensors = launch, False


class Command(unittest.TestCase):
    def test_check_without_cuda_is_skipped(self):
        if torch.cuda.is_available():
            self.skipTest("a CUDA device is present: CTest python_example runs --check")
        self.assertEqual(ex.main(["--check"]), 77)
        self.assertEqual(ex.main(["--bench"]), 77)


if __name__ == "__main__":
    unittest.main()
