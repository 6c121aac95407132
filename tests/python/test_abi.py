"""The ctypes mirror of the C ABI (python/kdajit/_abi.py) against the C compiler
and the header: struct sizes and offsets, enum values, versions, the packer."""
import ctypes
import json
import os
import re
import struct
import subprocess
import unittest

from kda_testing import SOURCE_DIR

import kdajit
from kdajit import _abi, _launch

HEADER = os.path.join(SOURCE_DIR, "runtime", "include", "kdajit", "kdajit.h")


def c_layout():
    """{struct: (size, {field: (offset, size)})} printed by the abi_layout C program."""
    exe = os.environ.get("KDAJIT_ABI_LAYOUT")
    if not exe:
        raise unittest.SkipTest("KDAJIT_ABI_LAYOUT (the abi_layout program CMake builds) is not set")
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    layout = {}
    for line in out.splitlines():
        name, *nums = line.split()
        if name == "version":
            layout["version"] = nums[0]
        elif nums[0] == "size":
            layout[name] = (int(nums[1]), {})
        else:
            struct_name, field = name.split(".")
            layout[struct_name][1][field] = (int(nums[0]), int(nums[1]))
    return layout


class Layout(unittest.TestCase):
    def test_every_struct_matches_the_c_compiler(self):
        layout = c_layout()
        layout.pop("version")
        self.assertEqual(set(layout), set(_abi.STRUCTS), "abi_layout.c and _abi.STRUCTS list different structs")
        for name, cls in _abi.STRUCTS.items():
            size, fields = layout[name]
            self.assertEqual(ctypes.sizeof(cls), size, f"sizeof({name}): ctypes vs C")
            ctypes_fields = [f for f, _ in cls._fields_]
            self.assertEqual(ctypes_fields, sorted(fields, key=lambda f: fields[f][0]),
                             f"{name}: the fields (in offset order) differ between ctypes and abi_layout.c")
            for field, (off, fsize) in fields.items():
                desc = getattr(cls, field)
                self.assertEqual((desc.offset, desc.size), (off, fsize), f"{name}.{field}: (offset, size) ctypes vs C")

    def check_packer(self, packer, args_type, tensor_fields, struct_size, pointer_base, scalars):
        # Distinct values in every slot of the packed bytes, read back through ctypes:
        # each tensor's pointer (pointer_base + i), the rest of its bytes, then the
        # scalars (a {field: value} dict in packing order).
        chunk = ctypes.sizeof(_abi.Tensor) - _launch._PTR_BYTES
        values = []
        for i in range(len(tensor_fields)):
            t = _abi.Tensor()
            t.dtype, t.ndim = i % 3, (i % 4) + 1
            for d in range(4):
                t.shape[d] = 1000 * i + d
                t.strides[d] = -(1000 * i + d)
            values += [pointer_base + i, bytes(t)[_launch._PTR_BYTES:]]
            self.assertEqual(len(values[-1]), chunk)
        values += list(scalars.values())
        a = args_type.from_buffer_copy(packer.pack(struct_size, *values))
        self.assertEqual(a.struct_size, struct_size)
        for i, name in enumerate(tensor_fields):
            t = getattr(a, name)
            self.assertEqual((t.data, t.dtype, t.ndim), (pointer_base + i, i % 3, (i % 4) + 1), name)
            self.assertEqual(list(t.shape), [1000 * i + d for d in range(4)], name)
            self.assertEqual(list(t.strides), [-(1000 * i + d) for d in range(4)], name)
        self.assertEqual({f: getattr(a, f) for f in scalars}, scalars)

    def test_packer_writes_each_field_where_ctypes_reads_it(self):
        self.check_packer(_launch._PACKER, _abi.DecodeArgs, _abi.TENSOR_FIELDS, 0x5151, 0x1000,
                          {"gate": 1, "lower_bound": -2.5, "norm_eps": 0.25, "state_indices_mode": 2,
                           "oob_counter": 0xABCDEF})

    def test_prefill_packer_writes_each_field_where_ctypes_reads_it(self):
        self.check_packer(_launch._PREFILL_PACKER, _abi.PrefillArgs, _abi.PREFILL_TENSOR_FIELDS, 0x6161, 0x2000,
                          {"gate": 1, "lower_bound": -2.5, "norm_eps": 0.25, "max_seq_len": 2**40 + 3,
                           "oob_counter": 0xABCDEF, "workspace": 0x7F0000001000, "workspace_bytes": 2**41 + 7})

    def test_prefill_arguments_map_onto_the_struct_fields(self):
        self.assertEqual(tuple(f for _, f, _, _ in _launch.PREFILL_ARGS), _abi.PREFILL_TENSOR_FIELDS)
        self.assertEqual([f for f, _ in _abi.PrefillArgs._fields_][1:15], list(_abi.PREFILL_TENSOR_FIELDS))

    def test_chunk_packer_writes_each_field_where_ctypes_reads_it(self):
        self.check_packer(_launch._CHUNK_PACKER, _abi.ChunkArgs, _abi.CHUNK_TENSOR_FIELDS, 0x7171, 0x3000,
                          {"gate": 1, "lower_bound": -2.5, "scale": 0.125, "qk_l2norm": 0, "beta_sigmoid": 1,
                           "state_v_first": 1, "max_seq_len": 2**40 + 5, "workspace": 0x7F0000002000,
                           "workspace_bytes": 2**41 + 9})

    def test_chunk_arguments_map_onto_the_struct_fields(self):
        self.assertEqual(tuple(f for _, f, _, _ in _launch.CHUNK_ARGS), _abi.CHUNK_TENSOR_FIELDS)
        self.assertEqual([f for f, _ in _abi.ChunkArgs._fields_][1:12], list(_abi.CHUNK_TENSOR_FIELDS))


