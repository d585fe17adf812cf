"""Stand-ins for the programs scripts/device_session.sh runs on a GPU machine, so that its checks
can be tested on a machine without a GPU (tests/scripts/test_device_session.sh).

usage: fake_gpu_tools.py TOOL ARGS...   TOOL: swa_decode_tests | compute-sanitizer | swa-decode |
                                              nvidia-smi | python3

Each fake prints what the real program prints, in its format (GoogleTest 1.12's default printer,
compute-sanitizer's "=========" lines, the `swa-decode bench` table, pytest -q's last line), and
misbehaves as one environment variable says; unset, every run is clean:
  FAKE_GTEST      failed | nogpu | truncated | crash | count-mismatch
  FAKE_SANITIZER  TOOL:CASE, CASE one of no-summary (the tool's summary line is absent; racecheck
                  prints memcheck's "ERROR SUMMARY" line instead, the line it never prints),
                  errors (N > 0 with --error-exitcode), errors-exit0 (N > 0, exit code 0)
  FAKE_BENCH      no-rows | fail
  FAKE_PYTEST     none-passed
The gtest log is, but for times and test order, what build/tests/swa_decode_tests (GoogleTest
1.12.1) prints for the same tests without a GPU.
"""
import fnmatch
import os
import sys

CPU_TESTS = ["Validation.RejectsShortBlockTable", "Validation.RejectsWrongHeadDim",
             "TestingHarness.CpuBackendPassesTheCheck"]
GPU_TESTS = ["GpuDecode.RealisticBatch", "GpuDecode.LengthsAroundTheWindow", "GpuDecode.NoSinkNoLse",
             "GpuRandomConfigs.EveryKernelFamilyMatchesTheReference",
             "HeadsIndexScale/GpuDecodeShapes.MixedEdgeCases/H8_int32_bf16scale",
             "HeadsIndexScale/GpuDecodeShapes.MixedEdgeCases/H128_int64_fp32scale"]
