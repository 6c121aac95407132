#!/usr/bin/env bash
# Cold start: per-key compile time and phases, prewarm wall time of a preset
# (every route; one GPU's routes), and warm hits (disk, memory).
#   bench/coldstart.sh [BUILD_DIR] [OUT_DIR]
# BUILD_DIR: default build. OUT_DIR: default /tmp/kdajit-coldstart-<UTC time>;
# raw JSON goes there (outside the tree), a summary to stdout.
# Env: PRESET (glm-5.3-flash), SMS (132: the H200), JOBS (2), KEYS (16 keys
# for the per-key figures, every route and op), ARCH (sm_90).
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-/tmp/kdajit-coldstart-$(date -u +%Y%m%dT%H%M%SZ)}
PRESET=${PRESET:-glm-5.3-flash}
SMS=${SMS:-132}
JOBS=${JOBS:-2}
ARCH=${ARCH:-sm_90}
KDAJIT="$BUILD/tools/kdajit"
mkdir -p "$OUT"
export KDAJIT_ARCH=$ARCH
unset KDAJIT_CACHE_DIR

# Per key, one compile at a time: the H64 and H8 families of both ops, every route.
mapfile -t KEYS < <("$KDAJIT" keys --preset "$PRESET" | grep -E '\.h(64|8)\.state_(f32\.conv_sd\.t1|bf16\.conv_ds\.t4|f32\.conv_sd\.t2)\.' | head -n "${KEYS:-16}")
"$KDAJIT" compile -j1 --json "${KEYS[@]}" > "$OUT/compile.json"

# prewarm into fresh roots: every route, then one GPU's routes, then the warm rerun.
"$KDAJIT" prewarm --preset "$PRESET" -j "$JOBS" --json --cache-dir "$OUT/cache_all" > "$OUT/prewarm_all.json"
"$KDAJIT" prewarm --preset "$PRESET" -j "$JOBS" --json --sm-count "$SMS" --cache-dir "$OUT/cache_gpu" > "$OUT/prewarm_gpu.json"
"$KDAJIT" prewarm --preset "$PRESET" -j "$JOBS" --json --cache-dir "$OUT/cache_all" > "$OUT/prewarm_warm.json"
du -sb "$OUT/cache_all" "$OUT/cache_gpu" > "$OUT/cache_bytes.txt"

# Warm hits from disk and memory (bench_cache: cold compile, disk hit, memory hit per key).
if [ -x "$BUILD/bench/kdajit_bench_cache" ]; then
  "$BUILD/bench/kdajit_bench_cache" --keys 8 --json "$OUT/bench_cache.json" > "$OUT/bench_cache.txt"
fi

python3 - "$OUT" <<'PY'
import json, statistics, sys, os
out = sys.argv[1]
c = json.load(open(f"{out}/compile.json"))
rows = [r for r in c["results"] if "ms" in r]
def stat(f):
    v = [f(r) for r in rows if f(r) is not None]
    return statistics.median(v), max(v)
ph = lambda k: (lambda r: r["phases"].get(k))
print(f"compile, {len(rows)} keys, -j1: wall median {stat(lambda r: r['ms'])[0]:.0f} ms, max {stat(lambda r: r['ms'])[1]:.0f} ms; "
      f"CPU median {stat(ph('cpu_ms'))[0]:.0f} ms, max {stat(ph('cpu_ms'))[1]:.0f} ms")
print("  phases (median ms): front end {:.0f}, NVVM {:.0f}, ptxas {:.0f}; source {:.0f} KB".format(
    stat(ph("frontend_ms"))[0], stat(ph("nvvm_ms"))[0], stat(ph("ptxas_ms"))[0], stat(ph("source_bytes"))[0] / 1024))
for name in ("prewarm_all", "prewarm_gpu", "prewarm_warm"):
    p = json.load(open(f"{out}/{name}.json"))
    ms = [r["ms"] for r in p["results"] if r["status"] == "compiled"]
    extra = f", per compiled key median {statistics.median(ms):.0f} ms, max {max(ms):.0f} ms" if ms else ""
    print(f"{name}: {p['keys']} keys, {p['compiled']} compiled, {p['cached']} cached, wall {p['wall_s']:.1f} s{extra}")
print(open(f"{out}/cache_bytes.txt").read().strip())
if os.path.exists(f"{out}/bench_cache.txt"):
    print(open(f"{out}/bench_cache.txt").read().strip().splitlines()[-1])
print(f"raw results: {out}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
PY
