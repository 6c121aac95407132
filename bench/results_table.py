#!/usr/bin/env python3
"""Markdown tables for docs/PERFORMANCE.md from a kdajit_bench JSON file.

  results_table.py FILE                   grid tables: one per (op, state dtype, conv layout),
                                          rows H (packed: T and H), columns N, cells "ratio (route)"
  results_table.py FILE --value VALUE     the same grid with another value per cell:
                                          ratio (default), kdajit (us), floor (us), host (us/call),
                                          diff (host - bare launch, us), tuned (use_tuning ratio),
                                          pdl (us saved by PDL on two dependent calls)
  results_table.py FILE --route NAME      the grid of one forced route (--routes): ratio, or n/a
  results_table.py FILE --flat            one row per cell with every main number
  results_table.py FILE --fit             per family (op, state, conv, T, H): device time = fixed +
                                          per-MB cost, least squares over the cells of at least 1/8
                                          of the family's largest bytes, for kdajit (the largest
                                          cell's route, forced in every cell fitted) and the floor;
                                          slope ratio = kdajit's per-MB cost / the floor's, and the
                                          extra fixed cost: what a large batch and a small one pay
  results_table.py FILE --targets         the targets per (op, state): the range of kdajit / floor
                                          and the cells that meet 1.15 (N <= 8), 1.08 (N = 32) and
                                          1.05 (N >= 128), unrounded; the packed op counts T = 2 and 4
  results_table.py FILE --against OLD     per family (op, state; packed also per T), FILE's device
                                          time / OLD's over the cells both ran; with --targets, OLD's
                                          range and count beside each target cell

FILE and OLD may also be a run's summary (bench/summarize.py, kdajit-bench-summary/1, what
bench/results/ keeps): its grid prints the same tables. Files of the older schema
(kdajit-bench-decode/1, no floor kernel) print their flat table.
"""
import argparse
import json
import statistics
import sys


def header(j):
    g = j["gpu"]
    return (f"{g['name']} ({g.get('sms', '?')} SMs, driver {g.get('cuda_driver_version', '?')}), {j['date']}, "
            f"commit {j['commit'] or '?'}, copy roofline {j['copy_bandwidth_gbps']:.0f} GB/s, "
            f"{j['settings']['iters']} replays per number")


