# Sourced by bench/run_on_device.sh and bench/ab_on_device.sh: one ncu profile
# of a kdajit_bench cell, and a one-line brief of it.
#
# ncu_cell CSV BENCH ARGS...: profiles the first kdajit launch (kernel name
# kda_*) of `BENCH ARGS...` with ncu (clocks as they are; ncu flushes the
# caches before it) and writes its CSV details page to CSV: SpeedOfLight,
# LaunchStats, Occupancy, WarpStateStats, SourceCounters, InstructionStats.
# Returns ncu's exit status; its stderr goes to the caller's.
ncu_cell() {
  local csv=$1
  shift
  ncu --clock-control none --kernel-name regex:^kda_ --launch-count 1 --csv --page details \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section SourceCounters --section InstructionStats "$@" >"$csv"
}

# ncu_brief CSV METRIC...: ", NAME VALUE" for each named metric of the details
# page (columns 13: name, 15: value), in the page's order. A METRIC is a
# regex alternative, e.g. 'Compute \(SM\) Throughput'.
ncu_brief() {
  local csv=$1 names
  shift
  names=$(IFS='|'; echo "$*")
  grep -E "\"($names)\"" "$csv" | awk -F'","' '{gsub(/"|,$/, "", $15); printf ", %s %s", $13, $15}'
}

# ncu_source DIR NAME BENCH ARGS...: profiles the first kdajit launch of
# `BENCH ARGS...` with the sampling sections (SourceCounters, WarpStateStats,
# SchedulerStats, plus SpeedOfLight and InstructionStats) into DIR/NAME.ncu-rep
# and exports from it DIR/NAME.source.csv (the source page: one row per SASS
# instruction with its executed count and stall samples per reason; read it
# with bench/ncu_stalls.py) and DIR/NAME.details.csv. Returns ncu's status.
ncu_source() {
  local dir=$1 name=$2 s
  shift 2
  ncu --clock-control none --kernel-name regex:^kda_ --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters \
    --section InstructionStats -f -o "$dir/$name" "$@" >"$dir/$name.log" 2>&1
  s=$?
  [ $s = 0 ] || return $s
  ncu -i "$dir/$name.ncu-rep" --page source --csv --print-source sass >"$dir/$name.source.csv" 2>>"$dir/$name.log" ||
    ncu -i "$dir/$name.ncu-rep" --page source --csv >"$dir/$name.source.csv" 2>>"$dir/$name.log"
  s=$?
  ncu -i "$dir/$name.ncu-rep" --page details --csv >"$dir/$name.details.csv" 2>>"$dir/$name.log"
  return $s
}
