#!/usr/bin/env python3
"""Merge the kdajit_bench runs of an A/B (bench/ab_on_device.sh) into one JSON
and print, per cell and route, each variant's kdajit / floor (the median over
its rounds) and its ratio to the first variant's.

    ab_table.py --out ab.json [--about TEXT] [--command TEXT] NAME-ROUND=FILE ...
    ab_table.py --from ab.json        (the table again, from a merged JSON)

NAME is the variant, ROUND its round (the variants are in the order of their
first appearance; the first is the reference). The table has one row per cell
and timed route ("selector" is the built-in choice; forced routes by name),
then one "geomean" line per variant over the rows every variant has, then one
"family" line per op, state, T, rows and route: each variant's geomean ratio
over that family's cells (every H and conv layout).
Exit status: 0, or 2 for bad arguments or input.
"""
import argparse
import datetime
import json
import math
import statistics
import sys


def load_runs(specs):
    """({NAME-ROUND: run}, {NAME-ROUND: NAME}, [NAME in order of first appearance])."""
    runs, variant_of, order = {}, {}, []
    for spec in specs:
        name, sep, path = spec.partition("=")
        variant, dash, rnd = name.rpartition("-")
        if not sep or not dash or not variant or not rnd.isdigit():
            raise ValueError(f"run {spec!r}: expected NAME-ROUND=FILE")
        with open(path) as f:
            runs[name] = json.load(f)
        variant_of[name] = variant
        if variant not in order:
            order.append(variant)
    return runs, variant_of, order


def ratios(run):
    """{(cell, route): kdajit / floor} of one kdajit_bench run."""
    out = {}
    for c in run.get("configs", []):
        if c.get("status") != "ok" or not c.get("floor_us"):
            continue
        out[(c["name"], "selector")] = (c["ratio"], c.get("route", "?"))
        for route, r in sorted((c.get("routes") or {}).items()):  # the same order from a merged JSON
            if r.get("status") == "ok" and "ratio" in r:
                out[(c["name"], route)] = (r["ratio"], route)
    return out


def family(cell, route):
    """'packed h64 n128 t4 bf16 sd', 'stream' -> 'packed bf16 t4 n128 | stream' (single: t1)."""
    words = cell.split()
    op, rows, state = words[0], words[2], words[-2]
    tokens = words[3] if op == "packed" else "t1"
    return f"{op} {state} {tokens} {rows} | {route}"


def geomean(logs):
    return math.exp(sum(logs) / len(logs))


def table(runs, variant_of, order):
    per = {v: {} for v in order}  # variant -> (cell, route) -> [ratio per round]
    picks = {}
    for name, run in runs.items():
        v = variant_of[name]
        for key, (ratio, route) in ratios(run).items():
            per[v].setdefault(key, []).append(ratio)
            if key[1] == "selector":
                picks.setdefault((v, key[0]), route)
    keys = [k for k in per[order[0]] if all(k in per[v] for v in order)]
    lines = ["cell | route | " + " | ".join(f"{v} (x{order[0]})" if i else v for i, v in enumerate(order))]
    logs = {v: [] for v in order[1:]}
    families = {}  # family -> variant -> [log ratio]
    for k in keys:
        base = statistics.median(per[order[0]][k])
        cells = []
        for i, v in enumerate(order):
            m = statistics.median(per[v][k])
            route = f" {picks.get((v, k[0]), '?')}" if k[1] == "selector" else ""
            cells.append(f"{m:.3f}{route}" if i == 0 else f"{m:.3f}{route} ({m / base:.3f})")
            if i:
                lr = math.log(m / base)
                logs[v].append(lr)
                families.setdefault(family(*k), {}).setdefault(v, []).append(lr)
        lines.append(f"{k[0]} | {k[1]} | " + " | ".join(cells))
    lines.append(f"cells: {len(keys)} rows in every variant")
    for v, ls in logs.items():
        if ls:
            lines.append(
                f"geomean {v}/{order[0]}: {geomean(ls):.4f} over {len(ls)} rows, "
                f"min {math.exp(min(ls)):.3f}, max {math.exp(max(ls)):.3f}")
    for f in sorted(families):
        per_v = families[f]
        n = len(next(iter(per_v.values())))
        lines.append(f"family {f} | {n} cells | " +
                     " | ".join(f"{v} {geomean(ls):.3f}" for v, ls in per_v.items()))
    return lines


def load_merged(path):
    """The runs of a merged JSON (--out), as load_runs() returns them."""
    with open(path) as f:
        merged = json.load(f)
    order = merged.get("about", {}).get("variants")
    runs = merged.get("runs")
    if not order or not isinstance(runs, dict):
        raise ValueError(f"{path}: not a merged A/B (no about.variants or runs)")
    variant_of = {name: name.rpartition("-")[0] for name in runs}
    if set(variant_of.values()) - set(order):
        raise ValueError(f"{path}: runs of variants that about.variants does not name")
    return runs, variant_of, order


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="merged JSON to write")
    ap.add_argument("--from", dest="merged", help="print the table of this merged JSON instead")
    ap.add_argument("--about", default="", help="what the variants are")
    ap.add_argument("--command", default="", help="the kdajit_bench command")
    ap.add_argument("runs", nargs="*", help="NAME-ROUND=FILE")
    a = ap.parse_args(argv)
    if a.merged and (a.out or a.runs):
        print("ab_table.py: --from takes no --out and no runs", file=sys.stderr)
        return 2
    if not a.merged and (not a.out or not a.runs):
        print("ab_table.py: expected --out FILE and NAME-ROUND=FILE runs, or --from FILE", file=sys.stderr)
        return 2
    try:
        runs, variant_of, order = load_merged(a.merged) if a.merged else load_runs(a.runs)
    except (OSError, ValueError) as e:
        print(f"ab_table.py: {e}", file=sys.stderr)
        return 2
    if a.out:
        first = next(iter(runs.values()))
        merged = {"about": {"what": a.about, "date": datetime.date.today().isoformat(), "gpu": first.get("gpu"),
                            "command": a.command, "variants": order}, "runs": runs}
        with open(a.out, "w") as f:
            json.dump(merged, f, indent=1, sort_keys=True)
    print("\n".join(table(runs, variant_of, order)))
    return 0

if __name__ == "__main__":
    sys.exit(main())
