#!/usr/bin/env bash
# The GPU test suite on a CUDA machine: build, the GPU tests in parallel shards
# (Catch2 3 --shard-count), compute-sanitizer memcheck, racecheck and synccheck
# on the [sanitize] cases (every route), then the README main job (prewarm +
# selfcheck). Logs under ${OUT:-/tmp/kdajit-out}; a summary is printed last.
# Exit status: 0 only when the build, every shard, every sanitizer run (no
# error reported) and the main job all passed.
# A run that must fit a time limit can take part of it: STEPS (default "gpu
# sanitize main") and SHARD_INDICES (default all of 0..SHARDS-1), e.g.
# SHARDS=16 SHARD_INDICES="$(seq 0 7)" STEPS=gpu, then the rest.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kdajit-out}
B=${BUILD_DIR:-$PWD/build-device}
SHARDS=${SHARDS:-12}
SHARD_INDICES=${SHARD_INDICES:-$(seq 0 $((SHARDS - 1)))}
STEPS=${STEPS:-gpu sanitize main}
step() { [[ " $STEPS " == *" $1 "* ]]; }
rc=0
mkdir -p "$OUT"
summary=()
t0=$(date +%s)
if ! { cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build "$B"; } >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
summary+=("build: $(( $(date +%s) - t0 )) s, warnings: $(grep -c 'warning:' "$OUT/build.log")")
export KDAJIT_CACHE_DIR=${KDAJIT_CACHE_DIR:-/tmp/kdajit-gpu-cache}

# 1. GPU tests, sharded.
if step gpu; then
t1=$(date +%s)
pids=()
for i in $SHARD_INDICES; do
  "$B/tests/gpu/test_gpu_decode" --shard-count "$SHARDS" --shard-index "$i" >"$OUT/gpu_shard_$i.log" 2>&1 &
  pids+=($!)
done
grc=0
for i in "${!pids[@]}"; do wait "${pids[$i]}" || grc=1; done
cat "$OUT"/gpu_shard_*.log > "$OUT/gpu.log"; rm -f "$OUT"/gpu_shard_*.log
if [ $grc != 0 ]; then rc=1; grep -E -A14 "FAILED" "$OUT/gpu.log" | head -100; fi
cases=$(grep -E "^(test cases|All tests passed)" "$OUT/gpu.log" | grep -oE "[0-9]+ test cases|test cases: +[0-9]+" | grep -oE "[0-9]+" | awk "{s+=\$1} END {print s}")
summary+=("gpu tests: rc=$grc, $cases test cases in shards $(echo $SHARD_INDICES | tr '\n' ' ')of $SHARDS, $(( $(date +%s) - t1 )) s")
summary+=("$(grep -E '^(test cases|All tests passed)' "$OUT/gpu.log" | sort | uniq -c | tr '\n' ';')")
fi

# 2. compute-sanitizer on the small cases (kernels already cached above).
if step sanitize; then
for tool in memcheck racecheck synccheck; do
  compute-sanitizer --tool $tool --error-exitcode 9 "$B/tests/gpu/test_gpu_decode" "[sanitize]" >"$OUT/sanitizer_$tool.log" 2>&1
  src=$?
  [ $src = 0 ] || rc=1
  summary+=("compute-sanitizer $tool: rc=$src, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.log" | tail -1)")
done
fi

# 3. The README main job on this GPU.
if step main; then
export KDAJIT_CACHE_DIR=/tmp/kdajit-main-job
{ "$B/tools/kdajit" keys --preset glm-5.3-flash && "$B/tools/kdajit" prewarm --preset glm-5.3-flash && "$B/tools/kdajit" selfcheck; } >"$OUT/main_job.log" 2>&1
mrc=$?
[ $mrc = 0 ] || rc=1
"$B/tools/kdajit" verify --load >"$OUT/verify_load.log" 2>&1
vrc=$?
[ $vrc = 0 ] || rc=1
summary+=("verify --load: rc=$vrc, $(tail -1 "$OUT/verify_load.log")")
summary+=("main job: rc=$mrc, $(grep -E '^selfcheck:|compiled .* already cached' "$OUT/main_job.log" | tail -2 | tr '\n' ' ')")
fi

printf '%s\n' "${summary[@]}"
exit $rc
