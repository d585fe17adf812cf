#include "tools/swa_decode_cli/options.h"

#include <cmath>
#include <optional>
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
    using testing::LayerKind;
    auto context_line = [](LayerKind kind) {
      return std::string(testing::layer_name(kind)) + " " + std::to_string(testing::default_mean_context(kind)) +
             ", at most " + std::to_string(testing::max_mean_context(kind));
    };
    return std::string(
               "usage: swa-decode bench [options]\n"
               "       swa-decode --help\n"
               "\n"
               "bench: builds a realistic DeepSeek-V4 decode batch of one layer per T (every request its own\n"
               "context length, KV blocks scattered over a pool, window = its last min(len, W) positions\n"
               "padded with -1, every unused cache slot of every pool poisoned with NaN), runs the\n"
               "decode, checks it against the float64 CPU reference, and times CUDA-graph replays rotated\n"
               "over input sets larger than L2 against the floor: the larger of bytes / copy bandwidth and\n"
               "FLOPs / bf16 matmul rate (cuBLAS, 8192^3), both measured in the same run.\n"
               "Without a GPU it runs the CPU path on a small batch and says that no timing is meaningful.\n"
               "\n"
               "layers (contexts uniform in 1..2 x the mean context):\n"
               "  swa    the window alone (contexts 1..8192 by default)\n"
               "  c4a    the window + a top-k of the context / 4 compressed entries, drawn without\n"
               "         replacement, in a cache of blocks of 64; 1 row in 32 a padding row (lens 0)\n"
               "  c128a  the window + every one of the context / 128 compressed entries, in a cache of blocks\n"
               "         of 2 (a mean context of 65536 gives 512 entries, of 1048576 8192); padding rows too\n"
               "\n"
               "formats (of every source's cache rows):\n") +
           "  seed    D e4m3 bytes a row and a bf16 inverse scale per slot; window blocks of " +
           std::to_string(testing::kSeedWindowBlockSize) + "\n" +
           "  model1  FlashMLA's MODEL1 (vLLM's fp8_ds_mla): 448 e4m3 bytes + 64 bf16 RoPE values (576 B) a\n"
           "          row, 7 UE8M0 scales (8 B) a row in each block's footer, blocks padded to a multiple of\n"
           "          576 B; window blocks of " + std::to_string(testing::kModel1WindowBlockSize) +
           "; the floor counts " +
           std::to_string(testing::entry_cache_bytes(KvFormat::kModel1, kGpuHeadDim, DType::kBFloat16)) +
           " B a row read\n"
           "\n"
           "options:\n"
           "  --layer swa|c4a|c128a  the layer (default swa)\n"
           "  --format seed|model1   the cache rows of every source (default seed)\n"
           "  --context N            mean context length (default " + context_line(LayerKind::kSwa) + "; " +
           context_line(LayerKind::kC4a) + ";\n"
           "                         " + context_line(LayerKind::kC128a) + ")\n" +
           "  --extra-entries K      c4a only: the top-k, 1.." + std::to_string(kMaxExtraEntries) + " (default " +
           std::to_string(testing::default_top_k(1)) + ", " + std::to_string(testing::default_top_k(kMaxGpuHeads)) +
           " at H >= 128)\n" +
           "  --heads H              query heads, 1.." + std::to_string(kMaxGpuHeads) + " (default " +
           std::to_string(defaults.num_heads) + ")\n" +
           "  --window W             window_size, 1.." + std::to_string(kMaxWindow) + " (default " +
           std::to_string(defaults.window_size) + ")\n" +
           "  --tokens T1,T2,...     decode rows per batch (default " + tokens + ")\n" +
           "  --json FILE            also write the results as JSON\n"
           "  --seed N               seed of the generated inputs (default " + std::to_string(defaults.seed) + ")\n" +
           "  --index-type int32|int64  dtype of indices and lens (default int32)\n"
           "  --check-tokens N       tokens per T compared against the reference, at most (default " +
           std::to_string(defaults.check_tokens) + "; fewer where\n" +
           "                         they would cost the reference more than a few seconds; padding rows besides)\n" +
           "  --kernel " + kernel_choices("|") + "  kernel family to time (default auto: what decode() picks;\n" +
           "                         all: one row per family that runs the shape)\n" +
           "  --calls-per-graph N    decode calls back to back in each CUDA graph, each on its own input set\n"
           "                         (a model's layers), 1.." + std::to_string(kMaxCallsPerGraph) + "; times are per call (default " +
           std::to_string(defaults.calls_per_graph) + ")\n"
           "\n"
           "exit status: 0 when every check passed, 1 when a check failed, 2 on a usage or run error.\n";
  }();
  return text.c_str();
}

