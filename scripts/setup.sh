#!/usr/bin/env bash
# Installs what graphalloc needs on Debian 12 (the CUDA toolkit is expected to be there already):
# only the packages that are missing, with apt-get. Idempotent; prints nothing when all is present.
set -euo pipefail
packages=(cmake ninja-build g++ clang libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
          nlohmann-json3-dev libcli11-dev zlib1g-dev python3 python3-venv lld
          chromium)  # headless, for the HTML viewer's test (tests/snapshot/viewer_browser_test.cc)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "graphalloc setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "graphalloc setup: add /usr/local/cuda/bin to PATH to build the CUDA kernels" >&2
fi
