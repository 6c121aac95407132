#!/usr/bin/env bash
# The benchmark run of docs/PERFORMANCE.md on a CUDA machine, in one call:
# build, `kdajit tune` (the route table the tuned column uses), the full
# `kdajit_bench` grid (every route forced, tuned and untuned, PDL, host cost),
# `kdajit verify --load` of that cache, and the two Triton peer benchmarks
# (each with its float64 reference check). Logs and JSON under
# ${OUT:-/tmp/kdajit-out}: at most eight files (a device call brings back no
# more): build.log, run.log (every step's stderr), tune.json, grid.json,
# tables.txt (the grid's and the peers' tables), peers_single.json,
# peers_packed.json, ncu.txt; a summary is printed last. (The GPU test suite
# is tests/gpu/run_on_device.sh.)
#
#   COMMIT=abc1234 bash bench/run_on_device.sh
#
# COMMIT is recorded in the JSON (default: git rev-parse, which a copied tree
# may not have right). STEPS (default "tune grid verify peers") runs a part;
# "ncu" (not a default) profiles the selected kernel of the cells in NCU_CELLS
# (name and kdajit_bench arguments per line; default: one cell per missed
# target family of docs/PERFORMANCE.md) into ncu.txt, the eighth file.
# "prefill" (not a default) runs the prefill grid (`kdajit_bench --op prefill
# --routes all`, PREFILL_ARGS replacing those two arguments, under a 240 s time
# limit) into prefill_grid.json, its tables appended to tables.txt; with
# both ncu and prefill a run writes nine files, one more than come back: run
# them in two calls. STEPS=prefill alone builds and runs only that (the
# bench's estimate for the default grid: under a minute of GPU work, plus the
# build and the prefill keys' compiles).
# Exit status: 0 only when every step that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdajit-out}
B=${BUILD_DIR:-$PWD/build-device}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
STEPS=${STEPS:-tune grid verify peers}
step() { [[ " $STEPS " == *" $1 "* ]]; }
export KDAJIT_CACHE_DIR=${KDAJIT_CACHE_DIR:-/tmp/kdajit-bench-cache}
mkdir -p "$OUT"
: >"$OUT/run.log"
rc=0
summary=()
t0=$(date +%s)
if ! { cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build "$B"; } >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
summary+=("build: $(( $(date +%s) - t0 )) s, warnings: $(grep -c 'warning:' "$OUT/build.log")")

# 1. The route table of this GPU (JSON: the table and every route's median).
if step tune; then
  t=$(date +%s)
  "$B/tools/kdajit" tune --preset glm-5.3-flash --reps 5 --json >"$OUT/tune.json" 2>>"$OUT/run.log"
  s=$?; [ $s = 0 ] || rc=1
  summary+=("tune: rc=$s, $(( $(date +%s) - t )) s")
  if [ -f "$B/runtime/libkdajit.so" ]; then
    summary+=("tune vs built-in bands: $(KDAJIT_LIBRARY=$B/runtime/libkdajit.so PYTHONPATH=python \
      python3 bench/tune_vs_selector.py "$OUT/tune.json" --cli "$B/tools/kdajit" 2>&1 | grep -E '^all:' | head -1)")
  fi
fi

# 2. The grid, on the same cache (so the tuned column reads the table above).
if step grid; then
  t=$(date +%s)
  "$B/bench/kdajit_bench" --routes all --tuning both --pdl --iters 50 --host-calls 200 \
    --json "$OUT/grid.json" --commit "$COMMIT" >"$OUT/tables.txt" 2>>"$OUT/run.log"
  s=$?; [ $s = 0 ] || rc=1
  summary+=("grid: rc=$s, $(( $(date +%s) - t )) s, $(grep -c '' "$OUT/tables.txt") table lines")
fi

