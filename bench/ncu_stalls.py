#!/usr/bin/env python3
"""Where a kernel's warps wait, per stretch of SASS: reads the source page that
bench/ncu_cell.sh's ncu_source exports (`ncu -i REP --page source --csv
--print-source sass`: one row per instruction, with its executed count and its
stall samples per reason) and prints

  - the totals: samples, instructions, the share of each stall reason;
  - one line per stretch, a stretch being the instructions up to and including
    a CTA barrier (BAR.SYNC), an mbarrier wait (SYNCS...TRYWAIT) or a
    WARPSYNC.ALL, or the kernel's last instruction: its SASS lines,
    its executed warp instructions (per work item with --per-item), its share
    of all samples and its top reasons;
  - the instructions that hold at least --top percent of the samples.

  python3 bench/ncu_stalls.py FILE.source.csv [--per-item WARP_ITEMS] [--top 1.5]

WARP_ITEMS divides the executed counts: e.g. items x warps per CTA, so a
stretch reads as instructions per warp per item.
"""
import argparse
import csv
import re
import sys

# A stretch ends after one of these (the instructions a warp waits at for others).
BOUNDARY = re.compile(r"\bBAR\.SYNC|\bSYNCS\.[A-Z.]*TRYWAIT|\bWARPSYNC\.ALL")


def number(text):
    text = text.strip().replace(",", "")
    if text in ("", "-"):
        return 0.0
    try:
        return float(text)
    except ValueError:
        return 0.0


def read(path):
    """Returns (kernel name, rows): each row {sass, samples, executed, reasons {name: samples}}."""
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    kernel = ""
    head = None
    for i, row in enumerate(lines):
        if row and row[0] == "Kernel Name" and len(row) > 1:
            kernel = row[1]
        if "Source" in row and "Address" in row:
            head = i
            break
    if head is None:
        raise SystemExit(f"ncu_stalls: {path}: no header row with 'Address' and 'Source' (is it ncu's source page?)")
    cols = lines[head]
    at = {name: k for k, name in enumerate(cols)}
    for need in ("Warp Stall Sampling (All Samples)", "Instructions Executed"):
        if need not in at:
            raise SystemExit(f"ncu_stalls: {path}: no column '{need}'; columns: {', '.join(cols)}")
    reasons = [(name[len("stall_"):], k) for k, name in enumerate(cols)
               if name.startswith("stall_") and "(Not Issued)" not in name]
    rows = []
    for row in lines[head + 1:]:
        if len(row) < len(cols) or not row[at["Address"]].startswith("0x"):
            continue
        rows.append({
            "sass": row[at["Source"]].strip(),
            "samples": number(row[at["Warp Stall Sampling (All Samples)"]]),
            "executed": number(row[at["Instructions Executed"]]),
            "reasons": {name: number(row[k]) for name, k in reasons},
        })
    if not rows:
        raise SystemExit(f"ncu_stalls: {path}: no instruction rows")
    return kernel, rows


def top_reasons(reasons, total, n=3):
    items = sorted(((v, k) for k, v in reasons.items() if v > 0), reverse=True)[:n]
    return " ".join(f"{k}:{100.0 * v / total:.1f}" for v, k in items) if total else ""


def add(into, reasons):
    for k, v in reasons.items():
        into[k] = into.get(k, 0.0) + v


def report(path, per_item, top, out):
    kernel, rows = read(path)
    total = sum(r["samples"] for r in rows) or 1.0
    executed = sum(r["executed"] for r in rows)
    reasons = {}
    for r in rows:
        add(reasons, r["reasons"])
    unit = f" per {per_item:g} warp items" if per_item != 1 else ""
    print(f"{path}: kernel {kernel}, {len(rows)} SASS lines, {total:.0f} samples, "
          f"{executed / per_item:.1f} warp instructions executed{unit}", file=out)
    print("reasons: " + top_reasons(reasons, total, n=len(reasons)), file=out)
    print(f"{'stretch (SASS lines)':<22} {'instr':>9} {'samples':>8}  top reasons (% of all samples); ends at",
          file=out)
    start = 0
    for end, r in enumerate(rows):
        if not BOUNDARY.search(r["sass"]) and end + 1 < len(rows):
            continue
        seg = rows[start:end + 1]
        s = sum(x["samples"] for x in seg)
        e = sum(x["executed"] for x in seg)
        if s / total >= 0.005 or e / max(executed, 1) >= 0.01:
            rs = {}
            for x in seg:
                add(rs, x["reasons"])
            print(f"{start:>6}-{end:<15} {e / per_item:>9.1f} {100.0 * s / total:>7.1f}%  "
                  f"{top_reasons(rs, total)}; {rows[end]['sass'][:40]}", file=out)
        start = end + 1
    print(f"instructions with >= {top}% of the samples (SASS line, share, reasons):", file=out)
    for i, r in enumerate(rows):
        if 100.0 * r["samples"] / total >= top:
            print(f"{i:>6} {100.0 * r['samples'] / total:>5.1f}%  {r['sass'][:48]:<48} "
                  f"{top_reasons(r['reasons'], total)}", file=out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="source-page CSVs (ncu_source's NAME.source.csv)")
    ap.add_argument("--per-item", type=float, default=1.0,
                    help="divide executed instructions by this (e.g. work items x warps per CTA)")
    ap.add_argument("--top", type=float, default=1.5, help="list instructions with at least this %% of samples")
    a = ap.parse_args(argv)
    if a.per_item <= 0:
        ap.error(f"--per-item must be > 0, got {a.per_item}")
    for k, f in enumerate(a.files):
        if k:
            print(file=sys.stdout)
        report(f, a.per_item, a.top, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
