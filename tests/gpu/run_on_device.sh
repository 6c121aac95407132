#!/usr/bin/env bash
# The GPU test suite on a CUDA machine: build, the GPU tests in parallel shards
# (Catch2 3 --shard-count), compute-sanitizer memcheck, racecheck and synccheck
# on the [sanitize] cases (every route), then the README main job (prewarm +
# selfcheck). Logs under ${OUT:-/tmp/kdajit-out}; a summary is printed last.
# Exit status: 0 only when the build, every shard, every sanitizer run (no
# error reported) and the main job all passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kdajit-out}
B=${BUILD_DIR:-$PWD/build-device}
SHARDS=${SHARDS:-12}
mkdir -p "$OUT"
summary=()
t0=$(date +%s)
if ! { cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build "$B"; } >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
summary+=("build: $(( $(date +%s) - t0 )) s, warnings: $(grep -c 'warning:' "$OUT/build.log")")
export KDAJIT_CACHE_DIR=${KDAJIT_CACHE_DIR:-/tmp/kdajit-gpu-cache}

# 1. GPU tests, sharded.
t1=$(date +%s)
pids=()
for i in $(seq 0 $((SHARDS - 1))); do
  "$B/tests/gpu/test_gpu_decode" --shard-count "$SHARDS" --shard-index "$i" >"$OUT/gpu_shard_$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for i in "${!pids[@]}"; do wait "${pids[$i]}" || rc=1; done
cat "$OUT"/gpu_shard_*.log > "$OUT/gpu.log"; rm -f "$OUT"/gpu_shard_*.log
if [ $rc != 0 ]; then grep -E -A14 "FAILED" "$OUT/gpu.log" | head -100; fi
cases=$(grep -E "^(test cases|All tests passed)" "$OUT/gpu.log" | grep -oE "[0-9]+ test cases|test cases: +[0-9]+" | grep -oE "[0-9]+" | awk "{s+=\$1} END {print s}")
summary+=("gpu tests: rc=$rc, $cases test cases in $SHARDS shards, $(( $(date +%s) - t1 )) s")
summary+=("$(grep -E '^(test cases|All tests passed)' "$OUT/gpu.log" | sort | uniq -c | tr '\n' ';')")

# 2. compute-sanitizer on the small cases (kernels already cached above).
for tool in memcheck racecheck synccheck; do
  compute-sanitizer --tool $tool --error-exitcode 9 "$B/tests/gpu/test_gpu_decode" "[sanitize]" >"$OUT/sanitizer_$tool.log" 2>&1
  src=$?
  [ $src = 0 ] || rc=1
  summary+=("compute-sanitizer $tool: rc=$src, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)")
done

# 3. The README main job on this GPU.
export KDAJIT_CACHE_DIR=/tmp/kdajit-main-job
{ "$B/tools/kdajit" keys --preset glm-5.3-flash && "$B/tools/kdajit" prewarm --preset glm-5.3-flash && "$B/tools/kdajit" selfcheck; } >"$OUT/main_job.log" 2>&1
mrc=$?
[ $mrc = 0 ] || rc=1
"$B/tools/kdajit" verify --load >"$OUT/verify_load.log" 2>&1
vrc=$?
[ $vrc = 0 ] || rc=1
summary+=("verify --load: rc=$vrc, $(tail -1 "$OUT/verify_load.log")")
summary+=("main job: rc=$mrc, $(grep -E '^selfcheck:|compiled .* already cached' "$OUT/main_job.log" | tail -2 | tr '\n' ' ')")

printf '%s\n' "${summary[@]}"
exit $rc
