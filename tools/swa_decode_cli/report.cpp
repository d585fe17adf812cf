#include "tools/swa_decode_cli/report.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "swa_decode/swa_decode.h"

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

// Output of a shell command, trimmed; empty if it fails.
std::string run_command(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string output;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  if (pclose(pipe) != 0) return "";
  while (!output.empty() && (output.back() == '\n' || output.back() == ' ')) output.pop_back();
  return output;
}

}  // namespace

void print_table_header() {
  std::printf("%6s %4s %5s  %-20s %10s %12s %8s %10s %7s %8s %9s %9s  %s\n", "T", "H", "W", "kernel",
              "us", "bytes", "GB/s", "floor_us", "ratio", "TFLOP/s", "max_err", "rel_l2", "check");
}

void print_row(const BenchRow& r) {
  std::printf("%6lld %4lld %5lld  %-20s %10s %12lld %8s %10s %7s %8s %9.2e %9.2e  %s (%lld of %lld tokens%s)\n",
              static_cast<long long>(r.tokens), static_cast<long long>(r.heads),
              static_cast<long long>(r.window), r.kernel.c_str(), cell(r.us, "%.2f").c_str(),
              static_cast<long long>(r.bytes), cell(r.gbps, "%.0f").c_str(), cell(r.floor_us, "%.2f").c_str(),
              cell(r.ratio, "%.2fx").c_str(), cell(r.tflops, "%.1f").c_str(), r.max_err, r.rel_l2,
              r.check_ok ? "pass" : "FAIL", static_cast<long long>(r.tokens_checked),
              static_cast<long long>(r.tokens_scanned), r.selected ? ", decode() picks it" : "");
  std::fflush(stdout);
}

void write_json(const BenchReport& report, const std::string& path) {
  std::ostringstream j;
  j << "{\n  \"device\": " << json_string(report.device) << ",\n  \"commit\": " << json_string(report.commit)
    << ",\n  \"commit_dirty\": " << (report.commit_dirty ? "true" : "false")
    << ",\n  \"library_version\": " << json_string(swa_decode::version())
    << ",\n  \"copy_gbps\": " << json_number(report.copy_gbps) << ",\n  \"rows\": [";
  for (size_t i = 0; i < report.rows.size(); ++i) {
    const BenchRow& r = report.rows[i];
    j << (i == 0 ? "\n" : ",\n") << "    {\"T\": " << r.tokens << ", \"H\": " << r.heads << ", \"W\": " << r.window
      << ", \"us\": " << json_number(r.us) << ", \"floor_us\": " << json_number(r.floor_us)
      << ", \"ratio\": " << json_number(r.ratio) << ", \"gbps\": " << json_number(r.gbps)
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
  // A copy of the tree without .git (the lent GPU machine) gets the commit from whoever sent it.
  if (const char* given = std::getenv("SWA_DECODE_COMMIT"); given != nullptr && *given != '\0') {
    const char* given_dirty = std::getenv("SWA_DECODE_COMMIT_DIRTY");
    *dirty = given_dirty != nullptr && std::string(given_dirty) == "1";
    return given;
  }
  const std::string git = std::string("git -C '") + SWA_DECODE_SOURCE_DIR + "' ";
  std::string commit = run_command(git + "rev-parse HEAD 2>/dev/null");
  *dirty = false;
  if (commit.empty()) {
    commit = SWA_DECODE_CONFIGURE_COMMIT;
  } else {
    *dirty = !run_command(git + "status --porcelain --untracked-files=no 2>/dev/null").empty();
  }
  return commit.empty() ? "unknown" : commit;
}

}  // namespace swa_decode::cli
