#!/usr/bin/env bash
# Installs what a fresh machine needs to build and test swa-decode, from Debian packages and PyPI
# only. Idempotent: re-running skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev googletest)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

# CUTLASS/CuTe headers, pinned, without the package's Python dependencies.
cutlass_dir=.deps/cutlass
if [ ! -f "$cutlass_dir/cutlass_library/source/include/cute/tensor.hpp" ]; then
  python3 -m pip install --quiet --no-deps --target "$cutlass_dir" nvidia-cutlass==4.2.0.0
fi
echo "bootstrap: ok (CuTe headers in $cutlass_dir/cutlass_library/source/include)"