def old_schema(j):
    print(f"{j['gpu']['name']}, {j['date']}, commit {j['commit']}, copy roofline {j['copy_bandwidth_gbps']:.0f} GB/s")
    print()
    print("| op | H | R / N | T | state | median us | floor us | GB/s | % of copy | host us/call |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in j["configs"]:
        if c["status"] != "ok":
            continue
        n = c["rows"] if c["op"] == "single" else c["seqs"]
        print(f"| {c['op']} | {c['heads']} | {n} | {c['tokens']} | {c['state']} | {c['device_us']['median']:.2f} "
              f"| {c['floor_us']:.2f} | {c['effective_gbps']:.0f} | {c['pct_of_copy_bandwidth']:.1f} "
              f"| {c['host_us_per_call']['median']:.2f} |")


def cell_text(c, value):
    if c["status"] != "ok":
        return c["status"].upper()
    if value == "ratio":
        return f"{c['ratio']:.2f} ({c['route']})"
    if value == "kdajit":
        return f"{c['device_us']['median']:.1f}"
    if value == "floor":
        return f"{c['floor_us']:.1f}"
    if value == "host":
        return f"{c['host_us_per_call']['median']:.2f}"
    if value == "diff":
        return f"{c['host_minus_bare_us']:.2f}" if "host_minus_bare_us" in c else c["bare_launch"]["status"]
    if value == "tuned":
        t = c.get("tuned")
        if not t:
            return ""
        return f"{t['ratio']:.2f} ({t['route']})" if t["status"] == "ok" else t["status"]
    if value == "pdl":
        p = c.get("pdl")
        return f"{p['saving_us']:.2f}" if p and "saving_us" in p else ""
    if value.startswith("route:"):
        r = c.get("routes", {}).get(value[6:])
        if not r:
            return ""
        return f"{r['ratio']:.2f}" if r["status"] == "ok" else r["status"]
    raise SystemExit(f"unknown --value {value}")


def grid(j, value):
    titles = {"ratio": "kdajit / floor (route)", "kdajit": "kdajit device us", "floor": "floor device us",
              "host": "host us per kdajit call", "diff": "host us: kdajit call - bare launch",
              "tuned": "kdajit with use_tuning / floor (route)", "pdl": "us saved by PDL (two dependent calls)"}
    if value.startswith("route:"):
        titles[value] = f"route {value[6:]} forced / floor"
    print(header(j))
    groups = {}
    for c in j["configs"]:
        groups.setdefault((c["op"], c["state"], c["conv"]), []).append(c)
    for (op, state, conv), cells in groups.items():
        ns = sorted({c["count"] for c in cells})
        rows = sorted({(c["tokens"], c["heads"]) for c in cells})
        by = {(c["tokens"], c["heads"], c["count"]): c for c in cells}
        print()
        print(f"**{op}, {state} state, conv {conv}**: {titles[value]}")
        print()
        label = "H" if op == "single" else "T, H"
        print(f"| {label} | " + " | ".join(f"N={n}" for n in ns) + " |")
        print("|---|" + "---|" * len(ns))
        for t, h in rows:
            name = f"{h}" if op == "single" else f"T={t}, H={h}"
            cols = [cell_text(by[(t, h, n)], value) if (t, h, n) in by else "" for n in ns]
            print(f"| {name} | " + " | ".join(cols) + " |")


def flat(j):
    print(header(j))
    print()
    print("| op | H | N | T | state | conv | route | kdajit us | floor us | ratio | floor shape | host us | bare us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in j["configs"]:
        lead = f"| {c['op']} | {c['heads']} | {c['count']} | {c['tokens']} | {c['state']} | {c['conv']} |"
        if c["status"] != "ok":
            print(lead + f" {c['status'].upper()}: {c.get('error', '').splitlines()[0] if c.get('error') else ''} |")
            continue
        bare = c["bare_launch"]
        bare_us = f"{bare['us_per_call']['median']:.2f}" if bare["status"] == "ok" else bare["status"]
        print(lead + f" {c['route']} | {c['device_us']['median']:.2f} | {c['floor_us']:.2f} | {c['ratio']:.2f} "
              f"| {c['floor_shape']} | {c['host_us_per_call']['median']:.2f} | {bare_us} |")


def ok_cells(j):
    return [c for c in j["configs"] if c["status"] == "ok"]


def least_squares(xs, ys):
    """(intercept, slope) of the least-squares line through (xs, ys); two or more distinct xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def route_us(c, route):
    """Device us of `route` in cell c: the forced timing (--routes), else the selected one."""
    r = c.get("routes", {}).get(route)
    if r and r.get("status") == "ok":
        return r["device_us"]["median"]
    return c["device_us"]["median"] if c["route"] == route else None


def fit(j):
    print(header(j))
    print()
    print("| op | state | conv | T | H | route | N fitted | kdajit fixed us | floor fixed us | extra fixed us "
          "| kdajit us/MB | floor us/MB | slope ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    fams = {}
    for c in ok_cells(j):
        fams.setdefault((c["op"], c["state"], c["conv"], c["tokens"], c["heads"]), []).append(c)
    for (op, state, conv, t, h), cells in fams.items():
        cells.sort(key=lambda c: c["bytes_per_call"])
        route = cells[-1]["route"]
        used = [c for c in cells if c["bytes_per_call"] * 8 >= cells[-1]["bytes_per_call"]]
        used = [c for c in used if route_us(c, route) is not None]
        if len({c["bytes_per_call"] for c in used}) < 2:
            continue
        mb = [c["bytes_per_call"] / 1e6 for c in used]
        a1, b1 = least_squares(mb, [route_us(c, route) for c in used])
        a0, b0 = least_squares(mb, [c["floor_us"] for c in used])
        ns = ",".join(str(c["count"]) for c in used)
        print(f"| {op} | {state} | {conv} | {t} | {h} | {route} | {ns} | {a1:.1f} | {a0:.1f} | {a1 - a0:+.1f} "
              f"| {b1:.4f} | {b0:.4f} | {b1 / b0:.3f} |")


# The targets (docs/PERFORMANCE.md, "How it is measured"): the bands of N (single: rows,
# packed: sequences) and their limits.
TARGETS = (("N <= 8", lambda n: n <= 8, 1.15), ("N = 32", lambda n: n == 32, 1.08), ("N >= 128", lambda n: n >= 128, 1.05))


def target_bands(j):
    """{(op, state, band): [ratio, ...]} over the cells the targets count."""
    out = {}
    for c in ok_cells(j):
        if c["op"] == "packed" and c["tokens"] not in (2, 4):
            continue
        for name, member, _ in TARGETS:
            if member(c["count"]):
                out.setdefault((c["op"], c["state"], name), []).append(c["ratio"])
    return out


def band_text(ratios, limit):
    met = sum(r <= limit for r in ratios)
    return f"{min(ratios):.2f}-{max(ratios):.2f} ({met} of {len(ratios)} met)"


def targets(j, old=None):
    bands, was = target_bands(j), target_bands(old) if old else {}
    print(header(j))
    print()
    print("| op, state | " + " | ".join(f"{n} (target {lim:.2f})" for n, _, lim in TARGETS) + " |")
    print("|---|" + "---|" * len(TARGETS))
    for op, state in sorted({(k[0], k[1]) for k in bands}, key=lambda k: (k[0] != "single", k[1] != "f32")):
        row = []
        for name, _, lim in TARGETS:
            r = bands.get((op, state, name))
            text = band_text(r, lim) if r else "-"
            w = was.get((op, state, name))
            row.append(text + (f"; was {band_text(w, lim)}" if r and w else ""))
        print(f"| {op} {state} | " + " | ".join(row) + " |")


def against(j, old):
    """FILE's device time / OLD's per family, over the cells both ran (same op, H, N, T, dtype, layout, gate, mode)."""
    def cell_key(c):
        return tuple(c.get(k) for k in ("op", "heads", "count", "tokens", "state", "conv", "gate", "state_indices_mode"))

    before = {cell_key(c): c for c in ok_cells(old)}
    fams = {}
    for c in ok_cells(j):
        o = before.get(cell_key(c))
        if o is None:
            continue
        r = c["device_us"]["median"] / o["device_us"]["median"]
        fams.setdefault((c["op"], c["state"], ""), []).append(r)
        if c["op"] == "packed":
            fams.setdefault((c["op"], c["state"], f"T = {c['tokens']}"), []).append(r)
    print(header(j))
    print()
    print(f"device time, commit {j['commit'] or '?'} / commit {old['commit'] or '?'}, per family (cells both ran):")
    print()
    print("| op | state | T | cells | median | min | max |")
    print("|---|---|---|---|---|---|---|")
    for (op, state, t), v in sorted(fams.items(), key=lambda kv: (kv[0][0] != "single", kv[0][1] != "f32", kv[0][2])):
        print(f"| {op} | {state} | {t or 'all'} | {len(v)} | {statistics.median(v):.3f} | {min(v):.3f} | {max(v):.3f} |")


def load(path):
    """The grid of a kdajit_bench JSON, or of a run's summary (bench/summarize.py)."""
    with open(path) as f:
        j = json.load(f)
    return j["grid"] if j.get("schema") == "kdajit-bench-summary/1" else j


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--value", default="ratio", choices=["ratio", "kdajit", "floor", "host", "diff", "tuned", "pdl"])
    ap.add_argument("--route", help="the grid of this forced route (a --routes run)")
    ap.add_argument("--flat", action="store_true")
    ap.add_argument("--fit", action="store_true", help="fixed + per-MB cost per family (see above)")
    ap.add_argument("--targets", action="store_true", help="the target bands (see above)")
    ap.add_argument("--against", metavar="OLD", help="a kdajit_bench JSON to compare with (see above)")
    a = ap.parse_args(argv)
    j = load(a.file)
    old = load(a.against) if a.against else None
    for name, f in ((a.file, j), (a.against, old)):
        if f is not None and f.get("schema") != "kdajit-bench-decode/2" and (a.targets or a.against):
            ap.error(f"--targets and --against read kdajit-bench-decode/2 files; {name} is {f.get('schema')!r}")
    if a.targets:
        targets(j, old)
    elif old is not None:
        against(j, old)
    elif j.get("schema") != "kdajit-bench-decode/2":
        old_schema(j)
    elif a.flat:
        flat(j)
    elif a.fit:
        fit(j)
    else:
        grid(j, f"route:{a.route}" if a.route else a.value)


if __name__ == "__main__":
    sys.exit(main())
