// Rows of `swa-decode bench`: the printed table and the JSON file (bench/results/*.json).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "testing/batch.h"
#include "testing/check.h"

namespace swa_decode::cli {

struct BenchRow {
  int64_t tokens = 0, heads = 0, window = 0;
  std::string layer;               // "swa", "c4a" or "c128a" (testing/layer.h)
  std::string format = "seed";     // the cache row format of every source: "seed" or "model1" (testing/layer.h)
  double context = 0.0;            // mean context length per row
  double extra_entries = 0.0;      // mean valid extra entries per row
  std::string kernel;
  bool selected = false;           // the kernel decode() picks for this shape (--kernel all times others too)
  std::string index_type;
  // Decode calls back to back in each timed CUDA graph, each on its own input set; us and the
  // floors are per call. 1 on the CPU path, which runs one call and times none.
  int64_t calls_per_graph = 1;
  // Timing fields are empty on the CPU path, where no timing is meaningful. floor_us is the larger
  // of memory_floor_us (bytes / copy bandwidth) and compute_floor_us (flops / bf16 matmul rate),
  // `bound` says which; ratio = us / floor_us.
  std::optional<double> us, floor_us, memory_floor_us, compute_floor_us, ratio, gbps, tflops;
  std::string bound;               // "memory" or "compute"; empty without floors
  int64_t bytes = 0;               // floor bytes per decode call (ANCHORS.md, "The floor")
  double flops = 0.0;              // per decode call: 4 * H * D per valid entry of either source
  double valid_per_token = 0.0;    // mean valid entries per token, both sources
  int64_t input_sets = 0;          // rotated sets (each one graph)
  int64_t timing_samples = 0;
  int64_t tokens_checked = 0;      // tokens compared against the float64 reference
  int64_t tokens_scanned = 0;      // tokens scanned for NaN / unwritten output
  double max_err = 0.0, rel_l2 = 0.0;
  bool check_ok = false;
};

struct BenchReport {
  std::string device;
  std::string commit;
  bool commit_dirty = false;
  std::optional<double> copy_gbps;
  std::optional<double> matmul_tflops;  // cuBLAS bf16 8192^3 GEMM, fp32 accumulate, median
  std::vector<BenchRow> rows;
};

// What a row says about its batch, `calls` decode calls of equal size (the bench's input sets):
// per call its bytes and FLOPs; per row (token) its mean valid entries, extra entries and context.
void describe_batch(const testing::HostBatch& batch, int64_t calls, BenchRow& row);
// The row's check fields from a check's report.
void record_check(const testing::CheckReport& check, BenchRow& row);

void print_table_header();
void print_row(const BenchRow& row);
// Throws std::runtime_error if the file cannot be written.
void write_json(const BenchReport& report, const std::string& path);

// The commit this binary was built from and whether tracked files differed from it (stamped at
// build time: tools/stamp_commit.cmake; "unknown" without git), unless $SWA_DECODE_COMMIT (and
// $SWA_DECODE_COMMIT_DIRTY=1) say otherwise.
std::string git_commit(bool* dirty);

}  // namespace swa_decode::cli
