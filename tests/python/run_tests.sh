#!/usr/bin/env bash
# Runs one Python test module of tests/python (or, with --script, any Python
# script) with an interpreter that has torch. CTest calls it (tests/python/
# CMakeLists.txt); by hand:
#   KDAJIT_TEST_LIBRARY=build/runtime/libkdajit.so tests/python/run_tests.sh test_mapping
#
# The interpreter: $KDAJIT_PYTHON_CMAKE (the CMake cache variable KDAJIT_PYTHON),
# else $KDAJIT_PYTHON, else the first of /usr/bin/python3, python3 that can
# import torch. An interpreter named explicitly must have torch; when none of
# the defaults has it the test exits 77 (CTest: skipped), loudly.
#   --gpu      exit 77 unless torch sees a CUDA device
#   --script   run a script (path + arguments) instead of a test module
# Environment for the tests: PYTHONPATH = the source tree's python/ (the package
# under test), KDAJIT_LIBRARY = $KDAJIT_TEST_LIBRARY (the built library), and
# KDAJIT_CACHE_DIR = $KDAJIT_CACHE_DIR or a directory in the build tree.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
gpu=0
script=0
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) gpu=1; shift ;;
    --script) script=1; shift ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "usage: run_tests.sh [--gpu] [--script] MODULE|SCRIPT [ARGS...]" >&2; exit 2; }

explicit=${KDAJIT_PYTHON_CMAKE:-${KDAJIT_PYTHON:-}}
py=""
if [ -n "$explicit" ]; then
  if ! "$explicit" -c "import torch" 2>/dev/null; then
    echo "run_tests.sh: KDAJIT_PYTHON=$explicit cannot import torch" >&2
    exit 1
  fi
  py=$explicit
else
  for cand in /usr/bin/python3 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch" 2>/dev/null; then
      py=$(command -v "$cand")
      break
    fi
  done
fi
if [ -z "$py" ]; then
  echo "SKIPPED: no Python interpreter with torch (tried /usr/bin/python3, python3);" \
       "install python3-torch or configure with -DKDAJIT_PYTHON=/path/to/python" >&2
  exit 77
fi
echo "run_tests.sh: $py ($("$py" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)'))"

if [ $gpu = 1 ] && ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "SKIPPED: torch sees no CUDA device"
  exit 77
fi

export PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "${KDAJIT_TEST_LIBRARY:-}" ]; then export KDAJIT_LIBRARY=$KDAJIT_TEST_LIBRARY; fi
export KDAJIT_CACHE_DIR=${KDAJIT_CACHE_DIR:-${KDAJIT_BUILD_DIR:-$src/build}/tests/python/kernel-cache}
export KDAJIT_SOURCE_DIR=$src
export PYTHONDONTWRITEBYTECODE=1

if [ $script = 1 ]; then
  exec "$py" "$@"
fi
cd "$here" && exec "$py" -m harness "$@"
