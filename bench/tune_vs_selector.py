#!/usr/bin/env python3
"""How good the selector's built-in bands are, from the measurements of `kdajit tune`.

  tune_vs_selector.py FILE [--sm-count 132] [--arch sm_90] [--worst 20] [--cli kdajit]

FILE is what `kdajit tune --json` printed (its "measurements": every eligible
route's median per key and batch size), or the text `kdajit tune` printed
without --json (one line per family and batch size:
"KEY rows R: route T us ... -> winner"). For every (family, batch size) it asks
the library which route the built-in bands pick for that call on a GPU of
--sm-count SMs (kdajit.key_for with use of no tune table: the support query
never reads one), and prints the built-in route's time over the fastest
route's: median, p90, worst, how often the built-in route is the fastest, and
the worst cells. Needs the kdajit Python package and its libkdajit.so (no GPU),
and the kdajit CLI (--cli, default KDAJIT_CLI, else `kdajit` on PATH), whose
`kdajit fields --json` spells the fields of a key name.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

LINE = re.compile(r"^(\S+) rows (\d+): (.*) -> (\w+)$")
TIME = re.compile(r"(\w+) ([\d.]+) us")
# The fields of a key name that make its family: every one but the route and the arch.
FAMILY = ("op", "heads", "state", "conv", "t", "gate")


def cli_argument(ap):
    ap.add_argument("--cli", default=os.environ.get("KDAJIT_CLI") or shutil.which("kdajit"),
                    help="the kdajit CLI (default: KDAJIT_CLI, else kdajit on PATH)")


class KeyNames:
    """Kernel key names as the library spells them: `kdajit fields --json` (per
    field in key-name order: name, prefix, and its values or integer range)."""

    def __init__(self, fields):
        self.fields = fields
        parts = [re.escape(f["prefix"]) + (r"(\d+)" if "values" not in f else
                                           "(" + "|".join(re.escape(v) for v in f["values"]) + ")") for f in fields]
        self.pattern = re.compile("^" + r"\.".join(parts) + "$")

    @classmethod
    def from_cli(cls, cli):
        """Asks the kdajit CLI at `cli`; RuntimeError naming --cli when that fails."""
        if not cli:
            raise RuntimeError("--cli: expected the kdajit CLI (or KDAJIT_CLI, or kdajit on PATH), got none")
        try:
            out = subprocess.run([cli, "fields", "--json"], capture_output=True, text=True, check=True).stdout
            return cls(json.loads(out))
        except (OSError, subprocess.CalledProcessError, ValueError) as e:
            raise RuntimeError(f"--cli: `{cli} fields --json` failed: {e}") from e

    def values(self, field):
        """The spellings of an enum field (e.g. "op"), in the library's order."""
        return next(f["values"] for f in self.fields if f["name"] == field)

    def parse(self, name):
        """(family, route) of a key name; ValueError when it is not one."""
        m = self.pattern.match(name)
        if not m:
            raise ValueError(f"not a kernel key name: {name!r}")
        v = {f["name"]: int(x) if "values" not in f else x for f, x in zip(self.fields, m.groups())}
        return tuple(v[n] for n in FAMILY), v["route"]


def read_measurements(path, names):
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
            family, route = names.parse(m["key"])
            cells.setdefault((family, int(m["rows"])), {})[route] = float(m["median_us"])
        return cells
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue  # compile lines, the summary
        family, _ = names.parse(m.group(1))
        cells[(family, int(m.group(2)))] = {r: float(us) for r, us in TIME.findall(m.group(3))}
    return cells


def builtin_route(kdajit, names, family, rows, arch, sm_count):
    """The route of the key the library selects for `rows` (sequences of the packed op)."""
    op, h, state, conv, t, gate = family
    key = kdajit.key_for(h, rows=rows, op=op, state_dtype=state, conv_layout=conv, tokens=t, gate=gate, arch=arch,
                         sm_count=sm_count)
    return names.parse(key)[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="kdajit tune output (--json or text)")
    ap.add_argument("--sm-count", type=int, default=132, help="SMs of the GPU the table was measured on (default 132)")
    ap.add_argument("--arch", default="sm_90", help="arch of the keys (default sm_90)")
    ap.add_argument("--worst", type=int, default=20, help="worst cells to list (default 20)")
    cli_argument(ap)
    a = ap.parse_args(argv)
    if a.sm_count < 1:
        ap.error(f"--sm-count: expected >= 1, got {a.sm_count}")
    try:
        names = KeyNames.from_cli(a.cli)
    except RuntimeError as e:
        ap.error(str(e))
    import kdajit  # after argument errors: they need no library
    cells = read_measurements(a.file, names)
    if not cells:
        print(f"{a.file}: no measurements found (expected `kdajit tune --json` or its text output)", file=sys.stderr)
        return 2
    rows = []
    for (family, n), times in sorted(cells.items()):
        route = builtin_route(kdajit, names, family, n, a.arch, a.sm_count)
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
    for op in names.values("op"):
        rs = sorted(r[0] for r in rows if r[1][0] == op)
        if rs:
            print(line(op, rs))
    for r, (op, h, state, conv, t, gate), n, route, us, fastest, fus in sorted(rows, reverse=True)[:a.worst]:
        print(f"  {r:.3f}  {op} h{h} {state} {conv} t{t} {gate} rows {n}: built-in {route} {us:.2f} us, "
              f"fastest {fastest} {fus:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
