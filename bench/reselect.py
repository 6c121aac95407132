#!/usr/bin/env python3
"""A kdajit_bench grid as the current library's built-in bands would select it,
from the forced-route timings of the same run.

  reselect.py GRID.json --out NEW.json [--sm-count N] [--arch sm_90] [--cli kdajit]

GRID is a `kdajit_bench --routes all` JSON: every cell has its selector's
timing and one timing per forced route. For every cell this asks the library
(kdajit.key_for, no tune table) which route its built-in bands pick on a GPU of
--sm-count SMs (default: the GPU the grid ran on), and writes NEW with the
cell's selected key, route, device time and ratio taken from that route's forced
timing (the same kernel and launch the selector would make), the run's own
selection kept as "selected_in_run". Every other number (floor, host cost,
PDL, the tuned column) is the run's. Prints how many cells changed route and
the device time of the new selection over the run's. For results_table.py, when
the bands change after a grid run. Needs the kdajit Python package and its
libkdajit.so (no GPU), and the kdajit CLI as tune_vs_selector.py does (--cli).
"""
import argparse
import copy
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune_vs_selector import KeyNames, builtin_route, cli_argument  # noqa: E402  (the same key names and query)


def reselect(grid, kdajit, names, arch, sm_count):
    """(new grid, [(name, old route, new route, old us, new us)]) for `grid` (a loaded JSON)."""
    out = copy.deepcopy(grid)
    changes = []
    for c in out["configs"]:
        family, old = names.parse(c["key"])
        tokens = family[4]
        rows = int(c["rows"])
        if rows % tokens:
            raise ValueError(f"{c['name']}: {rows} rows are not whole sequences of T = {tokens}")
        rows //= tokens  # the grid's sequences all have T rows (T = 1: the single op); key_for takes N
        new = builtin_route(kdajit, names, family, rows, arch, sm_count)
        forced = (c.get("routes") or {}).get(new)
        if not forced or "device_us" not in forced:
            raise ValueError(f"{c['name']}: the grid has no forced timing of route {new} (run it with --routes all)")
        c["selected_in_run"] = {k: c[k] for k in ("key", "route", "device_us", "ratio") if k in c}
        if new != old:
            changes.append((c["name"], tokens, old, new, c["device_us"]["median"], forced["device_us"]["median"]))
        c["key"] = forced["key"]
        c["route"] = new
        c["device_us"] = forced["device_us"]
        c["ratio"] = forced["ratio"]
    return out, changes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid", help="kdajit_bench --routes all JSON")
    ap.add_argument("--out", required=True, help="where to write the reselected grid JSON")
    ap.add_argument("--sm-count", type=int, default=0, help="SMs of the GPU (default: the grid's)")
    ap.add_argument("--arch", default="sm_90", help="arch of the keys (default sm_90)")
    cli_argument(ap)
    a = ap.parse_args(argv)
    with open(a.grid) as f:
        grid = json.load(f)
    sms = a.sm_count or int(grid.get("gpu", {}).get("sms", 0))
    if sms < 1:
        ap.error("--sm-count: the grid names no SM count; give one >= 1")
    try:
        names = KeyNames.from_cli(a.cli)
    except RuntimeError as e:
        ap.error(str(e))
    import kdajit  # after argument errors: they need no library
    try:
        out, changes = reselect(grid, kdajit, names, a.arch, sms)
    except (KeyError, ValueError) as e:
        print(f"reselect: {a.grid}: {e}", file=sys.stderr)
        return 1
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    logs = [math.log(new / old) for *_, old, new in changes]
    n = len(out["configs"])
    print(f"{n} cells on {sms} SMs: {len(changes)} change route; "
          f"device time new / run over all cells: {math.exp(sum(logs) / n):.4f}")
    for name, t, old, new, old_us, new_us in changes:
        print(f"  {name} T{t}: {old} -> {new}, {old_us:.2f} -> {new_us:.2f} us ({new_us / old_us:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
