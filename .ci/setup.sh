#!/usr/bin/env bash
# Installs kdajit's build dependencies (Debian 12 / Ubuntu 24.04 packages) and
# builds into ./build. Needs the CUDA toolkit in /usr/local/cuda (NVRTC and
# cuda.h; no GPU or driver needed). Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
PACKAGES="cmake ninja-build g++ libfmt-dev nlohmann-json3-dev catch2 libcli11-dev libssl-dev"
# The Python package's tests (tests/python): Debian's torch, and what an offline
# `pip install --no-build-isolation ./python` needs; torch's C++ headers (and the
# Python and pybind11 headers they include) for kdajit._hotpath (python/CMakeLists.txt).
PACKAGES="$PACKAGES python3-torch python3-setuptools python3-pip python3-wheel libtorch-dev python3-dev pybind11-dev"
missing=""
for p in $PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi

if [ ! -e /usr/local/cuda/include/nvrtc.h ] && ! command -v nvcc >/dev/null; then
  echo "setup: the CUDA toolkit (NVRTC) was not found in /usr/local/cuda" >&2
  exit 1
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCUDAToolkit_ROOT=/usr/local/cuda
cmake --build build -j "$(nproc)"