# What the forced sm90 kernel cannot run: skipped with the family's why_not (tests/gpu/).
SM90_CANNOT_RUN = "HeadsIndexScale/GpuDecodeShapes.MixedEdgeCases/H8_int32_bf16scale"
FAILING = ["GpuDecode.LengthsAroundTheWindow", "HeadsIndexScale/GpuDecodeShapes.MixedEdgeCases/H128_int64_fp32scale"]
CRASHING = "GpuDecode.NoSinkNoLse"
RANDOM_CONFIGS = [
    "random-configs: seed=20260101 first=0 configs=1000 threads=16 wall_s=21.40 failed_configs=0",
    "random-configs: family=portable ran=1000 skipped=0 failed=0 max_rel_l2=2.113e-03 "
    "max_err_over_tol=0.412 max_lse_err=1.907e-06",
]
# GoogleTest's tags, each ten characters wide.
TAG = {"OK": "[       OK ]", "SKIPPED": "[  SKIPPED ]", "FAILED": "[  FAILED  ]"}
GETPARAM = ", where GetParam() = (128, 4-byte object <01-00 00-00>, 4-byte object <01-00 00-00>)"


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def selected(args):
    """The test names --gtest_filter keeps (positive patterns only: the script passes no others)."""
    patterns = ["*"]
    for arg in args:
        if arg.startswith("--gtest_filter="):
            patterns = arg.split("=", 1)[1].split("-", 1)[0].split(":")
    return [n for n in CPU_TESTS + GPU_TESTS if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def test_body(name, scenario, kernel):
    """What one test prints between its [ RUN ] line and its end line, and how it ends."""
    gpu = name in GPU_TESTS
    if gpu and scenario == "nogpu":
        return ["/work/tests/gpu/test_decode_gpu.cpp:78: Skipped", "no CUDA device: GPU tests skipped"], "SKIPPED"
    if kernel == "sm90" and name == SM90_CANNOT_RUN:
        return ["/work/tests/gpu/test_decode_gpu.cpp:83: Skipped",
                "kernel under test sm90 cannot run this case: num_heads = 8, sm90 needs a multiple of 64"], "SKIPPED"
    if gpu and scenario == "failed" and name in FAILING:
        return ["/work/tests/gpu/test_decode_gpu.cpp:96: Failure", "max |out - ref| 3.1 > tolerance 0.02"], "FAILED"
    return (RANDOM_CONFIGS if name.startswith("GpuRandomConfigs.") else []), "OK"


def swa_decode_tests(args):
    if "--gtest_list_tests" in args:
        print("Validation.\n  RejectsShortBlockTable")
        return 0
    scenario = os.environ.get("FAKE_GTEST", "")
    kernel = os.environ.get("SWA_DECODE_TEST_KERNEL", "auto")
    names = selected(args)
    suites = {}
    for name in names:
        suites.setdefault(name.rsplit(".", 1)[0], []).append(name)
    out = ["Running main() from ./googletest/src/gtest_main.cc"]
    out += [f"Note: Google Test filter = {a.split('=', 1)[1]}" for a in args if a.startswith("--gtest_filter=")]
    out += [f"[==========] Running {plural(len(names), 'test')} from {plural(len(suites), 'test suite')}.",
            "[----------] Global test environment set-up."]
    ended = {"OK": [], "SKIPPED": [], "FAILED": []}
    for suite, members in suites.items():
        out.append(f"[----------] {plural(len(members), 'test')} from {suite}")
        for name in members:
            out.append(f"[ RUN      ] {name}")
            if scenario == "crash" and name == CRASHING:
                print("\n".join(out), flush=True)
                return 139
            body, word = test_body(name, scenario, kernel)
            ended[word].append(name)
            param = GETPARAM if word == "FAILED" and "/" in name else ""
            out += body + [f"{TAG[word]} {name}{param} (3 ms)"]
        out += [f"[----------] {plural(len(members), 'test')} from {suite} ({3 * len(members)} ms total)", ""]
    if scenario == "truncated":
        print("\n".join(out))
        return 0
    passed = len(ended["OK"]) + (1 if scenario == "count-mismatch" else 0)
    out += ["[----------] Global test environment tear-down",
            f"[==========] {plural(len(names), 'test')} from {plural(len(suites), 'test suite')} ran."
            f" ({3 * len(names)} ms total)",
            f"[  PASSED  ] {plural(passed, 'test')}."]
    for word in ("SKIPPED", "FAILED"):
        if ended[word]:
            out.append(f"{TAG[word]} {plural(len(ended[word]), 'test')}, listed below:")
            out += [f"{TAG[word]} {n}" + (GETPARAM if word == "FAILED" and "/" in n else "") for n in ended[word]]
    if ended["FAILED"]:
        out += ["", f"{len(ended['FAILED']):2d} FAILED {'TEST' if len(ended['FAILED']) == 1 else 'TESTS'}"]
    print("\n".join(out))
    return 1 if ended["FAILED"] else 0


def compute_sanitizer(args):
    """compute-sanitizer --tool TOOL --error-exitcode N PROGRAM ARGS..."""
    tool, error_exitcode, program = args[1], int(args[3]), args[4:]
    sick_tool, _, case = os.environ.get("FAKE_SANITIZER", "").partition(":")
    case = case if sick_tool == tool else ""
    print("========= COMPUTE-SANITIZER", flush=True)
    rc = os.spawnvp(os.P_WAIT, program[0], program)
    count = 3 if case in ("errors", "errors-exit0") else 0
    if case == "no-summary":
        if tool == "racecheck":
            print("========= ERROR SUMMARY: 0 errors")
    elif tool == "racecheck":
        print(f"========= RACECHECK SUMMARY: {plural(count, 'hazard')} displayed ({count} errors, 0 warnings)")
    else:
        print(f"========= ERROR SUMMARY: {plural(count, 'error')}")
    return error_exitcode if case == "errors" else rc


def swa_decode(args):
    """swa-decode bench --heads H ... --json FILE"""
    scenario = os.environ.get("FAKE_BENCH", "")
    heads = args[args.index("--heads") + 1]
    json_path = args[args.index("--json") + 1]
    print("     T    H     W  kernel                       us        bytes     GB/s   floor_us   ratio"
          "  TFLOP/s   max_err    rel_l2  check")
    if scenario == "no-rows":
        print("error: no CUDA device")
        return 0
    check = "FAIL" if scenario == "fail" else "pass"
    for tokens in (128, 2048):
        print(f"{tokens:6d} {heads:>4} {128:5d}  {'portable_mma_g1':<20} {'10.90':>10} {327343 * tokens:12d}"
              f" {'3003':>8} {'0.08':>10} {'1.42x':>7} {'3.0':>8} {6.54e-02:9.2e} {1.66e-03:9.2e}"
              f"  {check} (64 of {tokens} tokens, decode() picks it)")
    with open(json_path, "w") as f:
        f.write('{"device": "fake", "rows": []}\n')
    return 1 if scenario == "fail" else 0


def python3(args):
    """python3 -m pip install ..., python3 -m pytest ..., python3 -P python/bench_vs_seed.py --json FILE"""
    if args[:2] == ["-m", "pip"]:
        print("Successfully installed swa-decode-0.4.0")
    elif args[:2] == ["-m", "pytest"] or args[:3] == ["-P", "-m", "pytest"]:
        if os.environ.get("FAKE_PYTEST") == "none-passed":
            print("sssssssssssssssssssss\n21 skipped in 0.41s")
        else:
            print("..........................s\n153 passed, 2 skipped in 41.20s")
    elif "--json" in args:
        with open(args[args.index("--json") + 1], "w") as f:
            f.write('{"rows": []}\n')
        print("seed 1.00x, swa_decode 0.21x")
    else:
        print(f"fake python3: unexpected arguments {args}", file=sys.stderr)
        return 2
    return 0


def nvidia_smi(args):
    print("NVIDIA H200 (fake)")
    return 0


TOOLS = {"swa_decode_tests": swa_decode_tests, "compute-sanitizer": compute_sanitizer, "swa-decode": swa_decode,
         "python3": python3, "nvidia-smi": nvidia_smi}

if __name__ == "__main__":
    sys.exit(TOOLS[sys.argv[1]](sys.argv[2:]))
