#!/usr/bin/env bash
# Where the selected kernel of a few cells waits, in one device call: builds
# kdajit_bench, records each cell's first kdajit launch with ncu's sampling
# sections (bench/ncu_cell.sh ncu_source) and reads each source page with
# bench/ncu_stalls.py (stall samples and executed instructions per SASS
# stretch). PROFILE_CELLS has one cell per line: a name, the warp items that
# divide the executed counts (items x warps per CTA, 1 for totals), then the
# kdajit_bench arguments.
#
#   PROFILE_CELLS="packed_f32_h16_n1_t4 8 --op packed --heads 16 --rows 1 --tokens 4 --state f32 --conv sd" \
#     bash bench/profile_on_device.sh
#
# Files under ${OUT:-/tmp/kdajit-out}: stalls.txt (every cell's ncu_stalls
# report), profiles.tar.gz (each cell's source and details CSVs, for reading
# the SASS again without a GPU), build.log. With BUILD_DIR set to an existing
# build, nothing is rebuilt. A summary (duration, executed instructions per
# cell) is printed last. Exit status: 0 when the build and every profile passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdajit-out}
B=${BUILD_DIR:-$PWD/build-device}
DIR=${PROFILE_DIR:-/tmp/kdajit-profile}
mkdir -p "$OUT" "$DIR"
rc=0
summary=()
t=$(date +%s)
if ! { cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build "$B" --target kdajit_bench; } \
  >"$OUT/build.log" 2>&1; then
  tail -30 "$OUT/build.log"
  exit 1
fi
summary+=("build: $(($(date +%s) - t)) s")
# shellcheck source=bench/ncu_cell.sh
source bench/ncu_cell.sh
: >"$OUT/stalls.txt"
while read -r name items args; do
  [ -n "$name" ] || continue
  t=$(date +%s)
  # shellcheck disable=SC2086  # args: the cell's kdajit_bench arguments, split on purpose
  KDAJIT_CACHE_DIR=/tmp/kdajit-profile-cache ncu_source "$DIR" "$name" "$B/bench/kdajit_bench" $args \
    --routes selector --iters 3 --no-warm --host-calls 1 --floor-shapes cta256
  s=$?
  if [ $s != 0 ]; then
    rc=1
    summary+=("$name: ncu rc=$s ($(tail -1 "$DIR/$name.log"))")
    continue
  fi
  { echo "## $name: kdajit_bench $args"; python3 bench/ncu_stalls.py "$DIR/$name.source.csv" --per-item "$items"; echo; } \
    >>"$OUT/stalls.txt" 2>&1 || rc=1
  summary+=("$name: $(($(date +%s) - t)) s$(ncu_brief "$DIR/$name.details.csv" Duration 'Elapsed Cycles' \
    'DRAM Throughput' 'Executed Instructions' 'Registers Per Thread')")
done <<<"${PROFILE_CELLS:?PROFILE_CELLS: one line per cell: name, warp items, kdajit_bench arguments}"
tar -czf "$OUT/profiles.tar.gz" -C "$DIR" $(cd "$DIR" && ls ./*.csv 2>/dev/null) || rc=1
printf '%s\n' "${summary[@]}"
exit $rc