class HeaderConstants(unittest.TestCase):
    def test_enum_values_match_the_header(self):
        with open(HEADER) as f:
            text = f.read()
        enum_line = r"^\s+KDAJIT_([A-Z0-9_]+)\s*=\s*(-?\d+)"
        consts = {m.group(1): int(m.group(2)) for m in re.finditer(enum_line, text, re.M)}
        self.assertIn("ERROR_CAPTURE", consts)
        for name, value in consts.items():
            self.assertTrue(hasattr(_abi, name), f"KDAJIT_{name} = {value} has no _abi.{name}")
            self.assertEqual(getattr(_abi, name), value, f"_abi.{name} vs KDAJIT_{name}")
        self.assertEqual(_abi.MAX_DIMS, int(re.search(r"#define KDAJIT_MAX_DIMS (\d+)", text).group(1)))

    def test_versions_agree(self):
        with open(os.path.join(SOURCE_DIR, "CMakeLists.txt")) as f:
            cmake = re.search(r"project\(kdajit VERSION ([0-9.]+)", f.read()).group(1)
        self.assertEqual(kdajit.__version__, cmake, "_abi.ABI_VERSION vs the CMake project version")
        self.assertEqual(kdajit.version(), cmake, "kdajit_version() of the loaded library")
        self.assertEqual(c_layout()["version"], cmake, "KDAJIT_VERSION_STRING of the header vs CMake")


