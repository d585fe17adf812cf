#include "tools/swa_decode_cli/report.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "swa_decode/swa_decode.h"
#include "swa_decode_cli/build_commit.h"

namespace swa_decode::cli {
namespace {

std::string json_number(std::optional<double> value) {
  if (!value || !std::isfinite(*value)) return "null";
  std::ostringstream s;
  s.precision(6);
  s << *value;
  return s.str();
}

std::string json_string(const std::string& text) {
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      quoted += '\\';
      quoted += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      quoted += escaped;
    } else {
      quoted += c;
    }
  }
  return quoted + "\"";
}

std::string cell(std::optional<double> value, const char* format) {
  if (!value) return "-";
  char text[32];
  std::snprintf(text, sizeof(text), format, *value);
  return text;
}

}  // namespace

void describe_batch(const testing::HostBatch& batch, int64_t calls, BenchRow& row) {
  const int64_t n = batch.num_tokens;
  const double per_call = 1.0 / static_cast<double>(calls), per_row = 1.0 / static_cast<double>(n);
  row.bytes = std::llround(static_cast<double>(batch.floor_bytes(0, n)) * per_call);
  row.flops = batch.floor_flops(0, n) * per_call;
  row.valid_per_token = static_cast<double>(batch.total_valid_entries(0, n)) * per_row;
  row.extra_entries = static_cast<double>(batch.total_extra_entries(0, n)) * per_row;
  double context = 0.0;
  for (int64_t c : batch.context) context += static_cast<double>(c);
  row.context = context * per_row;
}

void record_check(const testing::CheckReport& check, BenchRow& row) {
  row.tokens_checked = check.tokens_compared;
  row.tokens_scanned = check.tokens_total;
  row.max_err = check.max_abs_err;
  row.rel_l2 = check.rel_l2;
  row.check_ok = check.ok;
}

void print_table_header() {
  std::printf("%6s %4s %5s %-6s %7s  %-20s %5s %10s %12s %8s %8s %10s %-7s %7s %9s %9s  %s\n", "T", "H", "W",
              "layer", "extra", "kernel", "calls", "us", "bytes", "GB/s", "TFLOP/s", "floor_us", "bound", "ratio",
              "max_err", "rel_l2", "check");
}

void print_row(const BenchRow& r) {
  std::printf("%6lld %4lld %5lld %-6s %7.1f  %-20s %5lld %10s %12lld %8s %8s %10s %-7s %7s %9.2e %9.2e  %s (%lld of "
              "%lld tokens%s)\n",
              static_cast<long long>(r.tokens), static_cast<long long>(r.heads), static_cast<long long>(r.window),
              r.layer.c_str(), r.extra_entries, r.kernel.c_str(), static_cast<long long>(r.calls_per_graph),
              cell(r.us, "%.2f").c_str(),
              static_cast<long long>(r.bytes), cell(r.gbps, "%.0f").c_str(), cell(r.tflops, "%.1f").c_str(),
              cell(r.floor_us, "%.2f").c_str(), r.bound.empty() ? "-" : r.bound.c_str(), cell(r.ratio, "%.2fx").c_str(),
              r.max_err, r.rel_l2, r.check_ok ? "pass" : "FAIL", static_cast<long long>(r.tokens_checked),
              static_cast<long long>(r.tokens_scanned), r.selected ? ", decode() picks it" : "");
  std::fflush(stdout);
}

void write_json(const BenchReport& report, const std::string& path) {
  std::ostringstream j;
  j << "{\n  \"device\": " << json_string(report.device) << ",\n  \"commit\": " << json_string(report.commit)
    << ",\n  \"commit_dirty\": " << (report.commit_dirty ? "true" : "false")
    << ",\n  \"library_version\": " << json_string(swa_decode::version())
    << ",\n  \"copy_gbps\": " << json_number(report.copy_gbps)
    << ",\n  \"matmul_tflops\": " << json_number(report.matmul_tflops) << ",\n  \"rows\": [";
  for (size_t i = 0; i < report.rows.size(); ++i) {
    const BenchRow& r = report.rows[i];
    j << (i == 0 ? "\n" : ",\n") << "    {\"T\": " << r.tokens << ", \"H\": " << r.heads << ", \"W\": " << r.window
      << ", \"layer\": " << json_string(r.layer) << ", \"format\": " << json_string(r.format)
      << ", \"calls_per_graph\": " << r.calls_per_graph
      << ", \"context\": " << json_number(r.context) << ", \"extra_entries\": " << json_number(r.extra_entries)
      << ", \"us\": " << json_number(r.us) << ", \"floor_us\": " << json_number(r.floor_us)
      << ", \"memory_floor_us\": " << json_number(r.memory_floor_us)
      << ", \"compute_floor_us\": " << json_number(r.compute_floor_us)
      << ", \"bound\": " << (r.bound.empty() ? std::string("null") : json_string(r.bound))
      << ", \"ratio\": " << json_number(r.ratio) << ", \"flops\": " << json_number(r.flops)
      << ", \"gbps\": " << json_number(r.gbps)
      << ", \"tflops\": " << json_number(r.tflops) << ", \"max_err\": " << json_number(r.max_err)
      << ", \"rel_l2\": " << json_number(r.rel_l2) << ", \"kernel\": " << json_string(r.kernel)
      << ", \"selected\": " << (r.selected ? "true" : "false")
      << ", \"bytes\": " << r.bytes << ", \"valid_per_token\": " << json_number(r.valid_per_token)
      << ", \"index_type\": " << json_string(r.index_type) << ", \"input_sets\": " << r.input_sets
      << ", \"timing_samples\": " << r.timing_samples << ", \"tokens_checked\": " << r.tokens_checked
      << ", \"tokens_scanned\": " << r.tokens_scanned << ", \"check\": " << json_string(r.check_ok ? "pass" : "fail")
      << "}";
  }
  j << "\n  ]\n}\n";
  std::ofstream file(path);
  file << j.str();
  if (!file.good()) throw std::runtime_error("cannot write --json file '" + path + "'");
}

std::string git_commit(bool* dirty) {
  // Set by whoever builds elsewhere from a tree without git and knows the commit.
  if (const char* given = std::getenv("SWA_DECODE_COMMIT"); given != nullptr && *given != '\0') {
    const char* given_dirty = std::getenv("SWA_DECODE_COMMIT_DIRTY");
    *dirty = given_dirty != nullptr && std::string(given_dirty) == "1";
    return given;
  }
  *dirty = SWA_DECODE_BUILD_DIRTY != 0;
  return SWA_DECODE_BUILD_COMMIT;
}

}  // namespace swa_decode::cli
