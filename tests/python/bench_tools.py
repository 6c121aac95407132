"""The scripts under bench/ as modules, for their tests (no GPU needed)."""
import contextlib
import importlib.util
import io
import os

BENCH = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))


def load(name):
    """bench/<name>.py, imported as the module `name`."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_main(tool, args):
    """tool.main(args) with stdout and stderr captured: (its return value, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = tool.main(list(args))
    return rc, out.getvalue(), err.getvalue()


# The two cells the tests of the selector tools (reselect.py, tune_vs_selector.py)
# are built on, as key name formats of their route.
SINGLE = "kda_single.h8.state_f32.conv_sd.t1.gate_bounded.route_{}.sm_90"
PACKED = "kda_packed.h64.state_bf16.conv_sd.t4.gate_bounded.route_{}.sm_90"


def check_band_cells(tc):
    """Asserts in test case tc the built-in routes those tests expect on 132 SMs:
    split4 for single f32 H = 8, R = 1 (8 CTAs x 8 <= 132), rowcta for packed
    bf16 H = 64, N = 2, T = 4 (128 sequence-heads)."""
    import kdajit  # here: the other bench tools' tests do not load the library

    tc.assertIn("route_split4", kdajit.key_for(8, rows=1, arch="sm_90", sm_count=132))
    tc.assertIn("route_rowcta", kdajit.key_for(64, rows=2, op="packed", tokens=4, state_dtype="bf16",
                                               arch="sm_90", sm_count=132))
