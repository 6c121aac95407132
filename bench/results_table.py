#!/usr/bin/env python3
"""Prints the markdown table of docs/PERFORMANCE.md from a kdajit_bench JSON file."""
import json
import sys

j = json.load(open(sys.argv[1]))
print(f"{j['gpu']['name']}, {j['date']}, commit {j['commit']}, copy roofline {j['copy_bandwidth_gbps']:.0f} GB/s")
print()
print("| op | H | R / N | T | state | median us | floor us | GB/s | % of copy | host us/call |")
print("|---|---|---|---|---|---|---|---|---|---|")
for c in j["configs"]:
    n = c["rows"] if c["op"] == "single" else c["seqs"]
    print(f"| {c['op']} | {c['heads']} | {n} | {c['tokens']} | {c['state']} | {c['device_us']['median']:.2f} "
          f"| {c['floor_us']:.2f} | {c['effective_gbps']:.0f} | {c['pct_of_copy_bandwidth']:.1f} "
          f"| {c['host_us_per_call']['median']:.2f} |")
