#!/usr/bin/env bash
# The GPU test suite on a CUDA machine: build, then the GPU tests in parallel
# shards (Catch2 3 --shard-count), logs under ${OUT:-/tmp/kdajit-out}.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kdajit-out}
B=${BUILD_DIR:-/tmp/b}
SHARDS=${SHARDS:-8}
mkdir -p "$OUT"
t0=$(date +%s)
if ! { cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build "$B"; } >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"
export KDAJIT_CACHE_DIR=${KDAJIT_CACHE_DIR:-/tmp/kdajit-gpu-cache}
t1=$(date +%s)
pids=()
for i in $(seq 0 $((SHARDS - 1))); do
  "$B/tests/gpu/test_gpu_decode" --shard-count "$SHARDS" --shard-index "$i" "$@" >"$OUT/gpu_shard_$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for i in "${!pids[@]}"; do wait "${pids[$i]}" || rc=1; done
cat "$OUT"/gpu_shard_*.log > "$OUT/gpu.log"
rm -f "$OUT"/gpu_shard_*.log
echo "gpu tests: $(( $(date +%s) - t1 )) s, rc=$rc"
if [ $rc != 0 ]; then grep -E -A14 "FAILED|REQUIRE|CHECK\(" "$OUT/gpu.log" | head -120; fi
grep -E "^(test cases|All tests passed)" "$OUT/gpu.log"
exit $rc
