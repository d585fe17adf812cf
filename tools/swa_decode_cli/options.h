// Command-line options of `swa-decode bench`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "swa_decode/swa_decode.h"
#include "src/dispatch/select_kernel.h"

namespace swa_decode::cli {

struct BenchOptions {
  int64_t num_heads = 128;
  int64_t window_size = 128;
  std::vector<int64_t> tokens = {1, 8, 32, 128, 512, 2048};
  std::string json_path;  // empty = no JSON
  uint64_t seed = 2026;
  DType index_dtype = DType::kInt32;  // engines pass int32 (ANCHORS.md)
  int64_t check_tokens = 64;          // tokens per T compared against the float64 reference
  // Kernel families to time per T; KernelId::kNone = what decode() picks. "all" lists every family,
  // and a family that cannot run a shape is reported and skipped.
  std::vector<KernelId> kernels = {KernelId::kNone};
};

// Parses the arguments after "bench". Throws std::invalid_argument with a message naming the flag.
BenchOptions parse_bench_options(const std::vector<std::string>& args);

const char* usage();

}  // namespace swa_decode::cli
