#!/usr/bin/env bash
# The README's main command: set up a fresh machine, build, and run `swa-decode bench` with any
# extra arguments passed through (e.g. --heads 16 --json out.json; `--help` lists them). On a
# machine without a GPU the CLI runs the CPU path on a small batch and says so.
# JOBS (default 2) sets the build parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"

scripts/bootstrap.sh

# The default CUDA targets of CMakeLists.txt (80;90;100;120); only the CLI and what it links.
cmake -S . -B build -G Ninja
cmake --build build -j"${JOBS:-2}" --target swa_decode_cli
exec build/tools/swa-decode bench "$@"