std::string describe_inputs(const BenchOptions& o) {
  using testing::LayerKind;
  const LayerKind kind = o.layer.kind;
  const bool model1 = o.layer.format == KvFormat::kModel1;
  const int64_t mean = o.layer.mean_context != 0 ? o.layer.mean_context : testing::default_mean_context(kind);
  const int64_t window_block = testing::layer_options(o.layer, 0, o.num_heads, o.window_size, o.index_dtype, o.seed).block_size;
  std::string text = std::string("inputs: DeepSeek-V4 ") + testing::layer_name(kind) + " layer, D = " +
                     std::to_string(kGpuHeadDim) + ", W = " + std::to_string(o.window_size) +
                     ", contexts uniform in 1.." + std::to_string(2 * mean) + " (mean " + std::to_string(mean) +
                     "), window blocks of " + std::to_string(window_block) + " scattered over a pool of " +
                     (kind == LayerKind::kSwa ? "the whole contexts" : "the windows' blocks");
  if (kind == LayerKind::kC4a) {
    const int64_t top_k = o.layer.top_k != 0 ? o.layer.top_k : testing::default_top_k(o.num_heads);
    text += ";\n  extra: a top-" + std::to_string(top_k) + " of the context / " +
            std::to_string(testing::kC4aCompressRatio) + " compressed entries in a pool of blocks of " +
            std::to_string(testing::kC4aBlockSize);
  } else if (kind == LayerKind::kC128a) {
    text += ";\n  extra: every one of the context / " + std::to_string(testing::kC128aCompressRatio) +
            " compressed entries in a pool of blocks of " + std::to_string(testing::kC128aBlockSize);
  }
  if (kind != LayerKind::kSwa) {
    text += "; 1 row in " + std::to_string(std::llround(1.0 / testing::kLayerPaddingRowFraction)) +
            " a padding row (lens 0 in both sources)";
  }
  return text + ";\n  " + (o.index_dtype == DType::kInt32 ? "int32" : "int64") + " ids and lens, " +
         (model1 ? "MODEL1 rows (576 B, scale rows in each block's footer, blocks padded to 576 B)"
                 : "seed rows (D e4m3 bytes) with bf16 scales") +
         ", sinks, lse on; unused slots of every pool poisoned with NaN\n";
}

BenchOptions parse_bench_options(const std::vector<std::string>& args) {
  BenchOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw std::invalid_argument(flag + " expects a value");
      return args[++i];
    };
    if (flag == "--layer") {
      const std::string& name = value();
      const std::optional<testing::LayerKind> kind = testing::parse_layer(name);
      if (!kind) throw std::invalid_argument("--layer expects swa, c4a or c128a, got '" + name + "'");
      o.layer.kind = *kind;
    } else if (flag == "--format") {
      const std::string& name = value();
      const std::optional<KvFormat> format = testing::parse_format(name);
      if (!format) throw std::invalid_argument("--format expects seed or model1, got '" + name + "'");
      o.layer.format = *format;
    } else if (flag == "--context") {
      o.layer.mean_context = parse_int(flag, value(), 1);
    } else if (flag == "--extra-entries") {
      o.layer.top_k = parse_int(flag, value(), 1);
    } else if (flag == "--heads") {
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
    } else if (flag == "--calls-per-graph") {
      o.calls_per_graph = parse_int(flag, value(), 1);
      if (o.calls_per_graph > kMaxCallsPerGraph) {
        throw std::invalid_argument("--calls-per-graph expects an integer <= " + std::to_string(kMaxCallsPerGraph) +
                                    ", got " + std::to_string(o.calls_per_graph));
      }
    } else {
      throw std::invalid_argument("unknown option '" + flag + "'");
    }
  }
  if (const std::string problem = testing::layer_problem(o.layer, o.num_heads); !problem.empty()) {
    throw std::invalid_argument("--layer " + std::string(testing::layer_name(o.layer.kind)) +
                                " with --context / --extra-entries: " + problem);
  }
  return o;
}

}  // namespace swa_decode::cli
