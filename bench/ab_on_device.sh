#!/usr/bin/env bash
# A/B of kernel variants in one device call. Each source tree under ab/<name>/
# (a copy of the repository, e.g. `git archive <commit> | tar -x -C ab/base`;
# `ab/` is ignored, so carry it) and the working tree itself ("work") are
# built (kdajit_bench, in parallel), then timed on the same cells in ROUNDS
# rounds, the variants in a rotated order each round. Optional: ncu of
# NCU_CELLS (name, then kdajit_bench arguments, per line) on every variant,
# and SMOKE, a Catch2 test spec of the working tree's GPU tests, run first in
# SMOKE_SHARDS (default 4) parallel shards.
#
#   VARIANTS="base work" BENCH_ARGS="--op packed ..." COMMIT=abc1234 bash bench/ab_on_device.sh
#
# Files under ${OUT:-/tmp/kdajit-out} (at most eight, as a device call brings
# back): ab.json (every run, bench/ab_table.py's input), ab_table.txt (per cell
# and route, each variant's kdajit / floor and its ratio to the first
# variant), build.log, smoke.log, ncu.txt. A summary is printed last.
# Exit status: 0 only when every build, run and the smoke test passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdajit-out}
ROOT=$PWD
VARIANTS=${VARIANTS:-$(ls ab 2>/dev/null | tr '\n' ' ') work}
ROUNDS=${ROUNDS:-2}
COMMIT=${COMMIT:-unknown}
BENCH_ARGS=${BENCH_ARGS:---op packed --heads 16,64 --rows 8,32,128 --tokens 2,4 --state f32,bf16 --conv sd --routes stream,rowcta --iters 50 --no-warm --tuning off --host-calls 20}
mkdir -p "$OUT" /tmp/kdajit-ab
rc=0
summary=()
src_of() { if [ "$1" = work ]; then echo "$ROOT"; else echo "$ROOT/ab/$1"; fi; }

# 1. Builds, in parallel.
t=$(date +%s)
pids=()
for v in $VARIANTS; do
  s=$(src_of "$v")
  { cmake -S "$s" -B "/tmp/kdajit-ab/build-$v" -G Ninja -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "/tmp/kdajit-ab/build-$v" --target kdajit_bench $([ "$v" = work ] && [ -n "${SMOKE:-}" ] && echo test_gpu_decode); } \
    >"/tmp/kdajit-ab/build-$v.log" 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do wait "${pids[$i]}" || rc=1; done
for v in $VARIANTS; do { echo "## $v"; tail -5 "/tmp/kdajit-ab/build-$v.log"; } >>"$OUT/build.log"; done
summary+=("builds ($VARIANTS): rc=$rc, $(( $(date +%s) - t )) s, warnings: $(cat /tmp/kdajit-ab/build-*.log | grep -c 'warning:')")
[ $rc = 0 ] || { printf '%s\n' "${summary[@]}"; tail -30 /tmp/kdajit-ab/build-*.log; exit 1; }

# 2. Smoke test of the working tree (before any timing: a wrong kernel is not timed).
if [ -n "${SMOKE:-}" ]; then
  t=$(date +%s)
  shards=${SMOKE_SHARDS:-4}
  pids=()
  for ((i = 0; i < shards; i++)); do
    KDAJIT_CACHE_DIR=/tmp/kdajit-ab/cache-smoke /tmp/kdajit-ab/build-work/tests/gpu/test_gpu_decode "$SMOKE" \
      --shard-count "$shards" --shard-index "$i" >"/tmp/kdajit-ab/smoke-$i.log" 2>&1 &
    pids+=($!)
  done
  s=0
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || s=1; done
  cat /tmp/kdajit-ab/smoke-*.log >"$OUT/smoke.log"
  [ $s = 0 ] || rc=1
  summary+=("smoke: rc=$s, $(( $(date +%s) - t )) s, $(grep -E '^(All tests passed|test cases)' "$OUT/smoke.log" | tr '\n' ';')")
fi

# 3. Rounds; variant order rotated each round.
read -r -a vs <<<"$VARIANTS"
n=${#vs[@]}
jsons=()
t=$(date +%s)
for ((r = 1; r <= ROUNDS; r++)); do
  for ((k = 0; k < n; k++)); do
    v=${vs[$(( (k + r - 1) % n ))]}
    j=/tmp/kdajit-ab/$v-$r.json
    # shellcheck disable=SC2086  # BENCH_ARGS: kdajit_bench arguments, split on purpose
    KDAJIT_CACHE_DIR=/tmp/kdajit-ab/cache-$v "/tmp/kdajit-ab/build-$v/bench/kdajit_bench" $BENCH_ARGS \
      --json "$j" --commit "$COMMIT-$v" >>/tmp/kdajit-ab/tables.txt 2>>/tmp/kdajit-ab/run.log
    s=$?; [ $s = 0 ] || { rc=1; summary+=("bench $v round $r: rc=$s"); }
    jsons+=("$v-$r=$j")
  done
done
summary+=("bench: $ROUNDS rounds of $VARIANTS, $(( $(date +%s) - t )) s")
python3 bench/ab_table.py --out "$OUT/ab.json" --about "${ABOUT:-A/B: $VARIANTS}" --command "kdajit_bench $BENCH_ARGS" \
  "${jsons[@]}" >"$OUT/ab_table.txt" 2>>/tmp/kdajit-ab/run.log || rc=1
summary+=("$(grep -E '^(geomean|cells)' "$OUT/ab_table.txt" | tr '\n' ';')")

# 4. ncu, every variant, the selected kernel of each cell (bench/ncu_cell.sh).
if [ -n "${NCU_CELLS:-}" ]; then
  # shellcheck source=bench/ncu_cell.sh
  source bench/ncu_cell.sh
  : >"$OUT/ncu.txt"
  while read -r name args; do
    [ -n "$name" ] || continue
    for v in $VARIANTS; do
      # shellcheck disable=SC2086  # args: the cell's kdajit_bench arguments, split on purpose
      KDAJIT_CACHE_DIR=/tmp/kdajit-ab/cache-$v ncu_cell /tmp/kdajit-ab/ncu-cell.txt \
        "/tmp/kdajit-ab/build-$v/bench/kdajit_bench" $args --iters 3 --no-warm --host-calls 1 --floor-shapes cta256 \
        2>>/tmp/kdajit-ab/run.log || rc=1
      { echo "## $name $v: kdajit_bench $args"; cat /tmp/kdajit-ab/ncu-cell.txt; } >>"$OUT/ncu.txt"
      summary+=("ncu $name $v$(ncu_brief /tmp/kdajit-ab/ncu-cell.txt Duration 'DRAM Throughput' \
        'Warp Cycles Per Issued Instruction' 'Executed Instructions')")
    done
  done <<<"$NCU_CELLS"
fi
cp /tmp/kdajit-ab/run.log "$OUT/run.log" 2>/dev/null

tail -60 "$OUT/ab_table.txt"
printf '%s\n' "${summary[@]}"
exit $rc
