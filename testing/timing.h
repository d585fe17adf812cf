// Timing the way ANCHORS.md measures: the decode call (or several back to back, a model's layers)
// captured in a CUDA graph, replayed, each replay timed with CUDA events, the median reported;
// several input sets rotated so the bytes a replay touches are not already in the 60 MiB L2; and
// the copy-bandwidth floor measured in the same run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "swa_decode/swa_decode.h"
#include "src/dispatch/select_kernel.h"

namespace swa_decode::testing {

// Device-to-device cudaMemcpyAsync of `bytes` (>= 1 GiB by default), median over `reps` copies;
// returns GB/s counting bytes read plus bytes written (10^9 bytes per GB).
double measure_copy_gbps(cudaStream_t stream, size_t bytes = size_t{1} << 30, int reps = 15);

struct GraphTiming {
  double median_us = 0.0;
  double min_us = 0.0;
  int64_t samples = 0;
};

// Instantiated CUDA graphs of `calls_per_graph` decode() calls each on `stream` (or
// decode_with_kernel(kernel) when `kernel` names a kernel family), back to back, each call on its
// own input set as a model's consecutive layers are: graph g holds sets [g * n, (g + 1) * n).
// Construction throws std::invalid_argument if calls_per_graph < 1 or does not divide the number
// of sets, std::runtime_error if capture fails or decode returns an error (the message carries
// decode's Status message).
class DecodeGraphs {
 public:
  DecodeGraphs(std::vector<DecodeArgs> sets, cudaStream_t stream, KernelId kernel = KernelId::kNone,
               int64_t calls_per_graph = 1);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  size_t size() const { return execs_.size(); }  // graphs, each of calls_per_graph() calls
  int64_t calls_per_graph() const { return calls_per_graph_; }
  void replay(size_t graph);  // enqueue one replay on the stream (no sync)
  void replay_all();          // every graph (so every set) once, then synchronize
  // Replays graphs round-robin, at least `min_samples` timed replays and at least `min_rounds` of
  // each graph, after `warmup_rounds` untimed rounds; each replay (all its calls) is timed alone
  // by two events.
  GraphTiming time(int64_t min_samples = 400, int64_t min_rounds = 10, int64_t warmup_rounds = 3);

 private:
  void capture(const std::vector<DecodeArgs>& sets);
  void release();

  cudaStream_t stream_;
  KernelId kernel_;
  int64_t calls_per_graph_;
  std::vector<cudaGraph_t> graphs_;
  std::vector<cudaGraphExec_t> execs_;
};

double median(std::vector<double> values);

}  // namespace swa_decode::testing
