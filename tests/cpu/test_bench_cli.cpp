// `swa-decode bench`'s options and report without a GPU: --calls-per-graph (issue 13) is parsed and
// bounded, every JSON row and table row carries calls_per_graph, and testing::DecodeGraphs refuses
// a count that does not divide its input sets.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "testing/timing.h"
#include "tools/swa_decode_cli/options.h"
#include "tools/swa_decode_cli/report.h"

namespace swa_decode::cli {
namespace {

std::string parse_error(const std::vector<std::string>& args) {
  try {
    parse_bench_options(args);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(BenchOptions, CallsPerGraphDefaultsToOneAndTakesN) {
  EXPECT_EQ(parse_bench_options({}).calls_per_graph, 1);
  EXPECT_EQ(parse_bench_options({"--calls-per-graph", "8"}).calls_per_graph, 8);
  const BenchOptions o = parse_bench_options({"--heads", "64", "--calls-per-graph", "3", "--tokens", "1,8"});
  EXPECT_EQ(o.calls_per_graph, 3);
  EXPECT_EQ(o.num_heads, 64);
  EXPECT_EQ(o.tokens, (std::vector<int64_t>{1, 8}));
  EXPECT_EQ(parse_bench_options({"--calls-per-graph", std::to_string(kMaxCallsPerGraph)}).calls_per_graph,
            kMaxCallsPerGraph);
}

TEST(BenchOptions, CallsPerGraphRefusesWhatNoGraphHolds) {
  EXPECT_EQ(parse_error({"--calls-per-graph", "0"}), "--calls-per-graph expects an integer >= 1, got '0'");
  EXPECT_EQ(parse_error({"--calls-per-graph", "two"}), "--calls-per-graph expects an integer >= 1, got 'two'");
  EXPECT_EQ(parse_error({"--calls-per-graph"}), "--calls-per-graph expects a value");
  EXPECT_EQ(parse_error({"--calls-per-graph", std::to_string(kMaxCallsPerGraph + 1)}),
            "--calls-per-graph expects an integer <= " + std::to_string(kMaxCallsPerGraph) + ", got " +
                std::to_string(kMaxCallsPerGraph + 1));
  EXPECT_NE(std::string(usage()).find("--calls-per-graph N"), std::string::npos);
}

BenchRow row_of(int64_t tokens, int64_t calls) {
  BenchRow row;
  row.tokens = tokens;
  row.heads = 128;
  row.window = 128;
  row.layer = "swa";
  row.kernel = "sm90_wgmma";
  row.index_type = "int32";
  row.calls_per_graph = calls;
  row.us = 4.5;
  return row;
}

TEST(BenchReport, EveryJsonRowCarriesCallsPerGraph) {
  BenchReport report;
  report.device = "test";
  report.rows = {row_of(1, 1), row_of(8, 8), BenchRow{}};  // the last as the CPU path leaves it
  const std::string path = ::testing::TempDir() + "bench_cli_calls_per_graph.json";
  write_json(report, path);
  std::ifstream file(path);
  std::vector<std::string> rows;
  for (std::string line; std::getline(file, line);) {
    if (line.find("{\"T\": ") != std::string::npos) rows.push_back(line);
  }
  std::remove(path.c_str());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_NE(rows[0].find("\"T\": 1,"), std::string::npos) << rows[0];
  EXPECT_NE(rows[0].find("\"calls_per_graph\": 1,"), std::string::npos) << rows[0];
  EXPECT_NE(rows[1].find("\"calls_per_graph\": 8,"), std::string::npos) << rows[1];
  EXPECT_NE(rows[2].find("\"calls_per_graph\": 1,"), std::string::npos) << rows[2];
}

TEST(BenchReport, TheTableHasACallsColumn) {
  ::testing::internal::CaptureStdout();
  print_table_header();
  print_row(row_of(32, 8));
  const std::string table = ::testing::internal::GetCapturedStdout();
  std::istringstream lines(table);
  std::string header, row;
  std::getline(lines, header);
  std::getline(lines, row);
  // The column under "calls" holds the row's count: the same field, counted from the left.
  const auto field = [](const std::string& line, size_t index) {
    std::istringstream words(line);
    std::string word;
    for (size_t i = 0; i <= index && words >> word;) ++i;
    return word;
  };
  EXPECT_EQ(field(header, 6), "calls") << header;
  EXPECT_EQ(field(row, 6), "8") << row;
  EXPECT_EQ(field(row, 7), "4.50") << row;
}

// A graph holds calls_per_graph consecutive input sets: a count that leaves sets over is refused
// before anything is captured (no GPU needed to see it).
TEST(BenchGraphs, CallsPerGraphMustDivideTheInputSets) {
  const std::vector<DecodeArgs> three_sets(3);
  EXPECT_THROW(testing::DecodeGraphs(three_sets, nullptr, KernelId::kNone, 2), std::invalid_argument);
  EXPECT_THROW(testing::DecodeGraphs(three_sets, nullptr, KernelId::kNone, 0), std::invalid_argument);
  try {
    testing::DecodeGraphs(three_sets, nullptr, KernelId::kNone, 2);
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "DecodeGraphs: calls_per_graph must be >= 1 and divide the 3 input sets, got 2");
  }
}

}  // namespace
}  // namespace swa_decode::cli
