#!/usr/bin/env bash
# A small prefill grid through kdajit_bench on the GPU (every route forced, a
# few replays): the run's path end to end, its exit status 0 only when every
# cell and route was measured. Exit 77 (CTest: skipped) where kdajit_bench
# finds no CUDA device.
#   bash tests/bench/run_prefill_smoke.sh build/bench/kdajit_bench
set -uo pipefail
bench=$1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$bench" --op prefill --shapes 2x192,mix3 --heads 16 --routes all --iters 3 --copy-mib 256 \
  --time-limit 300 --json "$out/prefill.json" >"$out/stdout" 2>"$out/stderr"
rc=$?
if [ $rc = 2 ] && grep -qE 'no (usable )?CUDA device' "$out/stderr"; then
  echo "SKIPPED: $(head -1 "$out/stderr")"
  exit 77
fi
cat "$out/stderr" "$out/stdout"
[ $rc = 0 ] || exit $rc
grep -q '"schema": "kdajit-bench-prefill-grid/1"' "$out/prefill.json" || { echo "no prefill JSON"; exit 1; }
