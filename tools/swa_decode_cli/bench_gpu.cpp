// `swa-decode bench` on a GPU: per T, one realistic batch cut into input sets that together touch
// more than twice the L2, one CUDA graph per set, correctness first, then timed replays.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "swa_decode/limits.h"
#include "src/api/decode.h"
#include "testing/batch.h"
#include "testing/check.h"
#include "testing/cuda_check.h"
#include "testing/device_batch.h"
#include "testing/device_buffer.h"
#include "testing/timing.h"
#include "tools/swa_decode_cli/bench.h"

namespace swa_decode::cli {
namespace {

namespace st = swa_decode::testing;

constexpr int64_t kMaxInputSets = 4096;

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

// One row for kernel family `kernel` (kNone = decode()'s choice), or nothing when a forced family
// cannot run the shape (said on stdout).
std::optional<BenchRow> bench_one(const BenchOptions& o, int64_t T, KernelId kernel, const DeviceFacts& device,
                                  double copy_gbps, cudaStream_t stream) {
  // Enough sets that one round of replays touches > 2x L2, so no replay finds its inputs cached.
  const int64_t index_bytes = o.index_dtype == DType::kInt32 ? 4 : 8;
  const int64_t est_set_bytes = T * (4 * o.num_heads * kGpuHeadDim + o.window_size * (kGpuHeadDim + 2 + index_bytes));
  const int64_t sets = std::clamp<int64_t>((2 * device.l2_bytes + est_set_bytes - 1) / est_set_bytes, 2, kMaxInputSets);

  st::BatchOptions bo;
  bo.num_tokens = T * sets;
  bo.num_heads = o.num_heads;
  bo.head_dim = kGpuHeadDim;
  bo.window_size = o.window_size;
  bo.index_dtype = o.index_dtype;
  bo.lens_dtype = o.index_dtype;
  bo.with_sink = true;  // DeepSeek-V4 has a learned per-head sink
  bo.with_lse = true;   // engines merge with the compressed-KV branch through the LSE
  bo.seed = o.seed + static_cast<uint64_t>(T);
  const st::HostBatch batch = st::make_batch(bo);
  st::DeviceBatch device_batch = st::upload_batch(batch);

  std::vector<DecodeArgs> set_args;
  for (int64_t s = 0; s < sets; ++s) set_args.push_back(st::device_args(batch, device_batch, s * T, T, stream));
  const SupportInfo support =
      kernel == KernelId::kNone ? query_support(set_args[0]) : query_support_for_kernel(set_args[0], kernel);
  if (!support.supported && kernel != KernelId::kNone) {
    const KernelRecord* record = find_kernel(kernel);
    std::printf("T = %lld: kernel family %s skipped: %s\n", static_cast<long long>(T),
                record != nullptr ? record->family : "(unknown)", support.why_not.c_str());
    return std::nullopt;
  }
  if (!support.supported) {
    throw std::runtime_error("no kernel runs T = " + std::to_string(T) + ", H = " + std::to_string(o.num_heads) +
                             ", W = " + std::to_string(o.window_size) + ": " + support.why_not);
  }
  st::DecodeGraphs graphs(set_args, stream, kernel);

  // Correctness of what the graphs compute: outputs poisoned, every set replayed once.
  st::poison_outputs(device_batch, stream);
  graphs.replay_all();
  const st::Outputs outputs = st::download_outputs(device_batch);
  const std::vector<int64_t> checked = st::sample_tokens(batch.num_tokens, o.check_tokens, bo.seed ^ 0x5eed);
  const st::CheckReport check = st::check_outputs(batch, outputs, checked);
  if (!check.ok) std::printf("T = %lld: %s\n%s", static_cast<long long>(T), check.summary().c_str(), check.failures.c_str());

  const st::GraphTiming timing = graphs.time();
  const double bytes = static_cast<double>(batch.floor_bytes(0, batch.num_tokens)) / sets;
  const double valid_per_call = static_cast<double>(batch.total_valid_entries(0, batch.num_tokens)) / sets;
  const double seconds = timing.median_us * 1e-6;

  BenchRow row;
  row.tokens = T;
  row.heads = o.num_heads;
  row.window = o.window_size;
  row.kernel = support.kernel;
  row.selected = kernel == KernelId::kNone || query_support(set_args[0]).kernel == support.kernel;
  row.index_type = dtype_label(o.index_dtype);
  row.us = timing.median_us;
  row.floor_us = bytes / (copy_gbps * 1e9) * 1e6;
  row.ratio = *row.us / *row.floor_us;
  row.gbps = bytes / seconds / 1e9;
  row.tflops = 4.0 * o.num_heads * kGpuHeadDim * valid_per_call / seconds / 1e12;
  row.bytes = static_cast<int64_t>(std::llround(bytes));
  row.valid_per_token = valid_per_call / T;
  row.input_sets = sets;
  row.timing_samples = timing.samples;
  row.tokens_checked = check.tokens_compared;
  row.tokens_scanned = check.tokens_total;
  row.max_err = check.max_abs_err;
  row.rel_l2 = check.rel_l2;
  row.check_ok = check.ok;
  return row;
}

}  // namespace

bool run_bench_gpu(const BenchOptions& o, BenchReport& report) {
  const DeviceFacts device = read_device();
  st::Stream stream;
  const double copy_gbps = st::measure_copy_gbps(stream.get());
  report.device = device.name;
  report.copy_gbps = copy_gbps;

  std::printf("swa-decode bench: %s (%d SMs, %lld MiB L2), commit %s%s, library %s\n", device.name.c_str(),
              device.num_sms, static_cast<long long>(device.l2_bytes >> 20), report.commit.c_str(),
              report.commit_dirty ? " (+ uncommitted changes)" : "", swa_decode::version());
  std::printf("copy bandwidth (1 GiB device-to-device, read + write, median): %.0f GB/s\n", copy_gbps);
  std::printf("inputs: realistic DeepSeek-V4 batch, D = %lld, context 1..8192, block_size 256, %s indices and "
              "lens, bf16 inv_scale, sinks, lse on; unused cache slots poisoned with NaN\n",
              static_cast<long long>(kGpuHeadDim), dtype_label(o.index_dtype));
  std::printf("time: median of CUDA-event-timed CUDA-graph replays rotated over input sets touching > 2x L2;\n"
              "bytes: q + out + per valid entry (%lld B row + 2 B scale + index) = the floor; floor_us = bytes / "
              "copy bandwidth; TFLOP/s counts 4*H*D per valid entry\n",
              static_cast<long long>(kGpuHeadDim));
  std::printf("check: every output of every token scanned for NaN / unwritten elements; the float64 reference "
              "is slow, so up to %lld random tokens per T are compared with it\n\n",
              static_cast<long long>(o.check_tokens));
  print_table_header();
  bool ok = true;
  for (int64_t T : o.tokens) {
    for (KernelId kernel : o.kernels) {
      std::optional<BenchRow> row = bench_one(o, T, kernel, device, copy_gbps, stream.get());
      if (!row) continue;
      report.rows.push_back(*row);
      print_row(report.rows.back());
      ok = ok && report.rows.back().check_ok;
    }
  }
  return ok;
}

}  // namespace swa_decode::cli
