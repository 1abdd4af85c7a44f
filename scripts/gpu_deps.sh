#!/usr/bin/env bash
# For a GPU machine without a package registry (CUDA, CMake, Ninja, GoogleTest, Google Benchmark and PyTorch
# installed, Abseil, nlohmann-json and CLI11 not): unpacks the Debian packages of those three found in
# DEBS_DIR (default .gpu/deps, ignored by git; copy them there from a machine with the registry, e.g.
# `apt-get download libabsl-dev libabsl20220623 nlohmann-json3-dev libcli11-dev`) into PREFIX (default
# /opt/gpu-deps), registers their libraries with the dynamic linker, and prints the CMake arguments a build
# there needs:
#
#   cmake -S . -B /tmp/b -G Ninja $(scripts/gpu_deps.sh) -DCMAKE_BUILD_TYPE=Release
#
# Idempotent: a second run only prints the arguments. Needs root for ldconfig (the GPU machines run as root).
set -euo pipefail
cd "$(dirname "$0")/.."
debs=${1:-.gpu/deps}
prefix=${GRAPHALLOC_GPU_DEPS_PREFIX:-/opt/gpu-deps}
if [[ ! -f "$prefix/.unpacked" ]]; then
  shopt -s nullglob
  packages=("$debs"/*.deb)
  if [[ ${#packages[@]} -eq 0 ]]; then
    echo "$0: no .deb files in $debs (Abseil, nlohmann-json, CLI11)" >&2
    exit 2
  fi
  mkdir -p "$prefix"
  for deb in "${packages[@]}"; do dpkg -x "$deb" "$prefix"; done
  echo "$prefix/usr/lib/x86_64-linux-gnu" > /etc/ld.so.conf.d/graphalloc-gpu-deps.conf
  ldconfig
  touch "$prefix/.unpacked"
fi
# The H100 and H200 are sm_90; another GPU takes CMAKE_CUDA_ARCHITECTURES from the caller's own arguments.
echo "-DCMAKE_PREFIX_PATH=$prefix/usr -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES=90"
