#!/usr/bin/env bash
# One call on a GPU machine (docs/gpu-machine.md): GPU tests on every kernel family,
# compute-sanitizer on the whole GPU suite per kernel family, and the bench. Everything is logged
# under $OUT (one tarball + a summary), so a single device call does the whole round. Binaries come
# prebuilt in BUILD_DIR (built elsewhere with -DSWA_DECODE_PORTABLE_ARCHS=90) or are built there
# when absent. Run it once per device call: each run empties $OUT/logs and rewrites
# $OUT/logs.tar.gz.
# usage: scripts/device_session.sh BUILD_DIR [tests|sanitize|bench|ab|ncu|python|python-source]...
#        (default: tests sanitize bench). python installs the wheel found in $WHEEL_DIR (built on the
#        developer machine for the device's Python) and runs pytest plus python/bench_vs_seed.py.
# Every check prints one line "LABEL: OK|FAILED|MISSING [what is wrong] | counts"; MISSING means
# a line the check reads is absent. The exit status is non-zero when any check is not OK.
set -uo pipefail
build=${1:?usage: device_session.sh BUILD_DIR [tests|sanitize|bench|ab|ncu|python|python-source]...}
shift
steps=${*:-tests sanitize bench}
out=${OUT:-/tmp/swad-out}
logs="$out/logs"
mkdir -p "$logs"
tests="$build/tests/swa_decode_tests"
cli="$build/tools/swa-decode"
# GPU tests are the ones whose name holds this word (GpuDecode.*, */GpuDecodeShapes.*); a forced
# kernel that cannot run a case skips it with a message holding skip_marker (tests/gpu/).
gpu_tests=${GPU_TESTS:-Gpu}
skip_marker="kernel under test"
# gtest_check reads the per-test lines "[  SKIPPED ] Name (N ms)": forced on here, whatever
# GTEST_BRIEF or GTEST_PRINT_TIME the environment sets.
gtest_flags=(--gtest_brief=0 --gtest_print_time=1)

summary="$out/summary.txt"
: > "$summary"
checks=0
not_ok=()

# verdict LABEL PROBLEMS DETAIL: the one summary line of a check. PROBLEMS lists what is wrong,
# "; "-separated, empty when nothing is. Entries that start with "missing" alone make it MISSING
# (the check could not read what it must), any other entry FAILED.
verdict() {
  local label=$1 problems=$2 detail=$3 word=OK
  checks=$((checks + 1))
  if [ -n "$problems" ]; then
    word=MISSING
    local entry
    while IFS= read -r entry; do
      [[ "$entry" == missing* ]] || word=FAILED
    done <<< "${problems//; /$'\n'}"
    not_ok+=("$label")
  fi
  echo "$label: $word${problems:+ [$problems]}${detail:+ | $detail}" | tee -a "$summary"
}

# exit_problem RC: the problem entry for a command's exit code, or nothing when it is 0.
exit_problem() {
  case "$1" in
    0) ;;
    124) echo "timed out (exit code 124)" ;;
    *) echo "exit code $1" ;;
  esac
}