# 2b. The prefill grid (bench/README.md, "The prefill grid"), on the same cache.
if step prefill; then
  t=$(date +%s)
  # shellcheck disable=SC2086  # PREFILL_ARGS: arguments, split on purpose
  "$B/bench/kdajit_bench" --op prefill ${PREFILL_ARGS:---routes all} --time-limit 240 \
    --json "$OUT/prefill_grid.json" --commit "$COMMIT" >>"$OUT/tables.txt" 2>>"$OUT/run.log"
  s=$?; [ $s = 0 ] || rc=1
  summary+=("prefill grid: rc=$s, $(( $(date +%s) - t )) s, $(grep -c '^\[[0-9]*/[0-9]*\] prefill ' "$OUT/run.log") cells logged")
fi

# 3. Every cached cubin re-hashed and loaded on this GPU.
if step verify; then
  "$B/tools/kdajit" verify --load >/tmp/kdajit-verify.log 2>&1
  s=$?; [ $s = 0 ] || rc=1
  cat /tmp/kdajit-verify.log >>"$OUT/run.log"
  summary+=("verify --load: rc=$s, $(tail -1 /tmp/kdajit-verify.log)")
fi

# 4. The Triton peers (exit 0: measured, and both implementations match the
# float64 reference and each other).
if step peers; then
  export PYTHONUNBUFFERED=1
  REF="$B/tools/reference/libkdajit_reference_shim.so"  # the float64 reference of the reference checks
  python3 bench/peers/bench_triton_peer.py --lib "$B/runtime/libkdajit.so" --reference-lib "$REF" --heads 16,64 \
    --rows 8,32,128,512 --reps 30 --time-limit 60 --watchdog 80 --json "$OUT/peers_single.json" \
    >>"$OUT/tables.txt" 2>>"$OUT/run.log"
  s=$?; [ $s = 0 ] || rc=1
  summary+=("peer single: rc=$s")
  python3 bench/peers/bench_triton_packed.py --lib "$B/runtime/libkdajit.so" --reference-lib "$REF" --heads 16,64 \
    --seqs 1,8,32,128 --tokens 2,4 --reps 30 --host-calls 100 --time-limit 80 --watchdog 100 \
    --json "$OUT/peers_packed.json" >>"$OUT/tables.txt" 2>>"$OUT/run.log"
  s=$?; [ $s = 0 ] || rc=1
  summary+=("peer packed: rc=$s; reference checks of both: $(grep -cE '^  reference .* ok ' "$OUT/run.log") ok, $(grep -cE '^  reference .* FAIL' "$OUT/run.log") failed")
fi

# 5. ncu on the selected kernel of a few cells (bench/ncu_cell.sh). One CSV
# block per cell in ncu.txt.
# shellcheck source=bench/ncu_cell.sh
source bench/ncu_cell.sh
NCU_CELLS=${NCU_CELLS:-"packed_bf16_t2_h64_n128 --op packed --heads 64 --rows 128 --tokens 2 --state bf16 --conv sd
single_bf16_h64_n32 --op single --heads 64 --rows 32 --state bf16 --conv sd
packed_f32_t8_h64_n1 --op packed --heads 64 --rows 1 --tokens 8 --state f32 --conv sd"}
if step ncu; then
  : >"$OUT/ncu.txt"
  while read -r name args; do
    [ -n "$name" ] || continue
    # shellcheck disable=SC2086  # args: the cell's kdajit_bench arguments, split on purpose
    ncu_cell /tmp/kdajit-ncu-cell.txt "$B/bench/kdajit_bench" $args --routes selector --iters 3 --no-warm \
      --host-calls 1 --floor-shapes cta256 2>>"$OUT/run.log"
    s=$?; [ $s = 0 ] || rc=1
    { echo "## $name: kdajit_bench $args"; cat /tmp/kdajit-ncu-cell.txt; } >>"$OUT/ncu.txt"
    summary+=("ncu $name: rc=$s$(ncu_brief /tmp/kdajit-ncu-cell.txt Duration 'DRAM Throughput' \
      'Compute \(SM\) Throughput' 'Warp Cycles Per Issued Instruction' 'Registers Per Thread' 'Achieved Occupancy')")
  done <<<"$NCU_CELLS"
fi

printf '%s\n' "${summary[@]}"
exit $rc
