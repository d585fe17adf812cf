// Rows of `swa-decode bench`: the printed table and the JSON file (bench/results/*.json).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace swa_decode::cli {

struct BenchRow {
  int64_t tokens = 0, heads = 0, window = 0;
  std::string kernel;
  bool selected = false;           // the kernel decode() picks for this shape (--kernel all times others too)
  std::string index_type;
  // Timing fields are empty on the CPU path, where no timing is meaningful.
  std::optional<double> us, floor_us, ratio, gbps, tflops;
  int64_t bytes = 0;               // floor bytes per decode call (ANCHORS.md, "The floor")
  double valid_per_token = 0.0;    // mean valid entries per token
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
  std::vector<BenchRow> rows;
};

void print_table_header();
void print_row(const BenchRow& row);
// Throws std::runtime_error if the file cannot be written.
void write_json(const BenchReport& report, const std::string& path);

// HEAD of the source checkout (git at run time), else the configure-time hash, else "unknown".
std::string git_commit(bool* dirty);

}  // namespace swa_decode::cli
