#!/usr/bin/env bash
# Installs what a fresh machine needs to build and test swa-decode, from Debian packages and PyPI
# only. Idempotent: re-running installs nothing that is already there (pip leaves satisfied
# requirements alone without asking the index). Needs nvcc (CUDA 13) and python3 with pip already.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: CMake 3.25 from Debian 12 is enough (the CUDA dialect is C++17), GoogleTest for
# the C++ tests, ninja for the build, a host C++ compiler for nvcc.
need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev googletest)
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "bootstrap: nvcc not found (on PATH or in /usr/local/cuda/bin); install the CUDA 13 toolkit" >&2
  exit 1
fi

# CUTLASS/CuTe headers, pinned, without the package's Python dependencies.
cutlass_dir=.deps/cutlass
if [ ! -f "$cutlass_dir/cutlass_library/source/include/cute/tensor.hpp" ]; then
  python3 -m pip install --quiet --no-deps --target "$cutlass_dir" nvidia-cutlass==4.2.0.0
fi

# Python build and test dependencies: the binding's build requirements (so an offline
# `pip install --no-build-isolation .` works too) and what python/tests needs. Plain PyPI torch;
# on a machine without a GPU its tests run on the CPU.
python3 -m pip install --quiet ninja 'scikit-build-core>=0.10' 'nanobind>=2,<4' numpy ml_dtypes pytest torch

echo "bootstrap: ok (CuTe headers in $cutlass_dir/cutlass_library/source/include)"
