#!/usr/bin/env bash
# One call on the lent GPU machine: GPU tests on every kernel family, compute-sanitizer on small
# cases, and the bench. Everything is logged under $OUT (one tarball + a summary), so a single
# device call does the whole round. Binaries come prebuilt in BUILD_DIR (built here with
# -DSWA_DECODE_PORTABLE_ARCHS=90) or are built there when absent.
# usage: scripts/device_session.sh BUILD_DIR [tests|sanitize|bench]...   (default: all three)
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
      for kernel in auto portable sm90; do
        start=$SECONDS
        SWA_DECODE_TEST_KERNEL=$kernel timeout 240 "$tests" --gtest_brief=1 > "$logs/tests_$kernel.log" 2>&1
        echo "tests[$kernel]: rc=$? ($((SECONDS - start)) s) $(grep -E '^\[  (PASSED|FAILED)' "$logs/tests_$kernel.log" | tr '\n' ' ')" | tee -a "$summary"
      done
      ;;
    sanitize)
      small='GpuDecode.LengthsAroundTheWindow:GpuDecode.HolesInTheWindow:GpuDecode.AllEntriesMissing:GpuDecode.IdsOutOfRange:GpuDecode.StridedTensors:GpuDecode.SinksInfiniteAndFinite:GpuDecodeShapes.*H16_int32_bf16*:GpuDecodeShapes.*H128_int64_fp32*'
      for kernel in portable sm90; do
        for tool in memcheck racecheck initcheck; do
          start=$SECONDS
          SWA_DECODE_TEST_KERNEL=$kernel timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 99 \
            "$tests" --gtest_brief=1 --gtest_filter="$small" > "$logs/sanitize_${kernel}_$tool.log" 2>&1
          echo "sanitize[$kernel/$tool]: rc=$? ($((SECONDS - start)) s) $(grep -E 'ERROR SUMMARY' "$logs/sanitize_${kernel}_$tool.log" | tail -1)" | tee -a "$summary"
        done
      done
      ;;
    bench)
      for heads in ${BENCH_HEADS:-128 64 16}; do
        start=$SECONDS
        timeout 300 "$cli" bench --heads "$heads" --kernel all --json "$out/bench_h$heads.json" > "$logs/bench_h$heads.log" 2>&1
        echo "bench[H=$heads]: rc=$? ($((SECONDS - start)) s)" | tee -a "$summary"
        grep -E '^ +[0-9]+ +[0-9]+ ' "$logs/bench_h$heads.log" | tee -a "$summary"
      done
      ;;
    *) echo "unknown step '$step'" | tee -a "$summary" ;;
  esac
done
tar -C "$out" -czf "$out/logs.tar.gz" logs && rm -rf "$logs"
