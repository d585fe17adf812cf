#!/usr/bin/env bash
# The README's test command and CI's (.ci/run): set up a fresh machine, build, run the C++ tests
# (GoogleTest through ctest) and the Python tests (pytest on the installed package). On a machine
# without a GPU the GPU tests skip and everything else runs on the CPU backend.
# JOBS (default 2) sets the build parallelism; CI has 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
jobs=${JOBS:-2}
start=$SECONDS

scripts/bootstrap.sh

# The C++ library, CLI and tests for the default CUDA targets of CMakeLists.txt (80;90;100;120).
cmake -S . -B build -G Ninja
cmake --build build -j"$jobs"
# --no-tests=error: a suite that registers no test must not pass as green.
ctest --test-dir build --output-on-failure --no-tests=error -j"$jobs"

# The Python package. Its extension is built for sm_90 only: here it only has to compile and run
# the CPU path (the four-target build above already proves the kernels compile for every target),
# and one target keeps CI inside its 90 minutes on 2 cores.
python3 -m pip install . -C build.tool-args=-j"$jobs" -C cmake.define.SWA_DECODE_PORTABLE_ARCHS=90

# The Python tests need torch (scripts/bootstrap.sh installs it); without it conftest would skip
# everything and the suite would look green.
python3 -c 'import torch, swa_decode' || {
  echo "test.sh: torch or swa_decode does not import; the Python tests cannot run" >&2
  exit 1
}
log=build/pytest.log
rc=0
python3 -m pytest -q python/tests 2>&1 | tee "$log" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests (exit 5); the Python tests did not run" >&2
  exit 1
elif [ "$rc" -ne 0 ]; then
  echo "test.sh: pytest failed (exit $rc)" >&2
  exit "$rc"
elif ! grep -Eq '[0-9]+ passed' "$log"; then
  echo "test.sh: pytest passed no test (all skipped?); the Python tests did not run" >&2
  exit 1
fi

echo "test.sh: all tests passed in $((SECONDS - start)) s"
