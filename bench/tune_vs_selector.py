#!/usr/bin/env python3
"""How good the selector's built-in bands are, from the measurements of `kdajit tune`.

  tune_vs_selector.py FILE [--sm-count 132] [--arch sm_90] [--worst 20]

FILE is what `kdajit tune --json` printed (its "measurements": every eligible
route's median per key and batch size), or the text `kdajit tune` printed
without --json (one line per family and batch size:
"KEY rows R: route T us ... -> winner"). For every (family, batch size) it asks
the library which route the built-in bands pick for that call on a GPU of
--sm-count SMs (kdajit.key_for with use of no tune table: the support query
never reads one), and prints the built-in route's time over the fastest
route's: median, p90, worst, how often the built-in route is the fastest, and
the worst cells. Needs the kdajit Python package and its libkdajit.so (no GPU).
"""
import argparse
import json
import re
import statistics
import sys

KEY = re.compile(r"^kda_(single|packed)\.h(\d+)\.state_(\w+?)\.conv_(\w+?)\.t(\d+)\.gate_(\w+?)\.route_(\w+?)\.(sm_\w+)$")
LINE = re.compile(r"^(kda_\S+) rows (\d+): (.*) -> (\w+)$")
TIME = re.compile(r"(\w+) ([\d.]+) us")


def parse_key(name):
    m = KEY.match(name)
    if not m:
        raise ValueError(f"not a kernel key name: {name!r}")
    op, h, state, conv, t, gate, route, arch = m.groups()
    return (op, int(h), state, conv, int(t), gate), route


def read_measurements(path):
    """{(family, rows): {route: us}} from a tune JSON or text output."""
    with open(path) as f:
        text = f.read()
    cells = {}
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "measurements" in doc:
        for m in doc["measurements"]:
            family, route = parse_key(m["key"])
            cells.setdefault((family, int(m["rows"])), {})[route] = float(m["median_us"])
        return cells
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue  # compile lines, the summary
        family, _ = parse_key(m.group(1))
        cells[(family, int(m.group(2)))] = {r: float(us) for r, us in TIME.findall(m.group(3))}
    return cells


def builtin_route(kdajit, family, rows, arch, sm_count):
    op, h, state, conv, t, gate = family
    key = kdajit.key_for(h, rows=rows, op=op, state_dtype=state, conv_layout=conv,
                         tokens=t if op == "packed" else None, gate=gate, arch=arch, sm_count=sm_count)
    return parse_key(key)[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="kdajit tune output (--json or text)")
    ap.add_argument("--sm-count", type=int, default=132, help="SMs of the GPU the table was measured on (default 132)")
    ap.add_argument("--arch", default="sm_90", help="arch of the keys (default sm_90)")
    ap.add_argument("--worst", type=int, default=20, help="worst cells to list (default 20)")
    a = ap.parse_args(argv)
    if a.sm_count < 1:
        ap.error(f"--sm-count: expected >= 1, got {a.sm_count}")
    import kdajit  # after argument errors: they need no library
    cells = read_measurements(a.file)
    if not cells:
        print(f"{a.file}: no measurements found (expected `kdajit tune --json` or its text output)", file=sys.stderr)
        return 2
    rows = []
    for (family, n), times in sorted(cells.items()):
        route = builtin_route(kdajit, family, n, a.arch, a.sm_count)
        if route not in times:
            print(f"{family} rows {n}: the built-in route {route} was not measured", file=sys.stderr)
            return 1
        fastest = min(times, key=times.get)
        rows.append((times[route] / times[fastest], family, n, route, times[route], fastest, times[fastest]))
    ratios = sorted(r[0] for r in rows)
    def line(label, rs):
        return (f"{label}: {len(rs)} cells, built-in / fastest: median {statistics.median(rs):.3f}, "
                f"p90 {rs[int(0.9 * (len(rs) - 1))]:.3f}, worst {rs[-1]:.3f}; the built-in route is the fastest in "
                f"{sum(1 for r in rs if r == 1.0)}")
    print(line("all", ratios))
    for op in ("single", "packed"):
        rs = sorted(r[0] for r in rows if r[1][0] == op)
        if rs:
            print(line(op, rs))
    for r, (op, h, state, conv, t, gate), n, route, us, fastest, fus in sorted(rows, reverse=True)[:a.worst]:
        print(f"  {r:.3f}  {op} h{h} {state} {conv} t{t} {gate} rows {n}: built-in {route} {us:.2f} us, "
              f"fastest {fastest} {fus:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
