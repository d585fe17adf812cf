// Command-line options of `swa-decode bench`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "swa_decode/swa_decode.h"
#include "src/dispatch/select_kernel.h"
#include "testing/layer.h"

namespace swa_decode::cli {

// Input sets one bench row builds at most (each its own q, ids and outputs on the device), and so
// the calls one graph may hold: the timing rotates over at least two graphs.
inline constexpr int64_t kMaxInputSets = 4096;
inline constexpr int64_t kMaxCallsPerGraph = kMaxInputSets / 2;

struct BenchOptions {
  // The DeepSeek-V4 layer the batches are (testing/layer.h): its mean context (0 = the layer's
  // default), for c4a its top-k of compressed entries (0 = 512, or 1024 at H >= 128), and the row
  // format of every source (--format seed|model1).
  testing::LayerSpec layer;
  int64_t num_heads = 128;
  int64_t window_size = 128;
  std::vector<int64_t> tokens = {1, 8, 32, 128, 512, 2048};
  std::string json_path;  // empty = no JSON
  uint64_t seed = 2026;
  DType index_dtype = DType::kInt32;  // engines pass int32 (ANCHORS.md)
  // Tokens per T compared against the float64 reference, at most: fewer where they would cost the
  // reference more than kBenchReferenceMacs (bench_gpu.cpp), every padding row besides.
  int64_t check_tokens = 64;
  // Kernel families to time per T; KernelId::kNone = what decode() picks. "all" lists every family,
  // and a family that cannot run a shape is reported and skipped.
  std::vector<KernelId> kernels = {KernelId::kNone};
  // Decode calls per CUDA graph, back to back, each on its own input set (a model's consecutive
  // layers); a row's time is per call. 1 = one call per graph.
  int64_t calls_per_graph = 1;
};

// Parses the arguments after "bench". Throws std::invalid_argument with a message naming the flag.
BenchOptions parse_bench_options(const std::vector<std::string>& args);

const char* usage();

// One paragraph saying what the batches of `options` are (the layer, its contexts and pools, the
// dtypes), for the bench's preamble.
std::string describe_inputs(const BenchOptions& options);

}  // namespace swa_decode::cli
