"""Which device a call runs on. Tensors on cuda:k run on cuda:k's current stream
whatever the current device is; the legacy default stream runs with cuda:k
made current; tensors on different devices fail with a ValueError naming the
argument, before anything is launched.

The stream and device decisions are the package's (kdajit._launch); torch's CUDA
queries and the C entry points are replaced by recorders, so this runs on a
machine without a GPU. test_gpu.py (test_second_device) makes the real call on
cuda:1 where two GPUs exist."""
import contextlib
import unittest
from unittest import mock

import torch
from kda_testing import make_problem

import kdajit
from kdajit import _launch


class _Recorder:
    """Stands in for torch's current device and the C decode entry points."""

    def __init__(self, current, streams):
        self.current = current
        self.streams = streams  # device -> its current raw stream
        self.calls = []  # (entry point, stream, current device at the call)

    def raw_stream(self, device):
        return self.streams[device]

    def current_device(self):
        return self.current

    @contextlib.contextmanager
    def device(self, d):
        before, self.current = self.current, d
        try:
            yield
        finally:
            self.current = before

    def entry(self, index):
        def call(handle, args, stream):
            self.calls.append((index, stream, self.current))
            return 0
        return call

    def patches(self):
        c = (self.entry(0), self.entry(1), self.entry(2))
        return [mock.patch.object(_launch, "_c", c),
                mock.patch.object(_launch, "_handle", lambda: object()),
                mock.patch.object(_launch, "_raw_stream", self.raw_stream),
                mock.patch.object(_launch, "_current_device", self.current_device),
                mock.patch.object(torch.cuda, "device", self.device)]


def _mapping(device):
    return _launch._Mapping((), device, f"cuda:{device}", {})


class Devices(unittest.TestCase):
    def run_launch(self, rec, device, fn_index=0):
        with contextlib.ExitStack() as stack:
            for p in rec.patches():
                stack.enter_context(p)
            _launch._launch(fn_index, "single" if fn_index == 0 else "packed", object(), _mapping(device))

    def test_tensors_on_another_device_run_on_its_current_stream(self):
        rec = _Recorder(current=0, streams={0: 0x1000, 1: 0x2001, 3: 0x4003})
        for device, op in ((1, 0), (3, 1), (0, 0)):
            with self.subTest(device=device):
                self.run_launch(rec, device, op)
                # The stream is the tensors' device's; the current device is left as it was.
                self.assertEqual(rec.calls[-1], (op, rec.streams[device], 0))
        self.assertEqual(rec.current, 0)

    def test_legacy_stream_runs_with_the_tensors_device_current(self):
        rec = _Recorder(current=0, streams={0: 0, 2: 0})
        self.run_launch(rec, 2)
        self.assertEqual(rec.calls, [(0, 0, 2)])  # cuda:2 current during the call only
        self.assertEqual(rec.current, 0)
        self.run_launch(rec, 0)  # already current: no switch needed
        self.assertEqual(rec.calls[-1], (0, 0, 0))

    def test_tensors_on_different_devices_name_the_argument(self):
        for op in ("single", "packed"):
            for name in ("A_log", "state", "output"):
                with self.subTest(op=op, name=name):
                    p = make_problem(op, 4, 3, seed=5)
                    if p.args.get(name) is None:
                        continue
                    # "meta": a second device that every torch has; the check compares devices only.
                    moved = p.args[name].to("meta")
                    _launch._clear_caches()
                    with self.assertRaises(ValueError) as cm:
                        p.call(kdajit, **{name: moved})
                    msg = str(cm.exception)
                    self.assertTrue(msg.startswith(f"{name}: expected a tensor on cpu (the device of x), got meta"),
                                    msg)


if __name__ == "__main__":
    unittest.main()
