"""The torch custom ops (torch >= 2.4: torch.library.custom_op) on the CPU:
the schema marks conv_state, state and output as mutated, the fake
implementations shape fake tensors, make_fx and torch.compile (dynamo) put the
op into the graph, and the compiled call reaches the real implementation.
Debian's torch 1.13 has no custom_op: there only the plain-function fallback is
checked (the rest reports skipped; the H200's torch runs it)."""
import unittest

import torch
import kda_testing as kt

import kdajit
from kdajit import _ops, _launch

CUSTOM_OP = hasattr(torch, "library") and hasattr(torch.library, "custom_op")
NEEDS = "torch.library.custom_op needs torch >= 2.4; this is " + torch.__version__


def tensors(op="single"):
    p = kt.make_problem(op, 2, 3) if op == "single" else kt.make_problem("packed", 2, tokens=2, seqs=2)
    return p


class Fallback(unittest.TestCase):
    def test_custom_ops_exactly_where_torch_has_them(self):
        self.assertEqual(kdajit.HAS_CUSTOM_OPS, CUSTOM_OP)
        self.assertEqual(_ops._fused_op is not None, CUSTOM_OP)
        if not CUSTOM_OP:
            # Plain functions: an eager call goes straight to the ctypes path.
            calls = []
            launch = _launch._launch
            _launch._launch = lambda *a: calls.append(a[1])
            try:
                tensors().call(kdajit)
                tensors("packed").call(kdajit)
            finally:
                _launch._launch = launch
            self.assertEqual(calls, ["fused_kda_decode", "packed_fused_kda_decode"])


@unittest.skipUnless(CUSTOM_OP, NEEDS)
class CustomOps(unittest.TestCase):
    def test_schema_mutates_exactly_conv_state_state_and_output(self):
        for name in ("fused_kda_decode", "packed_fused_kda_decode"):
            schema = torch.ops.kdajit.__getattr__(name).default._schema
            mutated = sorted(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
            self.assertEqual(mutated, ["conv_state", "output", "state"], str(schema))
            self.assertEqual(len(schema.returns), 0, str(schema))

    def test_prefill_schema_mutates_conv_state_state_output_and_the_counter(self):
        schema = torch.ops.kdajit.fused_kda_prefill.default._schema
        mutated = sorted(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
        self.assertEqual(mutated, ["conv_state", "oob_counter", "output", "state", "workspace"], str(schema))
        self.assertEqual(len(schema.returns), 0, str(schema))

    def test_eager_calls_bypass_the_dispatcher(self):
        calls = []
        launch = _launch._launch
        _launch._launch = lambda *a: calls.append(a[1])
        real = _ops._fused_op
        _ops._fused_op = _Forbidden(real)
        try:
            tensors().call(kdajit)
        finally:
            _launch._launch = launch
            _ops._fused_op = real
        self.assertEqual(calls, ["fused_kda_decode"])

    def test_fake_tensors_go_through_the_fake_implementation(self):
        from torch._subclasses.fake_tensor import FakeTensorMode

        p = tensors()
        launch = _launch._launch
        _launch._launch = _forbidden_launch
        try:
            with FakeTensorMode(allow_non_fake_inputs=False) as mode:
                fake = {k: (mode.from_tensor(v) if isinstance(v, torch.Tensor) else v) for k, v in p.kwargs().items()}
                fake["output"] = None
                out = kdajit.fused_kda_decode(**fake)
                self.assertEqual(tuple(out.shape), (1, 3, 2, 128))
                self.assertEqual(out.dtype, torch.bfloat16)
            q = tensors("packed")
            with FakeTensorMode() as mode:
                fake = {k: (mode.from_tensor(v) if isinstance(v, torch.Tensor) else v) for k, v in q.kwargs().items()}
                out = kdajit.packed_fused_kda_decode(**fake)
                self.assertEqual(tuple(out.shape), tuple(q.args["output"].shape))
        finally:
            _launch._launch = launch

    def test_make_fx_records_the_op(self):
        from torch.fx.experimental.proxy_tensor import make_fx

        p = tensors()
        kw = p.kwargs()
        names = [k for k, v in kw.items() if isinstance(v, torch.Tensor)]

        def fn(*ts):
            args = dict(kw)
            args.update(zip(names, ts))
            return kdajit.fused_kda_decode(**args)

        gm = make_fx(fn, tracing_mode="fake")(*[kw[n] for n in names])
        targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        self.assertTrue(any("kdajit.fused_kda_decode" in t for t in targets), targets)

    def test_torch_compile_puts_the_op_in_one_graph_and_runs_it(self):
        import torch._dynamo

        torch._dynamo.reset()
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        p = tensors()
        kw = p.kwargs(lower_bound=0.0)  # invalid: the C library rejects it when the compiled graph runs

        def fn(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices, state, output_gate,
               norm_weight, output):
            return kdajit.fused_kda_decode(x, weight, conv_state, raw_gate, raw_beta, A_log, dt_bias, state_indices,
                                           state, output_gate, norm_weight, 0.0, 1e-5, output)

        compiled = torch.compile(fn, backend=backend, fullgraph=True)
        _launch._allow_host_tensors = True
        try:
            with self.assertRaises(ValueError) as cm:
                compiled(*[kw[k] for k in ("x", "weight", "conv_state", "raw_gate", "raw_beta", "A_log", "dt_bias",
                                           "state_indices", "state", "output_gate", "norm_weight", "output")])
        finally:
            _launch._allow_host_tensors = False
        self.assertTrue(str(cm.exception).startswith("lower_bound: expected a finite value < 0"), str(cm.exception))
        self.assertEqual(len(graphs), 1)
        text = str(graphs[0].graph)
        self.assertIn("kdajit", text)


class _Forbidden:
    """Stands in for a custom op that must not be called."""

    def __init__(self, real):
        self.real = real

    def __call__(self, *args, **kwargs):
        raise AssertionError("an eager call went through the torch dispatcher")


def _forbidden_launch(*args):
    raise AssertionError("a fake-tensor call reached the C library")


if __name__ == "__main__":
    unittest.main()
