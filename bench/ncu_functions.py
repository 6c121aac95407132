#!/usr/bin/env python3
"""Where a kernel's instructions and stall samples are, per function of its
source: reads the CUDA-and-SASS source page of an ncu report (`ncu -i REP
--page source --csv --print-source cuda,sass`, recorded with `--import-source
yes` and the generated source at hand: `kdajit show KEY > DIR/kernel.cu`,
`--source-folders DIR`) and that source, and prints one line per function:
its executed warp instructions (per work item with --per-item) and its share
of the samples the page puts on CUDA lines.

  python3 bench/ncu_functions.py PAGE.csv kernel.cu [--per-item ITEMS] [--min 0.3]

A line of the source belongs to the last function whose definition starts
above it (a `__device__` or `__global__` line naming it), so a lambda counts
in the function around it and an inlined helper in its own. ncu puts some
instructions both at a call and in the helper's body, so the shares add up
to somewhat more than the page's samples; the instruction counts barely
(the report's first line gives both totals). Functions below --min percent
of both are left out. --column NAME (repeatable) adds the sum of another
column of the page per function, e.g. "L1 Wavefronts Shared Excessive" for
shared-memory bank conflicts (divided by --per-item like the instructions).
Exit status: 0, or 2 for a file that is not such a page or lacks a column.
"""
import argparse
import collections
import csv
import re
import sys

DEFINITION = re.compile(r'^\s*(?:template\s*<[^>]*>\s*)?(?:static\s+)?(?:extern "C"\s+)?'
                        r'(?:__device__|__global__)[^(]*?\b(\w+)\s*\(')


BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)")


def number(text):
    text = text.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return 0.0


def functions_by_line(source_text):
    """{line number (1-based): the function whose definition it is in or after}."""
    owner, current = {}, "?"
    for number_, line in enumerate(source_text.split("\n"), 1):
        m = DEFINITION.match(BOUNDS.sub("", line))
        if m:
            current = m.group(1)
        owner[number_] = current
    return owner


def read_lines(path, extra=()):
    """[(line number, samples, executed, *the extra columns)] from the page's CUDA line rows."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = next((i for i, r in enumerate(rows) if r and r[0] == "Line No"), None)
    if head is None:
        raise ValueError(f"{path}: no 'Line No' header (expected --print-source cuda,sass)")
    columns = rows[head]
    try:
        wanted = [columns.index(c) for c in ("Warp Stall Sampling (All Samples)", "Instructions Executed", *extra)]
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    out = []
    for r in rows[head + 1:]:
        if r and r[0].strip().isdigit() and len(r) > max(wanted):
            out.append((int(r[0]), *(number(r[i]) for i in wanted)))
    return out


def by_function(lines, owner):
    """{function: [samples, executed, *extra columns]} and the totals in the same order."""
    width = len(lines[0]) - 1 if lines else 2
    sums = collections.defaultdict(lambda: [0.0] * width)
    total = [0.0] * width
    for line, *values in lines:
        f = owner.get(line, "?")
        for i, v in enumerate(values):
            sums[f][i] += v
            total[i] += v
    return sums, total


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("page")
    ap.add_argument("source")
    ap.add_argument("--per-item", type=float, default=1.0, help="divide the executed counts by this")
    ap.add_argument("--min", type=float, default=0.3, help="leave out functions below this percent of both")
    ap.add_argument("--column", action="append", default=[], help="also sum this column of the page per function")
    args = ap.parse_args(argv)
    try:
        lines = read_lines(args.page, args.column)
        with open(args.source) as f:
            owner = functions_by_line(f.read())
    except (OSError, ValueError) as e:
        print(f"ncu_functions: {e}", file=sys.stderr)
        return 2
    sums, total = by_function(lines, owner)
    if total[0] <= 0 or total[1] <= 0:
        print(f"ncu_functions: {args.page}: no samples or no instructions on its CUDA lines", file=sys.stderr)
        return 2
    print(f"{total[0]:.0f} samples on CUDA lines, {total[1] / args.per_item:.0f} warp instructions executed"
          f" per {args.per_item:g} items")
    for name, t in zip(args.column, total[2:]):
        print(f"{name}: {t / args.per_item:.0f} per {args.per_item:g} items")
    print(f"{'function':32s} {'instructions':>13s} {'of all':>7s} {'samples':>8s}"
          + "".join(f" | {name}" for name in args.column))
    for f, (s, e, *more) in sorted(sums.items(), key=lambda kv: (-kv[1][0], kv[0])):
        ps, pe = 100 * s / total[0], 100 * e / total[1]
        if ps < args.min and pe < args.min:
            continue
        print(f"{f:32s} {e / args.per_item:13.0f} {pe:6.1f}% {ps:7.1f}%"
              + "".join(f" | {m / args.per_item:.0f}" for m in more))
    return 0


if __name__ == "__main__":
    sys.exit(main())
