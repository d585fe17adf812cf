#!/usr/bin/env bash
# One call on the lent GPU machine: GPU tests on every kernel family, compute-sanitizer on small
# cases, and the bench. Everything is logged under $OUT (one tarball + a summary), so a single
# device call does the whole round. Binaries come prebuilt in BUILD_DIR (built here with
# -DSWA_DECODE_PORTABLE_ARCHS=90) or are built there when absent.
# Run it once per device call: each run empties $OUT/logs and rewrites $OUT/logs.tar.gz.
# usage: scripts/device_session.sh BUILD_DIR [tests|sanitize|bench|ab|ncu|python|python-source]...
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
# The lent machine's .git is the one from the start of the session, so without SWA_DECODE_COMMIT the
# bench JSON names a stale commit (marked dirty): say so where it will be read.
[ -n "${SWA_DECODE_COMMIT:-}" ] || echo "warning: SWA_DECODE_COMMIT is unset; JSON commits come from this tree's .git" | tee -a "$summary"
for step in $steps; do
  case "$step" in
    tests)
      for kernel in ${TEST_KERNELS:-auto portable sm90}; do
        start=$SECONDS
        SWA_DECODE_TEST_KERNEL=$kernel timeout ${TESTS_TIMEOUT:-300} "$tests" --gtest_brief=1 > "$logs/tests_$kernel.log" 2>&1
        echo "tests[$kernel]: rc=$? ($((SECONDS - start)) s) $(grep -E '^\[  (PASSED|FAILED)' "$logs/tests_$kernel.log" | tr '\n' ' ')" | tee -a "$summary"
      done
      ;;
    sanitize)
      # SANITIZE_FILTER='*' runs the whole GPU suite; the six tool x kernel runs go in parallel
      # (one GPU, many cores: the float64 reference dominates the wall time). racecheck ends its log
      # with "RACECHECK SUMMARY: N hazards", the other tools with "ERROR SUMMARY: N errors".
      small=${SANITIZE_FILTER:-'GpuDecode.LengthsAroundTheWindow:GpuDecode.HolesInTheWindow:GpuDecode.AllEntriesMissing:GpuDecode.IdsOutOfRange:GpuDecode.StridedTensors:GpuDecode.SinksInfiniteAndFinite:GpuDecodeShapes.*H16_int32_bf16*:GpuDecodeShapes.*H128_int64_fp32*'}
      start=$SECONDS
      for kernel in ${SANITIZE_KERNELS:-portable sm90}; do
        for tool in memcheck racecheck initcheck; do
          SWA_DECODE_TEST_KERNEL=$kernel timeout ${SANITIZE_TIMEOUT:-300} compute-sanitizer --tool "$tool" --error-exitcode 99 \
            "$tests" --gtest_filter="$small" > "$logs/sanitize_${kernel}_$tool.log" 2>&1 &
        done
      done
      wait
      for kernel in ${SANITIZE_KERNELS:-portable sm90}; do
        for tool in memcheck racecheck initcheck; do
          log="$logs/sanitize_${kernel}_$tool.log"
          echo "sanitize[$kernel/$tool]: $(grep -cE '^\[       OK' "$log") tests OK, $(grep -E '^\[  (PASSED|FAILED)' "$log" | tr '\n' ' ') $(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -1)" | tee -a "$summary"
        done
      done
      echo "sanitize: $((SECONDS - start)) s" | tee -a "$summary"
      ;;
    bench)
      for heads in ${BENCH_HEADS:-128 64 16}; do
        start=$SECONDS
        timeout 200 "$cli" bench --heads "$heads" --kernel "${BENCH_KERNEL:-all}" --json "$out/bench_h$heads.json" > "$logs/bench_h$heads.log" 2>&1
        echo "bench[H=$heads]: rc=$? ($((SECONDS - start)) s)" | tee -a "$summary"
        grep -E '^ +[0-9]+ +[0-9]+ ' "$logs/bench_h$heads.log" | tee -a "$summary"
      done
      ;;
    ab)
      # A/B of prebuilt CLIs (AB_CLIS, e.g. a baseline and a candidate) in one session, AB_ROUNDS
      # rounds in alternating order so that drift of the card's clocks hits both alike.
      for round in $(seq 1 "${AB_ROUNDS:-2}"); do
        clis=${AB_CLIS:?AB_CLIS names the CLIs to compare}
        (( round % 2 == 0 )) && clis=$(echo "$clis" | tr ' ' '\n' | tac | tr '\n' ' ')
        for ab_cli in $clis; do
          for heads in ${BENCH_HEADS:-128 64 16}; do
            name="ab_$(basename "$ab_cli")_h${heads}_r$round"
            timeout 200 "$ab_cli" bench --heads "$heads" --kernel "${BENCH_KERNEL:-portable}" --tokens "${AB_TOKENS:-128,512,2048}" \
              --json "$out/$name.json" > "$logs/$name.log" 2>&1
            echo "$name: rc=$?" | tee -a "$summary"
            grep -E '^ +[0-9]+ +[0-9]+ ' "$logs/$name.log" | tee -a "$summary"
          done
        done
      done
      ;;
    ncu)
      # One profiled launch per kernel family and token count (NCU_KERNELS, NCU_TOKENS) at
      # H = NCU_HEADS (default 128):
      # bandwidth, tensor pipe, stall reasons, and per-instruction stall samples (source page).
      # --clock-control none leaves the card's clocks alone (METHOD.md).
      # NCU_CLIS profiles several prebuilt CLIs (variants of an A/B) instead of this build's.
      for ncu_cli in ${NCU_CLIS:-$cli}; do
        for kernel in ${NCU_KERNELS:-sm90 portable}; do
          for tokens in ${NCU_TOKENS:-2048}; do
            start=$SECONDS
            rep="$logs/ncu_$(basename "$ncu_cli")_${kernel}_h${NCU_HEADS:-128}_t$tokens"
            timeout ${NCU_TIMEOUT:-120} ncu --clock-control none --launch-skip 2 --launch-count 1 -k "regex:decode_${kernel}" \
              --set full --import-source no -o "$rep" \
              "$ncu_cli" bench --heads "${NCU_HEADS:-128}" --tokens "$tokens" --kernel "$kernel" --check-tokens 4 > "$rep.run.log" 2>&1
            echo "ncu[$(basename "$ncu_cli") $kernel H=${NCU_HEADS:-128} T=$tokens]: rc=$? ($((SECONDS - start)) s)" | tee -a "$summary"
            ncu -i "$rep.ncu-rep" --page details > "$rep.txt" 2>&1
            ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1
            grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per" "$rep.txt" | head -8 | tee -a "$summary"
          done
        done
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
    python-source)
      # The documented offline install, built on this machine from the source tree (CUTLASS headers
      # carried in .deps/cutlass; scikit-build-core and nanobind from the image).
      start=$SECONDS
      python3 -m pip install --no-build-isolation --no-deps --force-reinstall . \
        -C cmake.define.SWA_DECODE_PORTABLE_ARCHS=90 -C build.tool-args=-j12 > "$logs/pip_source.log" 2>&1
      echo "pip install --no-build-isolation --no-deps . : rc=$? ($((SECONDS - start)) s)" | tee -a "$summary"
      tail -3 "$logs/pip_source.log" | tee -a "$summary"
      PYTHONUNBUFFERED=1 timeout 300 python3 -P -m pytest -q -rfE -p no:cacheprovider python/tests > "$logs/pytest_source.log" 2>&1
      echo "pytest (source install): rc=$? ($((SECONDS - start)) s) $(tail -1 "$logs/pytest_source.log")" | tee -a "$summary"
      grep -E "^(FAILED|ERROR) " "$logs/pytest_source.log" | head -10 | tee -a "$summary"
      ;;
    *) echo "unknown step '$step'" | tee -a "$summary" ;;
  esac
done
tar -C "$out" -czf "$out/logs.tar.gz" logs && rm -rf "$logs"
