#!/usr/bin/env python3
"""The compact summary of one benchmark run that the repository keeps (bench/results/).

  summarize.py --grid GRID.json [--tune TUNE.json] [--peers-single P.json] [--peers-packed P.json] --out OUT.json

Raw runs stay outside the tree (a grid is about 1.5 MB of JSON); the summary
holds the numbers docs/PERFORMANCE.md cites:
- `grid`: the kdajit_bench grid with only the fields bench/results_table.py
  reads (every statistic reduced to its median, values as measured), so
  `results_table.py OUT.json` prints the same tables as the raw grid, in every
  mode;
- `tune`: the table `kdajit tune --json` wrote (the selector's input) and its
  measurements as {family key with `{}` for the route: {rows: {route: us}}};
- `peers`: per Triton peer, the settings, versions, the reference check and
  per cell kdajit's and Triton's median device time and host cost.
The tune and the peers are rounded to six significant digits.
Exit status: 0, or 2 for bad arguments or input.
"""
import argparse
import json
import os
import re
import sys

SCHEMA = "kdajit-bench-summary/1"
GRID_SCHEMA = "kdajit-bench-decode/2"

# The per-cell fields of a grid the tables read, kept as they are.
CELL_FIELDS = ("name", "op", "heads", "count", "rows", "tokens", "state", "conv", "gate", "state_indices_mode",
               "status", "error", "key", "route", "bytes_per_call", "floor_us", "floor_shape", "ratio",
               "host_minus_bare_us")
# The statistics ({n, median, p10, ...}) of a cell, reduced to {median}.
CELL_STATS = ("device_us", "host_us_per_call")


def rounded(v):
    """v with every float rounded to six significant digits (recursively)."""
    if isinstance(v, float):
        return float(f"{v:.6g}")
    if isinstance(v, dict):
        return {k: rounded(x) for k, x in v.items()}
    if isinstance(v, list):
        return [rounded(x) for x in v]
    return v


def median_only(stats):
    return {"median": stats["median"]} if isinstance(stats, dict) and "median" in stats else stats


def timing(t, route=False):
    """A timing sub-object (tuned, a forced route, a PDL run): status, ratio, error, median device us, and with
    route=True the route (a forced route's is its name in `routes`, a PDL run's the cell's)."""
    out = {k: t[k] for k in ("status", "ratio", "error") + (("route",) if route else ()) if k in t}
    if "device_us" in t:
        out["device_us"] = median_only(t["device_us"])
    return out


def summarize_cell(c):
    out = {k: c[k] for k in CELL_FIELDS if k in c}
    for k in CELL_STATS:
        if k in c:
            out[k] = median_only(c[k])
    if "bare_launch" in c:
        b = c["bare_launch"]
        out["bare_launch"] = {"status": b["status"], **({"us_per_call": median_only(b["us_per_call"])}
                                                        if "us_per_call" in b else {})}
    if "tuned" in c:
        out["tuned"] = timing(c["tuned"], route=True)
    if "routes" in c:
        out["routes"] = {r: timing(t) for r, t in c["routes"].items()}
    if "pdl" in c:
        p = c["pdl"]
        out["pdl"] = {k: timing(p[k]) if isinstance(p[k], dict) else p[k] for k in p}
    return out


def summarize_grid(g):
    if g.get("schema") != GRID_SCHEMA:
        raise ValueError(f"expected a {GRID_SCHEMA} grid, got schema {g.get('schema')!r}")
    keep = ("schema", "date", "commit", "kdajit_version", "status", "total_seconds", "gpu", "settings", "prewarm",
            "copy_bandwidth_gbps")
    out = {k: g[k] for k in keep if k in g}
    out["configs"] = [summarize_cell(c) for c in g["configs"]]
    return out


ROUTE = re.compile(r"\.route_(\w+?)\.")


def summarize_tune(t):
    if "measurements" not in t:
        raise ValueError("expected what `kdajit tune --json` wrote (no measurements)")
    times = {}
    for m in t["measurements"]:
        route = ROUTE.search(m["key"])
        if not route:
            raise ValueError(f"not a kernel key name: {m['key']!r}")
        family = m["key"][:route.start()] + ".route_{}." + m["key"][route.end():]
        times.setdefault(family, {}).setdefault(str(m["rows"]), {})[route.group(1)] = m["median_us"]
    return {"table": t.get("table"), "skipped_families": t.get("skipped_families"), "times": times}


def summarize_peer(p):
    keep = ("schema", "date", "status", "gpu", "versions", "settings", "tolerances", "copy_bandwidth_gbps",
            "triton_matches_reference", "kdajit_matches_reference")
    out = {k: p[k] for k in keep if k in p}
    out["settings"] = {k: v for k, v in p.get("settings", {}).items() if k not in ("lib", "json", "cache_dir")}
    out["reference_check"] = [{k: r[k] for k in ("impl", "state", "ok") if k in r} for r in p.get("reference_check", [])]
    cells = []
    for c in p["configs"]:
        cell = {k: c[k] for k in ("heads", "rows", "seqs", "tokens", "state", "bytes_per_call", "floor_us", "speedup")
                if k in c}
        for impl in ("kdajit", "triton"):
            r = c.get(impl, {})
            cell[impl] = {"status": r.get("status"), **({"key": r["key"]} if "key" in r else {})}
            if "device_us" in r:
                cell[impl]["device_us"] = r["device_us"]["median"]
            if "host" in r:
                cell[impl]["host_us"] = r["host"]["per_call_us"]["median"]
        cell["check_ok"] = c.get("check", {}).get("ok")
        cells.append(cell)
    out["configs"] = cells
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", required=True, help="kdajit_bench --json output")
    ap.add_argument("--tune", help="kdajit tune --json output")
    ap.add_argument("--peers-single", help="bench/peers/bench_triton_peer.py --json output")
    ap.add_argument("--peers-packed", help="bench/peers/bench_triton_packed.py --json output")
    ap.add_argument("--out", required=True, help="the summary to write")
    a = ap.parse_args(argv)
    summarizers = {"grid": summarize_grid, "tune": lambda t: rounded(summarize_tune(t)),
                   "peers_single": lambda p: rounded(summarize_peer(p)),
                   "peers_packed": lambda p: rounded(summarize_peer(p))}
    # The grid stays unrounded: a value a hair above a printed digit's midpoint prints as it does from the run.
    out = {"schema": SCHEMA, "sources": {}}
    for name, summarize in summarizers.items():
        path = getattr(a, name)
        if not path:
            continue
        try:
            with open(path) as f:
                part = summarize(json.load(f))
        except (OSError, ValueError, KeyError, TypeError) as e:
            why = f"expected a field {e} it lacks" if isinstance(e, KeyError) else str(e)
            print(f"summarize.py: --{name.replace('_', '-')} {path}: {why}", file=sys.stderr)
            return 2
        out["sources"][name] = os.path.basename(path)
        if name.startswith("peers_"):
            out.setdefault("peers", {})[name[6:]] = part
        else:
            out[name] = part
    with open(a.out, "w") as f:
        json.dump(out, f, separators=(",", ":"), sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
