// `swa-decode bench` on a GPU: per T, one realistic batch of the layer cut into input sets that
// together touch more than twice the L2, one CUDA graph per set, correctness first, then timed
// replays against the larger of the memory and the compute floor.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "swa_decode/limits.h"
#include "src/api/decode.h"
#include "testing/batch.h"
#include "testing/check.h"
#include "testing/cuda_check.h"
#include "testing/device_batch.h"
#include "testing/device_buffer.h"
#include "testing/layer.h"
#include "testing/parallel_for.h"
#include "testing/timing.h"
#include "tools/swa_decode_cli/bench.h"
#include "tools/swa_decode_cli/matmul_peak.h"

namespace swa_decode::cli {
namespace {

namespace st = swa_decode::testing;

struct DeviceFacts {
  std::string name;
  int64_t l2_bytes = 0;
  int num_sms = 0;
};

DeviceFacts read_device() {
  int ordinal = 0;
  SWAD_TESTING_CUDA_CHECK(cudaGetDevice(&ordinal));
  cudaDeviceProp prop{};
  SWAD_TESTING_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  return DeviceFacts{.name = prop.name, .l2_bytes = prop.l2CacheSize, .num_sms = prop.multiProcessorCount};
}

// The reference check of one row may spend this many multiply-adds: 16 GMAC is ~1-2 s on the
// H200 machine's 16 cores (~0.5-1 GMAC/s a core). A C128A row at a 1M context and H = 128 costs
// ~1.1 GMAC a token, so such a T checks ~14 tokens; a window-only row (17 MMAC a token at H = 128)
// checks all --check-tokens.
constexpr int64_t kBenchReferenceMacs = 16'000'000'000;

// The two rates a row's floor divides by, both measured at the start of the run.
struct FloorRates {
  double copy_gbps = 0.0;       // device-to-device copy, read + write
  double matmul_tflops = 0.0;   // cuBLAS bf16 GEMM, fp32 accumulate
};

// One row for kernel family `kernel` (kNone = decode()'s choice), or nothing when that family (or,
// for decode()'s choice, every family) cannot run the shape: said on stdout, as the kernels of a
// build may not read every format yet.
std::optional<BenchRow> bench_one(const BenchOptions& o, int64_t T, KernelId kernel, const DeviceFacts& device,
                                  const FloorRates& rates, cudaStream_t stream) {
  // Enough sets that one round of replays touches > 2x L2, so no replay finds its inputs cached:
  // per row q and out, and per window or extra entry its cache bytes (a row and a bf16 scale, or a
  // MODEL1 row and its scale row) and an id. A graph of calls_per_graph calls reads that many sets
  // (a model's layers, each its own inputs); at least two graphs, so consecutive replays differ.
  const int64_t index_bytes = o.index_dtype == DType::kInt32 ? 4 : 8;
  const int64_t entries = o.window_size + st::expected_extra_entries(o.layer, o.num_heads);
  const int64_t entry_bytes = st::entry_cache_bytes(o.layer.format, kGpuHeadDim, DType::kBFloat16) + index_bytes;
  const int64_t est_set_bytes = T * (4 * o.num_heads * kGpuHeadDim + entries * entry_bytes);
  const int64_t calls = o.calls_per_graph;
  const int64_t est_graph_bytes = est_set_bytes * calls;
  const int64_t graphs =
      std::clamp<int64_t>((2 * device.l2_bytes + est_graph_bytes - 1) / est_graph_bytes, 2, kMaxInputSets / calls);
  const int64_t sets = graphs * calls;

  const st::BatchOptions bo = st::layer_options(o.layer, T * sets, o.num_heads, o.window_size, o.index_dtype,
                                                o.seed + static_cast<uint64_t>(T));
  const st::HostBatch batch = st::make_batch(bo);
  st::DeviceBatch device_batch = st::upload_batch(batch);

  std::vector<DecodeArgs> set_args;
  for (int64_t s = 0; s < sets; ++s) set_args.push_back(st::device_args(batch, device_batch, s * T, T, stream));
  const SupportInfo support =
      kernel == KernelId::kNone ? query_support(set_args[0]) : query_support_for_kernel(set_args[0], kernel);
  if (!support.supported) {
    const KernelRecord* record = find_kernel(kernel);
    const std::string family = kernel == KernelId::kNone ? std::string("decode()'s choice (every family)")
                               : record != nullptr       ? std::string("kernel family ") + record->family
                                                         : std::string("kernel family (unknown)");
    std::printf("T = %lld: %s skipped (%s layer, %s rows): %s\n", static_cast<long long>(T), family.c_str(),
                st::layer_name(o.layer.kind), st::format_name(o.layer.format), support.why_not.c_str());
    return std::nullopt;
  }
  st::DecodeGraphs graph_set(set_args, stream, kernel, calls);

  // Correctness of what the graphs compute: outputs poisoned, every graph (so every call) replayed once.
  st::poison_outputs(device_batch, stream);
  graph_set.replay_all();
  const st::Outputs outputs = st::download_outputs(device_batch);
  const std::vector<int64_t> checked =
      st::budgeted_tokens(batch, kBenchReferenceMacs, o.check_tokens, bo.seed ^ 0x5eed);
  const st::CheckReport check = st::check_outputs(batch, outputs, checked, {}, st::host_threads());
  if (!check.ok) std::printf("T = %lld: %s\n%s", static_cast<long long>(T), check.summary().c_str(), check.failures.c_str());

  const st::GraphTiming timing = graph_set.time();
  const double seconds = timing.median_us / static_cast<double>(calls) * 1e-6;  // per call

  BenchRow row;
  row.tokens = T;
  row.heads = o.num_heads;
  row.window = o.window_size;
  row.layer = st::layer_name(o.layer.kind);
  row.format = st::format_name(o.layer.format);
  row.kernel = support.kernel;
  row.selected = kernel == KernelId::kNone || query_support(set_args[0]).kernel == support.kernel;
  row.index_type = dtype_label(o.index_dtype);
  describe_batch(batch, sets, row);
  row.calls_per_graph = calls;
  row.us = seconds * 1e6;
  row.memory_floor_us = static_cast<double>(row.bytes) / (rates.copy_gbps * 1e9) * 1e6;
  row.compute_floor_us = row.flops / (rates.matmul_tflops * 1e12) * 1e6;
  const bool compute_bound = *row.compute_floor_us > *row.memory_floor_us;
  row.floor_us = compute_bound ? row.compute_floor_us : row.memory_floor_us;
  row.bound = compute_bound ? "compute" : "memory";
  row.ratio = *row.us / *row.floor_us;
  row.gbps = static_cast<double>(row.bytes) / seconds / 1e9;
  row.tflops = row.flops / seconds / 1e12;
  row.input_sets = sets;
  row.timing_samples = timing.samples;
  record_check(check, row);
  return row;
}

}  // namespace

bool run_bench_gpu(const BenchOptions& o, BenchReport& report) {
  const DeviceFacts device = read_device();
  st::Stream stream;
  const FloorRates rates{.copy_gbps = st::measure_copy_gbps(stream.get()),
                         .matmul_tflops = measure_matmul_tflops(stream.get())};
  report.device = device.name;
  report.copy_gbps = rates.copy_gbps;
  report.matmul_tflops = rates.matmul_tflops;

  std::printf("swa-decode bench: %s (%d SMs, %lld MiB L2), commit %s%s, library %s\n", device.name.c_str(),
              device.num_sms, static_cast<long long>(device.l2_bytes >> 20), report.commit.c_str(),
              report.commit_dirty ? " (+ uncommitted changes)" : "", swa_decode::version());
  std::printf("copy bandwidth (1 GiB device-to-device, read + write, median): %.0f GB/s\n", rates.copy_gbps);
  std::printf("bf16 matmul (cuBLAS 8192^3, fp32 accumulate, median): %.0f TFLOP/s\n", rates.matmul_tflops);
  std::fputs(describe_inputs(o).c_str(), stdout);
  const std::string entry_bytes =
      o.layer.format == KvFormat::kModel1
          ? std::to_string(st::entry_cache_bytes(KvFormat::kModel1, kGpuHeadDim, DType::kBFloat16)) +
                " B: the MODEL1 row and its scale row"
          : std::to_string(kGpuHeadDim) + " B row + 2 B scale";
  std::printf("time: median of CUDA-event-timed CUDA-graph replays rotated over input sets touching > 2x L2,\n"
              "per call: each graph holds %lld decode call%s back to back (calls), each on its own input set, and\n"
              "its replay time is divided by that; the bytes, FLOPs and floor are per call too;\n"
              "bytes: q + out + per valid entry of either source (%s + index); FLOPs: 4*H*D per "
              "valid entry;\nfloor_us = max(bytes / copy bandwidth, FLOPs / matmul rate), bound = the larger; "
              "ratio = us / floor_us\n",
              static_cast<long long>(o.calls_per_graph), o.calls_per_graph == 1 ? "" : "s", entry_bytes.c_str());
  std::printf("check: every output of every token scanned for NaN / unwritten elements; the float64 reference "
              "is slow, so up to %lld random tokens per T (fewer past %.0f GMAC, padding rows besides) are compared "
              "with it\n\n",
              static_cast<long long>(o.check_tokens), static_cast<double>(kBenchReferenceMacs) * 1e-9);
  print_table_header();
  bool ok = true;
  for (int64_t T : o.tokens) {
    for (KernelId kernel : o.kernels) {
      std::optional<BenchRow> row = bench_one(o, T, kernel, device, rates, stream.get());
      if (!row) continue;
      report.rows.push_back(*row);
      print_row(report.rows.back());
      ok = ok && report.rows.back().check_ok;
    }
  }
  return ok;
}

}  // namespace swa_decode::cli