# gtest_check LABEL LOG RC TOOL NOTE: the verdict on a GoogleTest run (without --gtest_brief, so that
# every test prints its [ RUN ] and its OK / SKIPPED / FAILED line) and, unless TOOL is "", on the
# compute-sanitizer summary line that tool ends its log with: "ERROR SUMMARY: N errors" (memcheck,
# initcheck) or "RACECHECK SUMMARY: N hazards displayed (...)" (racecheck). The counts gtest prints
# at the end must agree with the per-test lines, a GPU test must have run, no test may fail and the
# tool must report 0. NOTE (e.g. the time taken) ends the line.
gtest_check() {
  local label=$1 log=$2 rc=$3 tool=$4 note=$5 problems="" detail=""
  if [ ! -r "$log" ]; then
    verdict "$label" "missing the log $log${rc:+; $(exit_problem "$rc")}" "$note"
    return
  fi
  { read -r problems; read -r detail; } < <(awk -v gpu="$gpu_tests" -v marker="$skip_marker" \
      -v tool="$tool" -v rc_problem="$(exit_problem "$rc")" '
    function problem(text) { problems = problems (problems == "" ? "" : "; ") text }
    function number_after(text, key) { return substr(text, index(text, key) + length(key)) + 0 }
    BEGIN { ran = -1; passed = -1 }
    /^\[ RUN      \] / { started = $4; marked = 0; next }
    index($0, marker) { marked = 1 }
    /^\[       OK \] .* \([0-9]+ ms\)$/ { ok++; if ($4 ~ gpu) gpu_ok++; next }
    /^\[  SKIPPED \] .* \([0-9]+ ms\)$/ {
      skipped++; if (marked) by_kernel++
      if ($4 ~ gpu) gpu_skipped++
      next
    }
    /^\[  FAILED  \] .* \([0-9]+ ms\)$/ {
      failed++; if ($4 ~ gpu) gpu_failed++
      sub(/,$/, "", $4); if (failed <= 3) failed_names = failed_names " " $4
      next
    }
    /^\[==========\] [0-9]+ tests? from .* ran\./ { ran = $2 + 0 }
    /^\[  PASSED  \] [0-9]+ tests?\.$/ { passed = $4 + 0 }
    /^\[  SKIPPED \] [0-9]+ tests?, listed below:$/ { listed_skipped = $4 + 0 }
    /^\[  FAILED  \] [0-9]+ tests?, listed below:$/ { listed_failed = $4 + 0 }
    tool == "racecheck" && /RACECHECK SUMMARY: [0-9]+ hazard/ ||
    tool != "" && tool != "racecheck" && /ERROR SUMMARY: [0-9]+ error/ {
      tool_line = $0; tool_count = number_after($0, "SUMMARY: ")
    }
    END {
      if (rc_problem != "") problem(rc_problem)
      if (ran < 0) problem("missing the \"[==========] N tests from M test suites ran.\" line" \
                           (started != "" ? " (last test started: " started ")" : ""))
      if (passed < 0) problem("missing the \"[  PASSED  ] N tests.\" line")
      if (ran == 0) problem("no test ran")
      if (ran > 0 && ok + skipped + failed != ran)
        problem(ran " tests ran but " ok + skipped + failed " ended OK, SKIPPED or FAILED")
      if (passed >= 0 && passed != ok) problem("PASSED counts " passed ", OK lines " ok + 0)
      if (ran >= 0 && listed_skipped + 0 != skipped + 0)
        problem("SKIPPED counts " listed_skipped + 0 ", skip lines " skipped + 0)
      if (ran >= 0 && listed_failed + 0 != failed + 0)
        problem("FAILED counts " listed_failed + 0 ", failure lines " failed + 0)
      if (failed > 0) problem(failed " failed:" failed_names (failed > 3 ? " ..." : ""))
      if (gpu_ok + gpu_failed == 0) problem("no GPU test (name holding \"" gpu "\") ran")
      unit = tool == "racecheck" ? "hazards" : "errors"
      expected = (tool == "racecheck" ? "RACECHECK" : "ERROR") " SUMMARY: N " unit
      if (tool != "" && tool_line == "") problem("missing the " tool " line \"" expected "\"")
      if (tool_line != "" && tool_count != 0) problem(tool " reports " tool_count " " unit)
      print problems
      sub(/^=+ /, "", tool_line)
      printf "%d tests: %d ok, %d skipped, %d failed; GPU tests: %d ran, %d skipped (%d by the kernel under test)%s\n",
             ran < 0 ? ok + skipped + failed : ran, ok, skipped, failed, gpu_ok + gpu_failed, gpu_skipped,
             by_kernel, tool_line != "" ? "; " tool_line : ""
    }' "$log")
  [ -n "$detail" ] || problems="awk could not read $log"
  verdict "$label" "$problems" "$detail; $note"
  # The random-configuration test says how many configurations it drew and its largest errors.
  grep -E '^random-configs:' "$log" | awk -v label="$label" '{ print "  [" label "] " $0 }' | tee -a "$summary"
}

# bench_check LABEL LOG RC JSON NOTE: a `swa-decode bench` run printed result rows, passed its
# check against the float64 reference (exit code 0, no row FAIL) and wrote its JSON.
bench_check() {
  local label=$1 log=$2 rc=$3 json=$4 note=$5 problems rows failing
  problems=$(exit_problem "$rc")
  rows=$(grep -cE '^ +[0-9]+ +[0-9]+ ' "$log")
  failing=$(grep -E '^ +[0-9]+ +[0-9]+ ' "$log" | grep -c ' FAIL ')
  [ "$rows" -gt 0 ] || problems+="${problems:+; }missing result rows"
  [ "$failing" -eq 0 ] || problems+="${problems:+; }$failing rows FAIL the reference check"
  [ -s "$json" ] || problems+="${problems:+; }missing $(basename "$json")"
  verdict "$label" "$problems" "result rows: $rows; $note"
  grep -E '^ +[0-9]+ +[0-9]+ ' "$log" | tee -a "$summary"
}

# pytest_check LABEL LOG RC: pytest exited 0 and its last line counts at least one passed test.
pytest_check() {
  local label=$1 log=$2 rc=$3 problems last
  problems=$(exit_problem "$rc")
  last=$(tail -1 "$log")
  grep -qE '[0-9]+ passed' <<< "$last" || problems+="${problems:+; }missing pytest's \"N passed\" line"
  verdict "$label" "$problems" "$last"
  grep -E "^(FAILED|ERROR) " "$log" | head -10 | tee -a "$summary"
}

nvidia-smi > "$logs/nvidia-smi.txt" 2>&1
built_here=0
if ! "$tests" --gtest_list_tests > /dev/null 2>&1; then
  echo "prebuilt binaries do not run here; building ($build)"
  built_here=1
  cmake -S . -B "$build" -G Ninja -DSWA_DECODE_PORTABLE_ARCHS=90 > "$logs/build.log" 2>&1 &&
    cmake --build "$build" -j16 >> "$logs/build.log" 2>&1 || { tail -30 "$logs/build.log"; exit 1; }
fi

# The bench stamps the commit its binary was built from (tools/stamp_commit.cmake). A machine
# without network gets the tree without an up-to-date .git, so a binary built here names a stale
# commit (marked dirty) unless SWA_DECODE_COMMIT says which: say so where it will be read.
if [ "$built_here" = 1 ] && [ -z "${SWA_DECODE_COMMIT:-}" ]; then
  echo "warning: SWA_DECODE_COMMIT is unset; the binaries built here stamp this tree's .git" | tee -a "$summary"
fi
for step in $steps; do
  case "$step" in
    tests)
      for kernel in ${TEST_KERNELS:-auto portable sm90}; do
        start=$SECONDS
        log="$logs/tests_$kernel.log"
        SWA_DECODE_TEST_KERNEL=$kernel timeout "${TESTS_TIMEOUT:-300}" "$tests" "${gtest_flags[@]}" --gtest_filter="${TESTS_FILTER:-*}" > "$log" 2>&1
        rc=$?
        gtest_check "tests[$kernel]" "$log" "$rc" "" "$((SECONDS - start)) s"
      done
      ;;
    sanitize)
      # The whole GPU suite per kernel family by default; the six tool x kernel runs go in
      # parallel (one GPU, many cores: the float64 reference dominates the wall time).
      filter=${SANITIZE_FILTER:-"*$gpu_tests*"}
      start=$SECONDS
      for kernel in ${SANITIZE_KERNELS:-portable sm90}; do
        for tool in memcheck racecheck initcheck; do
          ( SWA_DECODE_TEST_KERNEL=$kernel timeout "${SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --error-exitcode 99 \
              "$tests" "${gtest_flags[@]}" --gtest_filter="$filter" > "$logs/sanitize_${kernel}_$tool.log" 2>&1
            echo $? > "$logs/sanitize_${kernel}_$tool.rc" ) &
        done
      done
      wait
      for kernel in ${SANITIZE_KERNELS:-portable sm90}; do
        for tool in memcheck racecheck initcheck; do
          log="$logs/sanitize_${kernel}_$tool.log"
          rc=$(cat "$logs/sanitize_${kernel}_$tool.rc" 2>/dev/null || echo "unknown")
          gtest_check "sanitize[$kernel/$tool]" "$log" "$rc" "$tool" "filter '$filter'"
        done
      done
      echo "sanitize: $((SECONDS - start)) s for every tool and kernel" | tee -a "$summary"
      ;;
    bench)
      for heads in ${BENCH_HEADS:-128 64 16}; do
        start=$SECONDS
        timeout 200 "$cli" bench --heads "$heads" --kernel "${BENCH_KERNEL:-all}" --json "$out/bench_h$heads.json" > "$logs/bench_h$heads.log" 2>&1
        bench_check "bench[H=$heads]" "$logs/bench_h$heads.log" $? "$out/bench_h$heads.json" "$((SECONDS - start)) s"
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
            bench_check "$name" "$logs/$name.log" $? "$out/$name.json" "$ab_cli"
          done
        done
      done
      ;;
    ncu)
      # One profiled launch per kernel family and token count (NCU_KERNELS, NCU_TOKENS) at
      # H = NCU_HEADS (default 128):
      # bandwidth, tensor pipe, stall reasons, and per-instruction stall samples (source page).
      # --clock-control none leaves the card's clocks as they are, as they are when the bench runs.
      # NCU_CLIS profiles several prebuilt CLIs (variants of an A/B) instead of this build's.
      for ncu_cli in ${NCU_CLIS:-$cli}; do
        for kernel in ${NCU_KERNELS:-sm90 portable}; do
          for tokens in ${NCU_TOKENS:-2048}; do
            start=$SECONDS
            rep="$logs/ncu_$(basename "$ncu_cli")_${kernel}_h${NCU_HEADS:-128}_t$tokens"
            timeout "${NCU_TIMEOUT:-120}" ncu --clock-control none --launch-skip 2 --launch-count 1 -k "regex:decode_${kernel}" \
              --set full --import-source no -o "$rep" \
              "$ncu_cli" bench --heads "${NCU_HEADS:-128}" --tokens "$tokens" --kernel "$kernel" --check-tokens 4 > "$rep.run.log" 2>&1
            rc=$?
            problems=$(exit_problem "$rc")
            [ -s "$rep.ncu-rep" ] || problems+="${problems:+; }missing $(basename "$rep").ncu-rep"
            verdict "ncu[$(basename "$ncu_cli") $kernel H=${NCU_HEADS:-128} T=$tokens]" "$problems" "$((SECONDS - start)) s"
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
      rc=$?
      verdict "pip install (wheel)" "$(exit_problem "$rc")" "$(tail -1 "$logs/pip.log")"
      PYTHONUNBUFFERED=1 timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider python/tests > "$logs/pytest.log" 2>&1
      pytest_check "pytest" "$logs/pytest.log" $?
      # -P: python/ (the script's folder, holding the source package without its extension) must
      # not shadow the installed package.
      PYTHONUNBUFFERED=1 timeout 200 python3 -P python/bench_vs_seed.py --json "$out/python_vs_seed.json" > "$logs/bench_vs_seed.log" 2>&1
      rc=$?
      problems=$(exit_problem "$rc")
      [ -s "$out/python_vs_seed.json" ] || problems+="${problems:+; }missing python_vs_seed.json"
      verdict "bench_vs_seed" "$problems" ""
      tail -12 "$logs/bench_vs_seed.log" | tee -a "$summary"
      ;;
    python-source)
      # The documented offline install, built on this machine from the source tree (CUTLASS headers
      # carried in .deps/cutlass; scikit-build-core and nanobind from the image).
      start=$SECONDS
      python3 -m pip install --no-build-isolation --no-deps --force-reinstall . \
        -C cmake.define.SWA_DECODE_PORTABLE_ARCHS=90 -C build.tool-args=-j12 > "$logs/pip_source.log" 2>&1
      rc=$?
      verdict "pip install from source" "$(exit_problem "$rc")" "$((SECONDS - start)) s; $(tail -1 "$logs/pip_source.log")"
      PYTHONUNBUFFERED=1 timeout 300 python3 -P -m pytest -q -rfE -p no:cacheprovider python/tests > "$logs/pytest_source.log" 2>&1
      pytest_check "pytest (source install)" "$logs/pytest_source.log" $?
      # Host time per eager call of both Python entry points (python/bench_eager.py).
      PYTHONUNBUFFERED=1 timeout 120 python3 -P python/bench_eager.py --json "$out/eager_h200.json" > "$logs/bench_eager.log" 2>&1
      problems=$(exit_problem $?)
      [ -s "$out/eager_h200.json" ] || problems+="${problems:+; }missing $out/eager_h200.json"
      verdict "bench_eager" "$problems" "$(tail -6 "$logs/bench_eager.log" | tr '\n' ' ')"
      ;;
    *) verdict "step '$step'" "unknown step (expected tests, sanitize, bench, ab, ncu, python or python-source)" "" ;;
  esac
done

if [ ${#not_ok[@]} -eq 0 ]; then
  echo "session: OK ($checks checks)" | tee -a "$summary"
else
  echo "session: FAILED (${#not_ok[@]} of $checks checks not OK: $(printf '%s, ' "${not_ok[@]}" | sed 's/, $//'))" | tee -a "$summary"
fi
tar -C "$out" -czf "$out/logs.tar.gz" logs && rm -rf "$logs"
[ ${#not_ok[@]} -eq 0 ]
