#!/usr/bin/env bash
# kdajit's prefill against FLA's chunk_kda on a CUDA machine, in one call
# (bench/bench_prefill.py: kdajit's fused prefill and kdajit.chunk_kda with
# the selector's route and every route forced, FLA bare, FLA inside an
# engine's torch ops, the memory and tensor-core floors, the check of kdajit
# against the FLA engine and of kdajit.chunk_kda against FLA bare):
#
#   bash bench/run_prefill_on_device.sh [more bench_prefill.py arguments]
#
# Builds libkdajit.so (what the Python package loads; the package runs on its
# pure-Python call path when kdajit._hotpath is not beside it), then runs the
# benchmark with python/ of this tree. The FLA package must be built first,
# on the host, into the ignored .peers/ that the device call carries
# (carry: [".peers"]):
#
#   bash ../shared/peers/fla_chunk_kda/make.sh /work/.mirror/fla-org+flash-linear-attention/repo .peers/fla
#
# or FLA_CLONE names a clone to build it from here (with FLA_MAKE, else
# shared/peers/fla_chunk_kda/make.sh or ../shared/...). FLA: the folder that
# holds fla/ (default .peers). BENCH_ARGS: the benchmark's own arguments
# (default --routes; set but empty: none), before the ones given here.
# BENCH_TIMEOUT (default 480 s): the run is stopped after it, and the table of
# what was measured is printed from the JSON, which the benchmark rewrites
# after every cell (the forced routes are measured last, after every cell's
# main figures: bench/README.md has the calls per cell).
# Logs under ${OUT:-/tmp/kdajit-prefill-out}: build.log, prefill.log (progress,
# stderr), prefill.json (every number), table.txt; a summary, then the table last.
# Exit status: the benchmark's (0: every cell measured, every check passed).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/kdajit-prefill-out}
B=${BUILD_DIR:-$PWD/build-device}
PY=${KDAJIT_PYTHON:-$(command -v python3)}
FLA=${FLA:-.peers}
BENCH_ARGS=${BENCH_ARGS---routes}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-480}
mkdir -p "$OUT"
summary=("python: $PY ($("$PY" -c 'import sys, torch, triton; print(sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tail -1))")

# 1. The FLA package.
if [ ! -f "$FLA/fla/UPSTREAM_COMMIT" ]; then
  make_sh=${FLA_MAKE:-}
  for m in shared/peers/fla_chunk_kda/make.sh ../shared/peers/fla_chunk_kda/make.sh; do
    [ -n "$make_sh" ] || { [ -f "$m" ] && make_sh=$m; }
  done
  if [ -z "${FLA_CLONE:-}" ] || [ -z "$make_sh" ]; then
    echo "run_prefill_on_device.sh: no FLA package ($FLA/fla/UPSTREAM_COMMIT is missing): build it on the host" \
         "into .peers/fla and carry .peers, or set FLA_CLONE (and FLA_MAKE)" >&2
    exit 2
  fi
  if ! bash "$make_sh" "$FLA_CLONE" "$FLA/fla" >"$OUT/fla_build.log" 2>&1; then
    tail -20 "$OUT/fla_build.log"; exit 2
  fi
fi
summary+=("fla: $FLA/fla at $(cat "$FLA/fla/UPSTREAM_COMMIT")")

# 2. libkdajit.so.
t0=$(date +%s)
if ! { cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKDAJIT_PYTHON="$PY" &&
       cmake --build "$B" --target kdajit; } >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
summary+=("build: $(( $(date +%s) - t0 )) s, warnings: $(grep -c 'warning:' "$OUT/build.log")")
export KDAJIT_CACHE_DIR=${KDAJIT_CACHE_DIR:-/tmp/kdajit-prefill-cache}

# 3. The benchmark. The table goes to table.txt (stdout), progress to prefill.log.
t0=$(date +%s)
# shellcheck disable=SC2086  # BENCH_ARGS: arguments, split on purpose
timeout --signal=KILL "$BENCH_TIMEOUT" env PYTHONPATH="$PWD/python" PYTHONUNBUFFERED=1 \
  "$PY" bench/bench_prefill.py --fla "$FLA" --lib "$B/runtime/libkdajit.so" --json "$OUT/prefill.json" \
  $BENCH_ARGS "$@" >"$OUT/table.txt" 2>"$OUT/prefill.log"
rc=$?
if [ $rc = 137 ] && [ -f "$OUT/prefill.json" ]; then
  summary+=("bench_prefill: stopped after $BENCH_TIMEOUT s; the table below is what was measured")
  "$PY" bench/bench_prefill.py --tables "$OUT/prefill.json" >"$OUT/table.txt" 2>>"$OUT/prefill.log"
fi
ok=$(grep -c '^check .*: ok:' "$OUT/table.txt")
not_ok=$(grep -cE '^check .*: (MISMATCH|error):' "$OUT/table.txt")
chunk_ok=$(grep -c '^check chunk .*: ok:' "$OUT/table.txt")
summary+=("bench_prefill: rc=$rc, $(( $(date +%s) - t0 )) s; checks: $ok ok ($chunk_ok of them chunk_kda vs FLA), $not_ok not ok")
summary+=("last progress lines: $(grep -v '^  check' "$OUT/prefill.log" | tail -3 | tr '\n' ';')")
printf '%s\n' "${summary[@]}"
cat "$OUT/table.txt"
exit $rc
