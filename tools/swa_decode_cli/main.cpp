// swa-decode: the project's command-line tool. `swa-decode bench` is the main job (see usage()).
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "testing/device_buffer.h"
#include "tools/swa_decode_cli/bench.h"
#include "tools/swa_decode_cli/options.h"
#include "tools/swa_decode_cli/report.h"

int main(int argc, char** argv) {
  using namespace swa_decode::cli;
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(usage(), args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] != "bench") {
    std::fprintf(stderr, "swa-decode: unknown command '%s'\n\n%s", args[0].c_str(), usage());
    return 2;
  }
  for (const std::string& arg : args) {
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage(), stdout);
      return 0;
    }
  }

  BenchOptions options;
  try {
    options = parse_bench_options(std::vector<std::string>(args.begin() + 1, args.end()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swa-decode bench: %s\n\n%s", e.what(), usage());
    return 2;
  }

  try {
    BenchReport report;
    report.commit = git_commit(&report.commit_dirty);
    const bool ok = swa_decode::testing::cuda_device_available() ? run_bench_gpu(options, report)
                                                                  : run_bench_cpu(options, report);
    if (!options.json_path.empty()) {
      write_json(report, options.json_path);
      std::printf("wrote %s\n", options.json_path.c_str());
    }
    if (!ok) {
      std::fprintf(stderr, "swa-decode bench: a check against the float64 reference FAILED (see above)\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swa-decode bench: error: %s\n", e.what());
    return 2;
  }
}
