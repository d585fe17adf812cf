#include "tools/swa_decode_cli/options.h"

#include <sstream>
#include <stdexcept>
#include <string>

#include "swa_decode/limits.h"

namespace swa_decode::cli {
namespace {

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min_value) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < min_value) {
    throw std::invalid_argument(flag + " expects an integer >= " + std::to_string(min_value) + ", got '" +
                                text + "'");
  }
  return value;
}

// "auto", every kernel family, "all", joined by `separator`: what --kernel accepts.
std::string kernel_choices(const char* separator) {
  std::string choices = "auto";
  for (const KernelRecord* record : kernel_records()) choices.append(separator).append(record->family);
  return choices.append(separator).append("all");
}

}  // namespace

const char* usage() {
  // Built once from the library's limits and BenchOptions' defaults, so the help never states a
  // bound or a default the code does not apply.
  static const std::string text = [] {
    const BenchOptions defaults;
    std::string tokens;
    for (const int64_t t : defaults.tokens) {
      if (!tokens.empty()) tokens += ',';
      tokens += std::to_string(t);
    }
    return std::string(
               "usage: swa-decode bench [options]\n"
               "       swa-decode --help\n"
               "\n"
               "bench: builds a realistic DeepSeek-V4 decode batch per T (every request its own context\n"
               "length in 1..8192, KV blocks of 256 scattered over a pool, window = its last min(len, W)\n"
               "positions padded with -1, every unused cache slot poisoned with NaN), runs the decode,\n"
               "checks it against the float64 CPU reference, and times CUDA-graph replays rotated over\n"
               "input sets larger than L2 against the copy bandwidth measured in the same run.\n"
               "Without a GPU it runs the CPU path on a small batch and says that no timing is meaningful.\n"
               "\n"
               "options:\n") +
           "  --heads H              query heads, 1.." + std::to_string(kMaxGpuHeads) + " (default " +
           std::to_string(defaults.num_heads) + ")\n" +
           "  --window W             window_size, 1.." + std::to_string(kMaxWindow) + " (default " +
           std::to_string(defaults.window_size) + ")\n" +
           "  --tokens T1,T2,...     decode rows per batch (default " + tokens + ")\n" +
           "  --json FILE            also write the results as JSON\n"
           "  --seed N               seed of the generated inputs (default " + std::to_string(defaults.seed) + ")\n" +
           "  --index-type int32|int64  dtype of indices and lens (default int32)\n"
           "  --check-tokens N       tokens per T compared against the reference (default " +
           std::to_string(defaults.check_tokens) + ")\n" +
           "  --kernel " + kernel_choices("|") + "  kernel family to time (default auto: what decode() picks;\n" +
           "                         all: one row per family that runs the shape)\n"
           "\n"
           "exit status: 0 when every check passed, 1 when a check failed, 2 on a usage or run error.\n";
  }();
  return text.c_str();
}

BenchOptions parse_bench_options(const std::vector<std::string>& args) {
  BenchOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw std::invalid_argument(flag + " expects a value");
      return args[++i];
    };
    if (flag == "--heads") {
      o.num_heads = parse_int(flag, value(), 1);
    } else if (flag == "--window") {
      o.window_size = parse_int(flag, value(), 1);
    } else if (flag == "--tokens") {
      o.tokens.clear();
      std::stringstream list(value());
      for (std::string item; std::getline(list, item, ',');) o.tokens.push_back(parse_int(flag, item, 1));
      if (o.tokens.empty()) throw std::invalid_argument("--tokens expects a comma-separated list, got none");
    } else if (flag == "--json") {
      o.json_path = value();
    } else if (flag == "--seed") {
      o.seed = static_cast<uint64_t>(parse_int(flag, value(), 0));
    } else if (flag == "--index-type") {
      const std::string& type = value();
      if (type == "int32") {
        o.index_dtype = DType::kInt32;
      } else if (type == "int64") {
        o.index_dtype = DType::kInt64;
      } else {
        throw std::invalid_argument("--index-type expects int32 or int64, got '" + type + "'");
      }
    } else if (flag == "--kernel") {
      const std::string& kernel = value();
      if (kernel == "auto") {
        o.kernels = {KernelId::kNone};
      } else if (kernel == "all") {
        o.kernels.clear();
        for (const KernelRecord* record : kernel_records()) o.kernels.push_back(record->id);
      } else if (const KernelRecord* record = find_kernel(kernel)) {
        o.kernels = {record->id};
      } else {
        throw std::invalid_argument("--kernel expects " + kernel_choices(", ") + ", got '" + kernel + "'");
      }
    } else if (flag == "--check-tokens") {
      o.check_tokens = parse_int(flag, value(), 1);
    } else {
      throw std::invalid_argument("unknown option '" + flag + "'");
    }
  }
  return o;
}

}  // namespace swa_decode::cli
