#!/usr/bin/env bash
# The Python package on a CUDA machine, in one command:
#   bash tests/python/run_on_device.sh
# builds, runs every tests/python test (CPU and GPU, label python) with the
# interpreter $KDAJIT_PYTHON (default: python3 on PATH, the one with torch),
# the example's --check and --bench, and the host-cost measurement
# (tests/python/host_cost.py). Logs under ${OUT:-/tmp/kdajit-python-out}; a summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/kdajit-python-out}
B=${BUILD_DIR:-$PWD/build-device}
PY=${KDAJIT_PYTHON:-$(command -v python3)}
mkdir -p "$OUT"
summary=("python: $PY ($("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1))")
t0=$(date +%s)
if ! { cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKDAJIT_PYTHON="$PY" && cmake --build "$B"; } \
    >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
summary+=("build: $(( $(date +%s) - t0 )) s, warnings: $(grep -c 'warning:' "$OUT/build.log")")
export KDAJIT_CACHE_DIR=${KDAJIT_CACHE_DIR:-/tmp/kdajit-python-cache}

# 1. Every Python test (the GPU ones use a fresh cache dir of their own).
ctest --test-dir "$B" -L python --output-on-failure -j 4 >"$OUT/ctest.log" 2>&1
rc=$?
summary+=("ctest -L python: rc=$rc, $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)")
summary+=("$(grep -E '^ *[0-9]+/[0-9]+ Test' "$OUT/ctest.log" | sed -E 's/ +/ /g' | tr '\n' ';')")

# 2. The example, on its own (also a CTest test above) and its benchmark.
env PYTHONPATH="$PWD/python" KDAJIT_LIBRARY="$B/runtime/libkdajit.so" \
  "$PY" examples/vllm_kda_layer.py --check >"$OUT/example_check.log" 2>&1
erc=$?
summary+=("example --check: rc=$erc, $(tail -1 "$OUT/example_check.log")")
env PYTHONPATH="$PWD/python" KDAJIT_LIBRARY="$B/runtime/libkdajit.so" \
  "$PY" examples/vllm_kda_layer.py --bench >"$OUT/example_bench.log" 2>&1
summary+=("example --bench: rc=$?; $(tail -2 "$OUT/example_bench.log" | tr '\n' ';')")

# 3. Host cost of an eager call from Python (target <= 15 us median).
env PYTHONPATH="$PWD/python" KDAJIT_LIBRARY="$B/runtime/libkdajit.so" \
  "$PY" tests/python/host_cost.py --json "$OUT/host_cost.json" >"$OUT/host_cost.log" 2>&1
summary+=("host cost: rc=$?; $(tail -1 "$OUT/host_cost.log")")

cat "$OUT/host_cost.log"
printf '%s\n' "${summary[@]}"
[ $rc = 0 ] && [ $erc = 0 ]
