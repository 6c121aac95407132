#!/usr/bin/env bash
# The GPU test suite on a CUDA machine: build, the GPU tests (test_gpu_decode,
# test_gpu_prefill, then test_gpu_chunk, in each shard) in parallel shards (Catch2 3
# --shard-count), compute-sanitizer memcheck, racecheck and synccheck on the
# [sanitize] cases (every route of every op), then the README main job (prewarm +
# selfcheck). Logs under ${OUT:-/tmp/kdajit-out}; a summary is printed last.
# Exit status: 0 only when the build, every shard, every sanitizer run (no
# error reported) and the main job all passed.
# A run that must fit a time limit can take part of it: STEPS (default "gpu
# sanitize main") and SHARD_INDICES (default all of 0..SHARDS-1), e.g.
# SHARDS=16 SHARD_INDICES="$(seq 0 7)" STEPS=gpu, then the rest; GPU_BINS
# (default all three) names the test binaries that the shards and the
# sanitizers run, e.g. GPU_BINS="test_gpu_prefill test_gpu_chunk" after a
# change to the prefill template alone. CONCURRENT=1
# runs the sanitizers and the main job beside the shards instead of after
# them (each shard is one CPU-bound process: its test problems and the f64
# reference; a machine with more cores than shards has room for them). On
# the 16-core H200 machine the whole suite fits one call that way (build
# about 65 s, the 669 decode cases in about 190 s): SHARDS=16 CONCURRENT=1 bash ....
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kdajit-out}
B=${BUILD_DIR:-$PWD/build-device}
SHARDS=${SHARDS:-12}
SHARD_INDICES=${SHARD_INDICES:-$(seq 0 $((SHARDS - 1)))}
STEPS=${STEPS:-gpu sanitize main}
GPU_BINS=${GPU_BINS:-test_gpu_decode test_gpu_prefill test_gpu_chunk}
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

# The sanitizers and the main job write their summary lines here, so that they
# can run in the background (CONCURRENT=1).
SUMMARY_DIR=$(mktemp -d)

# 2. compute-sanitizer on the small cases (kernels cached by the shards, or
# compiled here when it runs beside them).
run_sanitize() {
  local src log
  local extra
  for tool in memcheck racecheck synccheck; do
    # synccheck tracks a kernel's mbarriers in a table sized from the count
    # nvcc records in the module; NVRTC's modules record none, and route
    # pipe16's six ring barriers per CTA overflow the default table ("Detected
    # overflow of tracked cuda::barrier structures", then the launch fails).
    extra=()
    [ $tool = synccheck ] && extra=(--num-cuda-barriers 4096)
    for bin in $GPU_BINS; do
      log="$OUT/sanitizer_${tool}_$bin.log"
      compute-sanitizer --tool $tool "${extra[@]}" --error-exitcode 9 "$B/tests/gpu/$bin" "[sanitize]" >"$log" 2>&1
      src=$?
      [ $src = 0 ] || echo fail >"$SUMMARY_DIR/failed"
      echo "compute-sanitizer $tool $bin: rc=$src, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)" >>"$SUMMARY_DIR/2-sanitize"
    done
  done
}

# 3. The README main job on this GPU (its own cache).
run_main() {
  local mrc vrc
  export KDAJIT_CACHE_DIR=/tmp/kdajit-main-job
  { "$B/tools/kdajit" keys --preset glm-5.3-flash && "$B/tools/kdajit" prewarm --preset glm-5.3-flash && "$B/tools/kdajit" selfcheck; } >"$OUT/main_job.log" 2>&1
  mrc=$?
  "$B/tools/kdajit" verify --load >"$OUT/verify_load.log" 2>&1
  vrc=$?
  { [ $mrc = 0 ] && [ $vrc = 0 ]; } || echo fail >"$SUMMARY_DIR/failed"
  { echo "verify --load: rc=$vrc, $(tail -1 "$OUT/verify_load.log")"
    echo "main job: rc=$mrc, $(grep -E '^selfcheck:|compiled .* already cached' "$OUT/main_job.log" | tail -2 | tr '\n' ' ')"; } >>"$SUMMARY_DIR/3-main"
}

bg=()
if [ "${CONCURRENT:-0}" = 1 ]; then
  if step sanitize; then run_sanitize & bg+=($!); fi
  if step main; then run_main & bg+=($!); fi
fi

# 1. GPU tests, sharded.
if step gpu; then
t1=$(date +%s)
pids=()
for i in $SHARD_INDICES; do
  { src=0
    for bin in $GPU_BINS; do
      "$B/tests/gpu/$bin" --shard-count "$SHARDS" --shard-index "$i" || src=1
    done
    exit $src; } >"$OUT/gpu_shard_$i.log" 2>&1 &
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

if [ "${CONCURRENT:-0}" != 1 ]; then
  if step sanitize; then run_sanitize; fi
  if step main; then run_main; fi
fi
for pid in "${bg[@]}"; do wait "$pid"; done
for f in "$SUMMARY_DIR"/2-sanitize "$SUMMARY_DIR"/3-main; do
  [ -f "$f" ] && while IFS= read -r line; do summary+=("$line"); done <"$f"
done
[ -f "$SUMMARY_DIR/failed" ] && rc=1
rm -rf "$SUMMARY_DIR"

printf '%s\n' "${summary[@]}"
exit $rc