class Statuses(unittest.TestCase):
    def test_python_exceptions_per_status(self):
        self.assertIsInstance(_abi.error_for(_abi.ERROR_INVALID_ARGUMENT, "m"), ValueError)
        self.assertIsInstance(_abi.error_for(_abi.ERROR_UNSUPPORTED, "m"), NotImplementedError)
        for status in range(_abi.ERROR_COMPILE, _abi.ERROR_INTERNAL + 1):
            e = _abi.error_for(status, "m")
            self.assertIsInstance(e, kdajit.KdajitError)
            self.assertIsInstance(e, RuntimeError)
            self.assertEqual(e.status, status)

    def test_status_names_come_from_the_library(self):
        lib = _abi.load()
        self.assertEqual(lib.status_name(_abi.ERROR_CAPTURE), "stream capture")
        self.assertEqual(lib.status_name(_abi.ERROR_INVALID_ARGUMENT), "invalid argument")

    def test_library_layout_self_check_runs_on_load(self):
        # _check_defaults read the init functions' values back at the ctypes
        # offsets; a shifted struct would have failed the load.
        lib = _abi.load()
        a = _abi.DecodeArgs()
        lib.kdajit_decode_args_init(ctypes.byref(a), ctypes.sizeof(a))
        self.assertEqual((a.struct_size, a.gate, a.lower_bound, a.state_indices_mode),
                         (ctypes.sizeof(a), _abi.GATE_BOUNDED, -5.0, 0))
        self.assertEqual(struct.unpack("<f", struct.pack("<f", a.norm_eps))[0], ctypes.c_float(1e-6).value)
        o = _abi.RuntimeOptions()
        lib.kdajit_runtime_options_init(ctypes.byref(o), ctypes.sizeof(o))
        self.assertEqual((o.struct_size, o.route, o.use_tuning, o.pdl), (ctypes.sizeof(o), None, 1, 0))
        c = _abi.Config()
        lib.kdajit_config_init(ctypes.byref(c), ctypes.sizeof(c))
        self.assertEqual((c.struct_size, c.heads, c.tokens, c.device, c.sm_count), (ctypes.sizeof(c), 64, 1, -1, 0))

    def test_prefill_entry_points_are_the_v1_exports(self):
        # Bound on first use; kdajit_prefill_args_init's defaults are read back there.
        lib = _abi.load()
        if not hasattr(lib.lib, "kdajit_prefill_v1") and not hasattr(lib.lib, "kdajit_prefill"):
            self.skipTest(f"{lib.path} has no kdajit_prefill (built without the prefill op)")
        self.assertTrue(hasattr(lib.lib, "kdajit_prefill_v1"), "kdajit.h maps kdajit_prefill to kdajit_prefill_v1")
        prefill, _ = lib.prefill_entry_points()
        self.assertEqual(ctypes.cast(prefill, ctypes.c_void_p).value,
                         ctypes.cast(lib.lib.kdajit_prefill_v1, ctypes.c_void_p).value)

    def test_chunk_entry_points_are_the_v1_exports(self):
        # Bound on first use; kdajit_chunk_args_init's defaults are read back there.
        lib = _abi.load()
        if not hasattr(lib.lib, "kdajit_chunk_v1"):
            with self.assertRaises(NotImplementedError) as cm:
                lib.chunk_entry_points()
            self.assertIn("chunk_kda needs one with it", str(cm.exception))
            self.skipTest(f"{lib.path} has no kdajit_chunk_v1 (the chunk op is not in this build)")
        chunk, validate = lib.chunk_entry_points()
        self.assertEqual(ctypes.cast(chunk, ctypes.c_void_p).value,
                         ctypes.cast(lib.lib.kdajit_chunk_v1, ctypes.c_void_p).value)
        self.assertEqual(ctypes.cast(validate, ctypes.c_void_p).value,
                         ctypes.cast(lib.lib.kdajit_validate_chunk_args_v1, ctypes.c_void_p).value)

    def test_sized_entry_points_are_the_v1_exports(self):
        # The plain symbols take the 0.1.0 structs (no struct_size): the package never calls them.
        lib = _abi.load()
        for name in _abi.SIZED_ENTRY_POINTS:
            bound = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
            self.assertEqual(bound, ctypes.cast(getattr(lib.lib, name + "_v1"), ctypes.c_void_p).value, name)
            self.assertNotEqual(bound, ctypes.cast(getattr(lib.lib, name), ctypes.c_void_p).value, name)


class Tables(unittest.TestCase):
    """The spellings come from the library (kdajit_tables_json), not from this package."""

    def test_spellings_map_onto_the_header_numbers(self):
        lib = _abi.load()
        ops = {"single": _abi.OP_SINGLE, "packed": _abi.OP_PACKED, "prefill": _abi.OP_PREFILL}
        if hasattr(lib.lib, "kdajit_chunk_v1"):  # a library with the chunk op spells it too
            ops["chunk"] = _abi.OP_CHUNK
        self.assertEqual(lib.enum("op"), ops)
        self.assertEqual(lib.enum("dtype"), {"f32": _abi.DTYPE_F32, "bf16": _abi.DTYPE_BF16,
                                             "int32": _abi.DTYPE_INT32})
        self.assertEqual(lib.enum("gate"), {"bounded": _abi.GATE_BOUNDED, "softplus": _abi.GATE_SOFTPLUS})
        self.assertEqual(lib.enum("conv_layout"), {"sd": _abi.CONV_SD, "ds": _abi.CONV_DS})
        self.assertEqual(list(lib.enum("indices_mode")), ["unique_or_null", "positive_unique", "repeated_positive"])
        self.assertEqual(lib.enum("log_level"), {"quiet": _abi.LOG_QUIET, "info": _abi.LOG_INFO,
                                                 "debug": _abi.LOG_DEBUG})

    def test_arches_and_routes_agree_with_the_cli(self):
        cli = os.environ.get("KDAJIT_CLI")
        if not cli:
            raise unittest.SkipTest("KDAJIT_CLI (the kdajit CLI CMake builds) is not set")
        routes = json.loads(subprocess.run([cli, "routes", "--json"], check=True, capture_output=True,
                                           text=True).stdout)
        self.assertEqual(_abi.routes(), {r["name"]: r["ops"] for r in routes})
        self.assertEqual(list(_abi.arches()), ["sm_90", "sm_90a", "sm_100a", "sm_103a", "sm_120a"])
        self.assertEqual(_abi.arch_for_compute_capability(9, 0), "sm_90")
        self.assertEqual(_abi.arch_for_compute_capability(10, 3), "sm_103a")
        self.assertIsNone(_abi.arch_for_compute_capability(8, 9))
        self.assertEqual(_abi.arch_without_device(), "sm_90")


if __name__ == "__main__":
    unittest.main()
