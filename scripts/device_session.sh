#!/usr/bin/env bash
# One call on the lent GPU machine: GPU tests on every kernel family, compute-sanitizer on small
# cases, and the bench. Everything is logged under $OUT (one tarball + a summary), so a single
# device call does the whole round. Binaries come prebuilt in BUILD_DIR (built here with
# -DSWA_DECODE_PORTABLE_ARCHS=90) or are built there when absent.
# Run it once per device call: each run empties $OUT/logs and rewrites $OUT/logs.tar.gz.
# usage: scripts/device_session.sh BUILD_DIR [tests|sanitize|bench|ncu|python]...
#        (default: tests sanitize bench). python installs the wheel found in $WHEEL_DIR (built on the
#        developer machine for the device's Python) and runs pytest plus python/bench_vs_seed.py.
set -uo pipefail
build=${1:?usage: device_session.sh BUILD_DIR [tests|sanitize|bench]...}
shift
steps=${*:-tests sanitize bench}
out=${OUT:-/tmp/swad-out}
logs="$out/logs"
mkdir -p "$logs"
tests="$build/tests/swa_decode_tests"
cli="$build/tools/swa-decode"

nvidia-smi > "$logs/nvidia-smi.txt" 2>&1
if ! "$tests" --gtest_list_tests > /dev/null 2>&1; then
  echo "prebuilt binaries do not run here; building ($build)"
  cmake -S . -B "$build" -G Ninja -DSWA_DECODE_PORTABLE_ARCHS=90 > "$logs/build.log" 2>&1 &&
    cmake --build "$build" -j16 >> "$logs/build.log" 2>&1 || { tail -30 "$logs/build.log"; exit 1; }
fi

summary="$out/summary.txt"
: > "$summary"
for step in $steps; do
  case "$step" in
    tests)
      for kernel in ${TEST_KERNELS:-auto portable sm90}; do
        start=$SECONDS
        SWA_DECODE_TEST_KERNEL=$kernel timeout 120 "$tests" --gtest_brief=1 > "$logs/tests_$kernel.log" 2>&1
        echo "tests[$kernel]: rc=$? ($((SECONDS - start)) s) $(grep -E '^\[  (PASSED|FAILED)' "$logs/tests_$kernel.log" | tr '\n' ' ')" | tee -a "$summary"
      done
      ;;
    sanitize)
      small=${SANITIZE_FILTER:-'GpuDecode.LengthsAroundTheWindow:GpuDecode.HolesInTheWindow:GpuDecode.AllEntriesMissing:GpuDecode.IdsOutOfRange:GpuDecode.StridedTensors:GpuDecode.SinksInfiniteAndFinite:GpuDecodeShapes.*H16_int32_bf16*:GpuDecodeShapes.*H128_int64_fp32*'}
      for kernel in ${SANITIZE_KERNELS:-portable sm90}; do
        for tool in memcheck racecheck initcheck; do
          start=$SECONDS
          SWA_DECODE_TEST_KERNEL=$kernel timeout ${SANITIZE_TIMEOUT:-300} compute-sanitizer --tool "$tool" --error-exitcode 99 \
            "$tests" --gtest_brief=1 --gtest_filter="$small" > "$logs/sanitize_${kernel}_$tool.log" 2>&1
          echo "sanitize[$kernel/$tool]: rc=$? ($((SECONDS - start)) s) $(grep -E 'ERROR SUMMARY' "$logs/sanitize_${kernel}_$tool.log" | tail -1)" | tee -a "$summary"
        done
      done
      ;;
    bench)
      for heads in ${BENCH_HEADS:-128 64 16}; do
        start=$SECONDS
        timeout 200 "$cli" bench --heads "$heads" --kernel "${BENCH_KERNEL:-all}" --json "$out/bench_h$heads.json" > "$logs/bench_h$heads.log" 2>&1
        echo "bench[H=$heads]: rc=$? ($((SECONDS - start)) s)" | tee -a "$summary"
        grep -E '^ +[0-9]+ +[0-9]+ ' "$logs/bench_h$heads.log" | tee -a "$summary"
      done
      ;;
    ncu)
      # One profiled launch of each kernel family at H = 128, T = 2048: bandwidth, tensor pipe,
      # stall reasons. --clock-control none leaves the card's clocks alone (METHOD.md).
      for kernel in ${NCU_KERNELS:-sm90 portable}; do
        start=$SECONDS
        timeout 240 ncu --clock-control none --launch-skip 2 --launch-count 1 -k "regex:decode_${kernel}" \
          --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
          --section ComputeWorkloadAnalysis --section SchedulerStats \
          "$cli" bench --heads 128 --tokens 2048 --kernel "$kernel" --check-tokens 4 > "$logs/ncu_$kernel.log" 2>&1
        echo "ncu[$kernel]: rc=$? ($((SECONDS - start)) s)" | tee -a "$summary"
        grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per" "$logs/ncu_$kernel.log" | head -12 | tee -a "$summary"
      done
      ;;
    python)
      start=$SECONDS
      python3 -m pip install --no-deps --force-reinstall "${WHEEL_DIR:?WHEEL_DIR names the carried wheel folder}"/*.whl > "$logs/pip.log" 2>&1
      echo "pip install: rc=$?" | tee -a "$summary"
      PYTHONUNBUFFERED=1 timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider python/tests > "$logs/pytest.log" 2>&1
      echo "pytest: rc=$? ($((SECONDS - start)) s) $(tail -1 "$logs/pytest.log")" | tee -a "$summary"
      grep -E "^(FAILED|ERROR) " "$logs/pytest.log" | head -10 | tee -a "$summary"
      # -P: python/ (the script's folder, holding the source package without its extension) must
      # not shadow the installed package.
      PYTHONUNBUFFERED=1 timeout 200 python3 -P python/bench_vs_seed.py --json "$out/python_vs_seed.json" > "$logs/bench_vs_seed.log" 2>&1
      echo "bench_vs_seed: rc=$?" | tee -a "$summary"
      tail -12 "$logs/bench_vs_seed.log" | tee -a "$summary"
      ;;
    *) echo "unknown step '$step'" | tee -a "$summary" ;;
  esac
done
tar -C "$out" -czf "$out/logs.tar.gz" logs && rm -rf "$logs"
