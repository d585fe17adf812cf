#!/usr/bin/env bash
# The checks of scripts/device_session.sh, tested on a machine without a GPU: the script runs on
# fakes of its programs (tests/scripts/fake_gpu_tools.py) that print the real programs' formats and
# misbehave one way per case, and each case reads the verdict lines of the summary. The bug this
# guards against (issue 10): a check that grepped a line racecheck never prints and so reported
# nothing, which read as clean. Every check must say OK, FAILED or MISSING, and anything but OK
# must fail the session.
# usage: tests/scripts/test_device_session.sh [SCRIPT]
#        SCRIPT (default $DEVICE_SESSION, else this repo's scripts/device_session.sh), so that the
#        test can be pointed at an older script to show which cases it fails.
# Needs bash, python3 and what the script itself uses (coreutils, awk, grep, sed, tar); no GPU,
# no network. About 2 s (15 cases in parallel).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
script=${1:-${DEVICE_SESSION:-$here/../../scripts/device_session.sh}}
[ -r "$script" ] || { echo "test_device_session: cannot read the script $script" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The fakes: BUILD_DIR's two binaries, and compute-sanitizer, nvidia-smi and python3 on PATH.
# They call the interpreter by its full path, so the fake python3 does not shadow it, and with
# -I -S (no site, no environment), which halves each of the run's ~100 interpreter starts.
python=$(python3 -c 'import sys; print(sys.executable)') ||
  { echo "test_device_session: needs python3 on PATH" >&2; exit 2; }
mkdir -p "$work/build/tests" "$work/build/tools" "$work/bin" "$work/wheels"
fake() {
  printf '#!/bin/sh\nexec "%s" -I -S "%s" %s "$@"\n' "$python" "$here/fake_gpu_tools.py" "$2" > "$1"
  chmod +x "$1"
}
fake "$work/build/tests/swa_decode_tests" swa_decode_tests
fake "$work/build/tools/swa-decode" swa-decode
for tool in compute-sanitizer nvidia-smi python3; do fake "$work/bin/$tool" "$tool"; done

# Each case is a function that runs one session and checks its summary; the cases run in parallel
# subshells (one after another they took 8.7 s on a busy 2-core machine, in parallel 1.7 s).
case_name="" summary="" session_rc=0 case_problems=()

# session STEPS [VAR=VALUE...]: runs the script for the case case_name on the fakes with a clean
# environment (so that no FAKE_*, *_KERNELS or GTEST_* of the caller leaks in) plus the given
# variables, from $work: were the fake test binary not to run, the script's fallback build
# (cmake -S .) fails there at once instead of building the caller's directory.
session() {
  local steps
  read -ra steps <<< "$1"
  shift
  local out="$work/out_$case_name"
  summary="$out/summary.txt"
  (cd "$work" && env -i PATH="$work/bin:$PATH" HOME="$work" OUT="$out" SWA_DECODE_COMMIT=fake \
    WHEEL_DIR="$work/wheels" "$@" bash "$script" "$work/build" "${steps[@]}") > "$work/$case_name.log" 2>&1
  session_rc=$?
}

problem() { case_problems+=("$1"); }

# verdict LABEL WORD [TEXT...]: the summary has the line "LABEL: WORD ..." and it holds each TEXT.
verdict() {
  local label=$1 word=$2 line text
  shift 2
  line=$(awk -v head="$label: " 'index($0, head) == 1' "$summary" 2>/dev/null)
  if [ -z "$line" ]; then
    problem "no line for $label"
    return
  fi
  [[ "$line" == "$label: $word" || "$line" == "$label: $word "* ]] || problem "$label is not $word: $line"
  for text in "$@"; do
    [[ "$line" == *"$text"* ]] || problem "$label does not say '$text': $line"
  done
}

# has_line TEXT: some summary line starts with TEXT.
has_line() {
  awk -v head="$1" 'index($0, head) == 1 { found = 1 } END { exit !found }' "$summary" 2>/dev/null ||
    problem "no line starting '$1'"
}

# session_fails N / session_passes N: the script's exit status and its closing "session:" line.
session_fails() {
  [ "$session_rc" -ne 0 ] || problem "the script exited 0"
  has_line "session: FAILED ($1 of "
}
session_passes() {
  [ "$session_rc" -eq 0 ] || problem "the script exited $session_rc"
  has_line "session: OK ($1 checks)"
}

# fails_on STEPS VARIABLES LABEL WORD [TEXT...]: a session with the (space-separated) VARIABLES in
# which the check LABEL alone is not OK: it says WORD and each TEXT, and the session fails.
fails_on() {
  local step_words=$1 variables
  read -ra variables <<< "$2"
  shift 2
  session "$step_words" "${variables[@]}"
  verdict "$@"
  session_fails 1
}

# all_ok N: the summary has N verdict lines (not counting the closing "session:" line) and every
# one says OK.
all_ok() {
  local verdicts ok
  verdicts=$(grep -vE '^session: ' "$summary" 2>/dev/null | grep -cE '^[^ ].*: (OK|FAILED|MISSING)( |$)')
  ok=$(grep -vE '^session: ' "$summary" 2>/dev/null | grep -cE '^[^ ].*: OK( |$)')
  [ "${verdicts:-0}" -eq "$1" ] || problem "$1 verdict lines expected, got ${verdicts:-0}"
  [ "${ok:-0}" -eq "${verdicts:-0}" ] || problem "only ${ok:-0} of ${verdicts:-0} verdict lines are OK"
}

# case_done: reports the case and returns its status; on failure shows what went wrong and the
# summary it read.
case_done() {
  if [ ${#case_problems[@]} -eq 0 ]; then
    echo "ok      $case_name"
    return 0
  fi
  echo "FAILED  $case_name"
  printf '          %s\n' "${case_problems[@]}"
  echo "          summary:"
  sed 's/^/            /' "$summary" 2>/dev/null || echo "            (none)"
  echo "          script output (last 5 lines):"
  tail -5 "$work/$case_name.log" | sed 's/^/            /'
  return 1
}

# Every step on clean runs: 3 + 6 + 3 + 3 checks, every one OK, the per-kernel counts printed.
all_good() {
  session "tests sanitize bench python"
  all_ok 15
  verdict "tests[auto]" OK "GPU tests: 6 ran, 0 skipped (0 by the kernel under test)"
  verdict "tests[portable]" OK "9 tests: 9 ok, 0 skipped, 0 failed"
  verdict "tests[sm90]" OK "GPU tests: 5 ran, 1 skipped (1 by the kernel under test)"
  verdict "sanitize[sm90/racecheck]" OK "RACECHECK SUMMARY: 0 hazards displayed" "GPU tests: 5 ran, 1 skipped"
  verdict "sanitize[portable/memcheck]" OK "ERROR SUMMARY: 0 errors" "6 tests: 6 ok"
  verdict "sanitize[portable/initcheck]" OK "ERROR SUMMARY: 0 errors"
  verdict "bench[H=16]" OK "result rows: 2"
  verdict "pytest" OK "153 passed"
  session_passes 15
}

# The random-configs lines reach the summary under every label, also those holding a '/'
# (sed "s/^/  [$label] /" printed nothing for sanitize[portable/racecheck]).
random_configs_under_slash_labels() {
  session "tests sanitize" TEST_KERNELS=portable SANITIZE_KERNELS=portable
  local label copied
  for label in "tests[portable]" "sanitize[portable/memcheck]" "sanitize[portable/racecheck]" \
               "sanitize[portable/initcheck]"; do
    copied=$(grep -cF "  [$label] random-configs: " "$summary" 2>/dev/null)
    [ "${copied:-0}" -eq 2 ] || problem "2 random-configs lines expected under [$label], got ${copied:-0}"
  done
}

# racecheck prints "RACECHECK SUMMARY: N hazards", never "ERROR SUMMARY": here its log has only
# the latter, so racecheck must be MISSING, not clean; the other tools stay OK.
racecheck_summary_missing() {
  fails_on sanitize "FAKE_SANITIZER=racecheck:no-summary SANITIZE_KERNELS=portable" \
    "sanitize[portable/racecheck]" MISSING 'missing the racecheck line "RACECHECK SUMMARY: N hazards"'
  verdict "sanitize[portable/memcheck]" OK
  verdict "sanitize[portable/initcheck]" OK
}

memcheck_summary_missing() {
  fails_on sanitize "FAKE_SANITIZER=memcheck:no-summary SANITIZE_KERNELS=sm90" \
    "sanitize[sm90/memcheck]" MISSING 'missing the memcheck line "ERROR SUMMARY: N errors"'
  verdict "sanitize[sm90/racecheck]" OK
  verdict "sanitize[sm90/initcheck]" OK
}

racecheck_hazards() {
  fails_on sanitize "FAKE_SANITIZER=racecheck:errors SANITIZE_KERNELS=sm90" \
    "sanitize[sm90/racecheck]" FAILED "racecheck reports 3 hazards" "exit code 99"
  verdict "sanitize[sm90/memcheck]" OK
}

# The count is read, not only the exit code: hazards with exit code 0 still fail.
racecheck_hazards_exit_0() {
  fails_on sanitize "FAKE_SANITIZER=racecheck:errors-exit0 SANITIZE_KERNELS=portable" \
    "sanitize[portable/racecheck]" FAILED "racecheck reports 3 hazards"
}

memcheck_errors() {
  fails_on sanitize "FAKE_SANITIZER=memcheck:errors SANITIZE_KERNELS=portable" \
    "sanitize[portable/memcheck]" FAILED "memcheck reports 3 errors" "exit code 99"
}

gtest_failed() {
  fails_on tests "FAKE_GTEST=failed TEST_KERNELS=portable" "tests[portable]" FAILED "exit code 1" \
    "2 failed: GpuDecode.LengthsAroundTheWindow HeadsIndexScale/GpuDecodeShapes.MixedEdgeCases/H128_int64_fp32scale"
}

# Every GPU test skipped (no device): the suite passes, the check must not.
no_gpu_test_ran() {
  fails_on tests "FAKE_GTEST=nogpu TEST_KERNELS=auto" \
    "tests[auto]" FAILED 'no GPU test (name holding "Gpu") ran' "GPU tests: 0 ran, 6 skipped"
}

# A log that ends before gtest's closing counts, with exit code 0.
gtest_counts_missing() {
  fails_on tests "FAKE_GTEST=truncated TEST_KERNELS=portable" "tests[portable]" MISSING \
    'missing the "[==========] N tests from M test suites ran." line' 'missing the "[  PASSED  ] N tests." line'
}

gtest_crash() {
  fails_on tests "FAKE_GTEST=crash TEST_KERNELS=sm90" \
    "tests[sm90]" FAILED "exit code 139" "(last test started: GpuDecode.NoSinkNoLse)"
}

gtest_counts_disagree() {
  fails_on tests "FAKE_GTEST=count-mismatch TEST_KERNELS=portable" \
    "tests[portable]" FAILED "PASSED counts 10, OK lines 9"
}

bench_no_rows() {
  fails_on bench "FAKE_BENCH=no-rows BENCH_HEADS=128" \
    "bench[H=128]" MISSING "missing result rows" "missing bench_h128.json"
}

bench_row_fails() {
  fails_on bench "FAKE_BENCH=fail BENCH_HEADS=64" \
    "bench[H=64]" FAILED "exit code 1" "2 rows FAIL the reference check"
}

pytest_none_passed() {
  fails_on python FAKE_PYTEST=none-passed pytest MISSING "missing pytest's \"N passed\" line" "21 skipped"
  verdict "pip install (wheel)" OK
  verdict "bench_vs_seed" OK
}

names=(all_good random_configs_under_slash_labels racecheck_summary_missing memcheck_summary_missing
       racecheck_hazards racecheck_hazards_exit_0 memcheck_errors gtest_failed no_gpu_test_ran
       gtest_counts_missing gtest_crash gtest_counts_disagree bench_no_rows bench_row_fails pytest_none_passed)
pids=()
for name in "${names[@]}"; do
  ( case_name=$name; "$name"; case_done ) > "$work/$name.report" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!names[@]}"; do
  wait "${pids[$i]}" || failed=$((failed + 1))
  cat "$work/${names[$i]}.report"
done
echo "$((${#names[@]} - failed)) of ${#names[@]} cases passed ($script)"
[ "$failed" -eq 0 ]
