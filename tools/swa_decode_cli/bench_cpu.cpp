// `swa-decode bench` without a GPU: the CPU backend on a small batch of the layer, checked, never timed.
#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "swa_decode/limits.h"
#include "testing/batch.h"
#include "testing/check.h"
#include "testing/device_batch.h"
#include "testing/layer.h"
#include "testing/parallel_for.h"
#include "tools/swa_decode_cli/bench.h"

namespace swa_decode::cli {

namespace st = swa_decode::testing;

bool run_bench_cpu(const BenchOptions& o, BenchReport& report) {
  constexpr int64_t kTokens = 2;
  const int64_t heads = std::min<int64_t>(o.num_heads, 16);
  report.device = "none (no CUDA device; CPU reference backend)";
  std::printf("swa-decode bench: NO CUDA DEVICE FOUND. Running the CPU backend (Backend::kCpu, the float64\n"
              "reference) on a small batch instead: T = %lld, H = %lld, W = %lld, D = %lld, one call (--tokens and\n"
              "--calls-per-graph are ignored).\n"
              "This checks the argument path, the poisoning and the bf16/lse outputs; it is not a benchmark and\n"
              "no timing is meaningful, so none is reported (nor any floor). commit %s%s, library %s\n",
              static_cast<long long>(kTokens), static_cast<long long>(heads),
              static_cast<long long>(o.window_size), static_cast<long long>(kGpuHeadDim), report.commit.c_str(),
              report.commit_dirty ? " (+ uncommitted changes)" : "", swa_decode::version());
  std::printf("%s\n", describe_inputs(o).c_str());

  // The top-k a c4a layer takes by default follows the heads asked for, not the 16 run here.
  st::LayerSpec layer = o.layer;
  if (layer.kind == st::LayerKind::kC4a && layer.top_k == 0) layer.top_k = st::default_top_k(o.num_heads);
  const st::HostBatch batch = st::make_batch(st::layer_options(layer, kTokens, heads, o.window_size, o.index_dtype, o.seed));
  st::HostTensors tensors = st::materialize_host(batch);
  const DecodeArgs args = st::host_args(batch, tensors);
  const SupportInfo support = query_support(args);
  if (!support.supported) throw std::runtime_error("the CPU backend refused the batch: " + support.why_not);
  const Status status = decode(args);
  if (!status.ok()) throw std::runtime_error("decode (CPU backend) failed: " + status.message);

  const st::Outputs outputs{.out = tensors.out, .lse = tensors.lse};
  const st::CheckReport check = st::check_outputs(batch, outputs, {}, {}, st::host_threads());
  if (!check.ok) std::printf("%s\n%s", check.summary().c_str(), check.failures.c_str());

  BenchRow row;
  row.tokens = kTokens;
  row.heads = heads;
  row.window = o.window_size;
  row.layer = st::layer_name(o.layer.kind);
  row.format = st::format_name(o.layer.format);
  row.kernel = support.kernel;
  row.selected = true;
  row.index_type = dtype_label(o.index_dtype);
  describe_batch(batch, 1, row);
  row.input_sets = 1;
  record_check(check, row);
  print_table_header();
  print_row(row);
  report.rows.push_back(row);
  return check.ok;
}

}  // namespace swa_decode::cli
