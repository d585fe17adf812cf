#include "testing/timing.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "src/api/decode.h"
#include "testing/cuda_check.h"
#include "testing/device_buffer.h"

namespace swa_decode::testing {
namespace {

class Event {
 public:
  Event() { SWAD_TESTING_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() { (void)cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept : event_(other.event_) { other.event_ = nullptr; }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

double elapsed_us(const Event& start, const Event& stop) {
  float ms = 0.0f;
  SWAD_TESTING_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return 1e3 * static_cast<double>(ms);
}

}  // namespace

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (values.size() % 2 == 1) return values[mid];
  const double upper = values[mid];
  return 0.5 * (upper + *std::max_element(values.begin(), values.begin() + mid));
}

double measure_copy_gbps(cudaStream_t stream, size_t bytes, int reps) {
  DeviceBuffer src(bytes), dst(bytes);
  src.fill_bytes(0x3C, stream);
  dst.fill_bytes(0, stream);
  SWAD_TESTING_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream));
  std::vector<Event> starts(reps), stops(reps);
  for (int i = 0; i < reps; ++i) {
    SWAD_TESTING_CUDA_CHECK(cudaEventRecord(starts[i].get(), stream));
    SWAD_TESTING_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream));
    SWAD_TESTING_CUDA_CHECK(cudaEventRecord(stops[i].get(), stream));
  }
  SWAD_TESTING_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> us(reps);
  for (int i = 0; i < reps; ++i) us[i] = elapsed_us(starts[i], stops[i]);
  return 2.0 * static_cast<double>(bytes) / (median(us) * 1e-6) / 1e9;
}

DecodeGraphs::DecodeGraphs(std::vector<DecodeArgs> sets, cudaStream_t stream, KernelId kernel,
                           int64_t calls_per_graph)
    : stream_(stream), kernel_(kernel), calls_per_graph_(calls_per_graph) {
  const auto num_sets = static_cast<int64_t>(sets.size());
  if (calls_per_graph < 1 || num_sets % calls_per_graph != 0) {
    throw std::invalid_argument("DecodeGraphs: calls_per_graph must be >= 1 and divide the " +
                                std::to_string(num_sets) + " input sets, got " + std::to_string(calls_per_graph));
  }
  try {
    capture(sets);
  } catch (...) {
    release();  // the destructor does not run for a constructor that throws
    throw;
  }
}

void DecodeGraphs::capture(const std::vector<DecodeArgs>& sets) {
  for (size_t first = 0; first < sets.size(); first += static_cast<size_t>(calls_per_graph_)) {
    SWAD_TESTING_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    Status status;
    size_t failed = first;
    for (size_t i = first; i < first + static_cast<size_t>(calls_per_graph_) && status.ok(); ++i) {
      DecodeArgs args = sets[i];
      args.stream = stream_;
      status = kernel_ == KernelId::kNone ? decode(args) : decode_with_kernel(args, kernel_);
      failed = i;
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    if (!status.ok()) {
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      throw std::runtime_error("decode() failed while capturing input set " + std::to_string(failed) +
                               " into a CUDA graph: " + status.message);
    }
    SWAD_TESTING_CUDA_CHECK(end);
    graphs_.push_back(graph);
    cudaGraphExec_t exec = nullptr;
    SWAD_TESTING_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    execs_.push_back(exec);
  }
}

DecodeGraphs::~DecodeGraphs() { release(); }

void DecodeGraphs::release() {
  for (cudaGraphExec_t exec : execs_) (void)cudaGraphExecDestroy(exec);
  for (cudaGraph_t graph : graphs_) (void)cudaGraphDestroy(graph);
  execs_.clear();
  graphs_.clear();
}

void DecodeGraphs::replay(size_t graph) { SWAD_TESTING_CUDA_CHECK(cudaGraphLaunch(execs_.at(graph), stream_)); }

void DecodeGraphs::replay_all() {
  for (size_t i = 0; i < execs_.size(); ++i) replay(i);
  SWAD_TESTING_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

GraphTiming DecodeGraphs::time(int64_t min_samples, int64_t min_rounds, int64_t warmup_rounds) {
  const int64_t graphs = static_cast<int64_t>(execs_.size());
  if (graphs == 0) return {};
  for (int64_t round = 0; round < warmup_rounds; ++round) {
    for (int64_t g = 0; g < graphs; ++g) replay(g);
  }
  const int64_t rounds = std::max(min_rounds, (min_samples + graphs - 1) / graphs);
  std::vector<Event> starts(rounds * graphs), stops(rounds * graphs);
  for (int64_t round = 0, i = 0; round < rounds; ++round) {
    for (int64_t g = 0; g < graphs; ++g, ++i) {
      SWAD_TESTING_CUDA_CHECK(cudaEventRecord(starts[i].get(), stream_));
      replay(g);
      SWAD_TESTING_CUDA_CHECK(cudaEventRecord(stops[i].get(), stream_));
    }
  }
  SWAD_TESTING_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<double> us(starts.size());
  for (size_t i = 0; i < us.size(); ++i) us[i] = elapsed_us(starts[i], stops[i]);
  GraphTiming timing;
  timing.samples = static_cast<int64_t>(us.size());
  timing.min_us = *std::min_element(us.begin(), us.end());
  timing.median_us = median(std::move(us));
  return timing;
}

}  // namespace swa_decode::testing
