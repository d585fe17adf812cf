// The random-configuration test (testing/random_config.h) on the CPU backend, small shapes, in CI:
// every configuration runs through decode(Backend::kCpu) on the materialized host tensors and is
// compared with
//  (a) check_outputs: the float64 reference on a compact copy of the tokens (select_tokens), plus
//      the scan for NaN, unwritten elements and writes into stride gaps over every token, and
//  (b) an oracle written here from the generator's own record of the batch (its int64 ids and
//      lens, the live rows by slot, q with its strides), in long double with a streaming softmax,
//      and the window rule of src/common/window_rule.h (the kernels' one): it reads none of the
//      tensors decode reads, so the reference's dtype reads, stride addressing, window rule, sink
//      and LSE conventions and bf16 rounding are checked against values they never touched.
// A second test draws the GPU test's configurations and asks select_kernel, for a simulated H200,
// which kernel each family would run: the GPU test's coverage minimums must hold there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "src/api/decode.h"
#include "src/api/validate.h"
#include "src/common/window_rule.h"
#include "src/dispatch/select_kernel.h"
#include "src/reference/reference.h"
#include "testing/batch.h"
#include "testing/host_numerics.h"
#include "testing/random_config.h"
#include "testing/strides.h"

namespace swa_decode {
namespace {

namespace st = swa_decode::testing;

constexpr int64_t kCpuRandomConfigs = 1000;
constexpr long double kInfL = std::numeric_limits<long double>::infinity();
constexpr int kMaxReportedMismatches = 6;

// Element d of a live kModel1 row as the generator keeps it (its 576-byte row, then its 8-byte
// scale row), read from docs/semantics.md's "Row formats" alone: d < 448 is e4m3 byte d times
// 2^(scale byte d / 64 - 127), d >= 448 the bf16 value at byte 448 + 2 (d - 448), low byte first.
long double model1_element(const uint8_t* row, int64_t d) {
  if (d < 448) return std::ldexp(static_cast<long double>(st::e4m3_to_double(row[d])), row[576 + d / 64] - 127);
  const uint32_t bits = (static_cast<uint32_t>(row[448 + 2 * (d - 448)]) | static_cast<uint32_t>(row[449 + 2 * (d - 448)]) << 8)
                        << 16;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Token t's valid entries as the oracle sees them, the window's then the extra source's, each
// live row (of the source's own pool, or of the window's for an extra source sharing it)
// dequantized: [entries, D].
std::vector<long double> oracle_keys(const st::HostBatch& b, int64_t t) {
  std::vector<long double> keys;
  const st::HostSource* sources[] = {&b.window(), b.extra ? &*b.extra : nullptr};
  for (const st::HostSource* source : sources) {
    if (source == nullptr) continue;
    const st::HostSource& pool = b.rows_of(*source);
    const int64_t columns = columns_in_window(source->lens[t], static_cast<int32_t>(source->max_entries));
    for (int64_t c = 0; c < columns; ++c) {
      const int64_t slot = source->indices[t * source->index_stride + c];
      if (!slot_is_valid(slot, source->num_slots)) continue;
      const auto live = static_cast<size_t>(std::lower_bound(pool.live_slots.begin(), pool.live_slots.end(), slot) -
                                            pool.live_slots.begin());
      const uint8_t* codes = &pool.live_rows[live * pool.live_row_bytes()];
      for (int64_t d = 0; d < b.head_dim; ++d) {
        keys.push_back(pool.is_model1() ? model1_element(codes, d)
                                        : static_cast<long double>(st::e4m3_to_double(codes[d])) * pool.live_scales[live]);
      }
    }
  }
  return keys;
}

// The op for one (token, head): a streaming softmax (running max, rescaled sum and accumulator),
// the sink added to the denominator at the end, the LSE from the running state.
struct OracleRow {
  std::vector<long double> out;
  long double lse;
};

OracleRow oracle_row(const st::HostBatch& b, int64_t t, int64_t h, const std::vector<long double>& keys) {
  const int64_t D = b.head_dim;
  const auto entries = static_cast<int64_t>(keys.size()) / D;
  // An empty token: out 0, lse -inf, or +inf where the batch asks FlashMLA's convention.
  const bool plus_inf = b.options.empty_token_lse == EmptyTokenLse::kPositiveInfinity;
  OracleRow r{std::vector<long double>(D, 0.0L), plus_inf ? kInfL : -kInfL};
  if (entries == 0) return r;
  const uint16_t* q_row = &b.q[t * b.q_token_stride + h * b.q_head_stride];
  std::vector<long double> q(D), acc(D, 0.0L);
  for (int64_t d = 0; d < D; ++d) q[d] = reference::bf16_to_float(q_row[d]);
  long double running_max = -kInfL, running_sum = 0.0L;
  for (int64_t j = 0; j < entries; ++j) {
    const long double* k = &keys[j * D];
    long double dot = 0.0L;
    for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
    const long double score = static_cast<long double>(b.scale) * dot;
    const long double new_max = std::max(running_max, score);
    const long double rescale = std::exp(running_max - new_max);  // exp(-inf) = 0 for the first entry
    const long double weight = std::exp(score - new_max);
    running_sum = running_sum * rescale + weight;
    for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] * rescale + weight * k[d];
    running_max = new_max;
  }
  r.lse = running_max + std::log(running_sum);
  const long double sink = b.sinks.empty() ? -kInfL : static_cast<long double>(b.sinks[h]);
  if (sink == kInfL) return r;  // all weight on the sink: out = 0, lse unchanged
  const long double denominator = running_sum + std::exp(sink - running_max);
  for (int64_t d = 0; d < D; ++d) r.out[d] = acc[d] / denominator;
  return r;
}

// out must be the oracle's value rounded to bf16 (within half a bf16 ulp, 2^-8 relative, plus
// 1e-12 kmax for the float64 reference's own rounding); exact zeros stay exact; lse is fp32.
std::string oracle_check(const st::HostBatch& b, const st::Outputs& o, const std::vector<int64_t>& tokens) {
  std::ostringstream s;
  int mismatches = 0;
  auto note = [&](const std::string& line) {
    if (mismatches++ < kMaxReportedMismatches) s << (mismatches > 1 ? "\n  " : "") << line;
  };
  for (int64_t t : tokens) {
    const std::vector<long double> keys = oracle_keys(b, t);
    const auto entries = static_cast<int64_t>(keys.size()) / b.head_dim;
    if (entries != b.valid_entries[t]) {
      note("token " + std::to_string(t) + ": the oracle finds " + std::to_string(entries) +
           " valid entries, the generator " + std::to_string(b.valid_entries[t]));
    }
    for (int64_t h = 0; h < b.num_heads; ++h) {
      const OracleRow want = oracle_row(b, t, h, keys);
      for (int64_t d = 0; d < b.head_dim; ++d) {
        const double got = reference::bf16_to_float(o.out[t * b.out_token_stride + h * b.out_head_stride + d]);
        const long double bound = 0x1p-8L * std::fabs(want.out[d]) + 1e-12L * b.token_kmax[t];
        if (!(std::fabs(static_cast<long double>(got) - want.out[d]) <= bound)) {
          std::ostringstream line;
          line << "oracle: out[t=" << t << ", h=" << h << ", d=" << d << "] = " << got << ", oracle "
               << static_cast<double>(want.out[d]) << " (lens " << b.lens[t]
               << (b.extra ? ", extra lens " + std::to_string(b.extra->lens[t]) : std::string()) << ", entries " << entries
               << ", sink " << (b.sinks.empty() ? "none" : std::to_string(b.sinks[h])) << ")";
          note(line.str());
        }
      }
      if (!b.options.with_lse) continue;
      const double got = o.lse[t * b.lse_token_stride + h];
      const bool pass = std::isinf(want.lse)
                            ? got == static_cast<double>(want.lse)
                            : std::fabs(got - want.lse) <= 1e-6L * std::max(1.0L, std::fabs(want.lse));
      if (!pass) {
        std::ostringstream line;
        line << "oracle: lse[t=" << t << ", h=" << h << "] = " << got << ", oracle " << static_cast<double>(want.lse);
        note(line.str());
      }
    }
  }
  if (mismatches > kMaxReportedMismatches) s << "\n  (" << mismatches << " mismatches in all)";
  return s.str();
}

// ---- What the draws hold: every case the semantics name must occur ----

using Census = std::map<std::string, int64_t>;

// The extra source's cases (docs/semantics.md, "The extra source"), by configuration, token and id.
void take_extra_census(const st::RandomConfig& config, const st::HostBatch& b, Census& census) {
  const st::ExtraOptions& o = *config.options.extra;
  const st::HostSource& x = *b.extra;
  const int64_t X = x.max_entries, S_x = x.num_slots;
  census["extra config"] += 1;
  census["extra indices=" + dtype_name(x.index_dtype)] += 1;
  census["extra lens=" + dtype_name(x.lens_dtype)] += 1;
  census["extra inv_scale=" + dtype_name(x.inv_scale_dtype)] += !x.shares_window_cache;
  census[x.shares_window_cache ? "extra shares the window's cache" : "extra own pool"] += 1;
  census[o.top_k == 0 ? "extra every position" : "extra top-k"] += 1;
  census["extra X=1"] += X == 1;
  census["extra X>=512"] += X >= 512;
  census["extra block_size=1"] += !x.shares_window_cache && x.block_size == 1;
  const bool own_e4m3 = !x.shares_window_cache && !x.is_model1();
  census["extra kv_row_stride>D"] += own_e4m3 && x.kv_row_stride > b.head_dim;
  census["extra kv_block_pad>0"] += own_e4m3 && x.kv_block_stride > x.block_size * x.kv_row_stride;
  census["extra index_cols>X"] += x.index_cols > X;
  census["extra index_row_pad>0"] += x.index_stride > x.index_cols;
  census["extra garbage past the entries"] += o.garbage_past_entries;
  census["config padding rows"] += config.options.padding_row_fraction > 0.0;
  for (int64_t t = 0; t < b.num_tokens; ++t) {
    const int64_t len = x.lens[t];
    census[len < 0 ? "extra token lens<0" : len == 0 ? "extra token lens=0" : len <= X ? "extra token 0<lens<=X"
                                                                                        : "extra token lens>X"] += 1;
    const bool window_empty = b.entries[t] == 0, extra_empty = x.entries[t] == 0;
    census[window_empty ? (extra_empty ? "token empty in both sources" : "token empty window, extra entries")
                        : (extra_empty ? "token window entries, empty extra" : "token entries in both sources")] += 1;
    census["token padding row (lens 0 in both)"] += b.lens[t] == 0 && len == 0;
    std::vector<int64_t> window_slots, extra_slots;
    for (int64_t c = 0; c < columns_in_window(b.lens[t], static_cast<int32_t>(b.window_size)); ++c) {
      const int64_t id = b.indices[t * b.index_stride + c];
      if (slot_is_valid(id, b.num_slots)) window_slots.push_back(id);
    }
    for (int64_t c = 0; c < x.index_cols; ++c) {
      const int64_t id = x.indices[t * x.index_stride + c];
      if (c < x.columns(t) && slot_is_valid(id, S_x)) extra_slots.push_back(id);
      const char* kind = id == -1              ? "extra id -1"
                         : id < 0              ? "extra id other negative"
                         : id >= S_x && id < b.num_slots ? "extra id in [S_x, S): a window slot past its pool"
                         : id >= S_x           ? "extra id >=S_x"
                                               : nullptr;
      if (kind != nullptr) census[kind] += 1;
    }
    std::sort(extra_slots.begin(), extra_slots.end());
    census["token with duplicate extra entries"] += std::adjacent_find(extra_slots.begin(), extra_slots.end()) != extra_slots.end();
    if (x.shares_window_cache) {
      const bool across = std::any_of(window_slots.begin(), window_slots.end(), [&](int64_t slot) {
        return std::binary_search(extra_slots.begin(), extra_slots.end(), slot);
      });
      census["token with a slot in both sources"] += across;
    }
  }
}

// The kModel1 sources' cases (docs/semantics.md, "Row formats"): which sources, padded blocks,
// tokens that read such rows.
void take_model1_census(const st::HostBatch& b, Census& census) {
  const st::HostSource* x = b.extra ? &*b.extra : nullptr;
  const bool own_extra = x != nullptr && !x->shares_window_cache;
  census["model1 config"] += 1;
  census["model1 window"] += b.is_model1();
  census["model1 extra, own pool"] += own_extra && x->is_model1();
  census["model1 extra, sharing the window's cache"] += x != nullptr && x->shares_window_cache;
  census["model1 window, e4m3 extra"] += own_extra && b.is_model1() && !x->is_model1();
  census["model1 extra, e4m3 window"] += own_extra && !b.is_model1() && x->is_model1();
  census["model1 both sources, own pools"] += own_extra && b.is_model1() && x->is_model1();
  for (const st::HostSource* source : {&b.window(), own_extra ? x : nullptr}) {
    if (source == nullptr || !source->is_model1()) continue;
    census["model1 block padded past FlashMLA's"] +=
        source->kv_block_stride > st::model1_strides(source->block_size).group;
    census["model1 block_size=1"] += source->block_size == 1;
  }
  for (int64_t t = 0; t < b.num_tokens; ++t) {
    census["model1 token with entries"] += (b.is_model1() && b.entries[t] > 0) || (x != nullptr && x->is_model1() && x->entries[t] > 0);
  }
}

// Counts configurations, tokens, heads and index entries by the case they exercise.
void take_census(const st::RandomConfig& config, const st::HostBatch& b, Census& census) {
  const st::BatchOptions& o = config.options;
  const int64_t W = b.window_size, S = b.num_slots;
  census["dtypes indices=" + dtype_name(o.index_dtype) + " lens=" + dtype_name(o.lens_dtype) +
         " inv_scale=" + dtype_name(o.inv_scale_dtype)] += 1;
  census["config H=1"] += b.num_heads == 1;
  census["config H>16"] += b.num_heads > 16;
  census["config W=1"] += W == 1;
  census["config W>128"] += W > 128;
  census["config block_size=1"] += b.block_size == 1;
  census["config block_size>=512"] += b.block_size >= 512;
  census["config kv_row_stride>D"] += !b.is_model1() && b.kv_row_stride > b.head_dim;
  census["config kv_block_pad>0"] += !b.is_model1() && o.kv_block_pad > 0;
  census["config q head-major"] += o.q_head_major;
  census["config q padded token-major"] += !o.q_head_major && b.q_token_stride > b.num_heads * b.head_dim;
  census["config out padded"] += b.out_token_stride > b.num_heads * b.head_dim;
  census["config lse off"] += !o.with_lse;
  census["config lse padded"] += o.with_lse && b.lse_token_stride > b.num_heads;
  census["config index_cols>W"] += b.index_cols > W;
  census["config index_row_pad>0"] += b.index_stride > b.index_cols;
  census["config garbage past the window"] += o.garbage_past_window;
  census["config no sinks"] += b.sinks.empty();
  census["config negative scale"] += b.scale < 0.0f;
  census["config q / inv_scale magnitudes"] += !o.q_magnitudes.empty();
  for (float sink : b.sinks) {
    census[std::isinf(sink) ? (sink > 0 ? "head sink +inf" : "head sink -inf") : "head sink finite"] += 1;
  }
  const int64_t lens_max = o.lens_dtype == DType::kInt64 ? std::numeric_limits<int64_t>::max() : INT32_MAX;
  const int64_t lens_min = o.lens_dtype == DType::kInt64 ? std::numeric_limits<int64_t>::min() : INT32_MIN;
  for (int64_t t = 0; t < b.num_tokens; ++t) {
    const int64_t len = b.lens[t];
    census[len == lens_min   ? "token lens=most negative"
           : len < 0         ? "token lens<0"
           : len == 0        ? "token lens=0"
           : len < W         ? "token 0<lens<W"
           : len == W        ? "token lens=W"
           : len == lens_max ? "token lens=dtype max"
           : len == INT32_MAX ? "token lens=INT32_MAX"
           : len > INT32_MAX ? "token lens>INT32_MAX"
                             : "token W<lens<INT32_MAX"] += 1;
    census[b.valid_entries[t] == 0 ? "token empty" : "token with entries"] += 1;
    std::vector<int64_t> valid;
    for (int64_t c = 0; c < b.index_cols; ++c) {
      const int64_t id = b.indices[t * b.index_stride + c];
      if (c < columns_in_window(len, static_cast<int32_t>(W)) && slot_is_valid(id, S)) valid.push_back(id);
      const char* kind = id == -1                 ? "id -1"
                         : id < 0                 ? "id other negative"
                         : id == S                ? "id =S"
                         : id == INT32_MAX        ? "id INT32_MAX"
                         : id >= (int64_t{1} << 40) ? "id >=2^40"
                         : id >= (int64_t{1} << 32) ? "id >=2^32"
                         : id > S                 ? "id >S"
                                                  : nullptr;
      if (kind != nullptr) census[kind] += 1;
    }
    std::sort(valid.begin(), valid.end());
    census["token with duplicate entries"] += std::adjacent_find(valid.begin(), valid.end()) != valid.end();
  }
  if (b.extra) take_extra_census(config, b, census);
  if (b.has_model1_source()) take_model1_census(b, census);
}

// Every case the semantics name, drawn at least `minimum` times (configurations, tokens, heads or
// index entries); the dtype pairs are checked apart.
std::string census_shortfall(const Census& census, bool gpu, int64_t minimum) {
  std::vector<std::string> required = {
      "config H=1", "config H>16", "config W=1", "config W>128", "config block_size=1", "config kv_row_stride>D",
      "config kv_block_pad>0", "config q head-major", "config q padded token-major", "config out padded",
      "config lse off", "config lse padded", "config index_cols>W", "config index_row_pad>0",
      "config garbage past the window", "config no sinks", "config negative scale",
      "config q / inv_scale magnitudes", "head sink +inf", "head sink -inf", "head sink finite",
      "token lens=most negative", "token lens<0", "token lens=0", "token 0<lens<W", "token lens=W",
      "token lens=dtype max", "token lens=INT32_MAX", "token lens>INT32_MAX", "token W<lens<INT32_MAX",
      "token empty", "token with entries", "token with duplicate entries", "id -1", "id other negative", "id =S",
      "id >S", "id INT32_MAX", "id >=2^32", "id >=2^40"};
  const std::vector<std::string> extra_cases = {
      "extra config", "extra indices=int32", "extra indices=int64", "extra lens=int32", "extra lens=int64",
      "extra inv_scale=bf16", "extra inv_scale=fp32", "extra shares the window's cache", "extra own pool",
      "extra every position", "extra top-k", "extra X=1", "extra X>=512", "extra block_size=1",
      "extra kv_row_stride>D", "extra kv_block_pad>0", "extra index_cols>X", "extra index_row_pad>0",
      "extra garbage past the entries", "config padding rows", "extra token lens<0", "extra token lens=0",
      "extra token 0<lens<=X", "extra token lens>X", "token empty in both sources", "token empty window, extra entries",
      "token window entries, empty extra", "token entries in both sources", "token padding row (lens 0 in both)",
      "extra id -1", "extra id other negative", "extra id in [S_x, S): a window slot past its pool", "extra id >=S_x",
      "token with duplicate extra entries", "token with a slot in both sources"};
  required.insert(required.end(), extra_cases.begin(), extra_cases.end());
  const std::vector<std::string> model1_cases = {
      "model1 window", "model1 extra, own pool", "model1 window, e4m3 extra", "model1 extra, e4m3 window",
      "model1 both sources, own pools", "model1 block padded past FlashMLA's", "model1 token with entries"};
  required.insert(required.end(), model1_cases.begin(), model1_cases.end());
  if (gpu) required.push_back("config block_size>=512");
  for (DType index : {DType::kInt32, DType::kInt64}) {
    for (DType lens : {DType::kInt32, DType::kInt64}) {
      for (DType scale : {DType::kBFloat16, DType::kFloat32}) {
        required.push_back("dtypes indices=" + dtype_name(index) + " lens=" + dtype_name(lens) +
                           " inv_scale=" + dtype_name(scale));
      }
    }
  }
  std::string shortfall;
  for (const std::string& name : required) {
    const auto it = census.find(name);
    const int64_t count = it == census.end() ? 0 : it->second;
    if (count < minimum) shortfall += name + ": " + std::to_string(count) + " < " + std::to_string(minimum) + "\n";
  }
  return shortfall;
}

void print_census(const Census& census, const char* draw) {
  for (const auto& [name, count] : census) {
    std::printf("random-configs census (%s): %s: %lld\n", draw, name.c_str(), static_cast<long long>(count));
  }
}

std::vector<st::FamilyRun> run_cpu_backend(const st::RandomConfig&, const st::HostBatch& batch) {
  st::HostTensors tensors = st::materialize_host(batch);
  const DecodeArgs args = st::host_args(batch, tensors);
  const SupportInfo support = query_support(args);
  const Status status = decode(args);
  st::FamilyRun run;
  run.ran = support.supported && status.ok();
  run.kernel = support.kernel;
  run.why_not = support.why_not;
  if (!support.supported) run.problem = "query_support refused a valid CPU configuration: " + support.why_not;
  if (!status.ok()) {
    run.problem += "decode returned status " + std::to_string(static_cast<int>(status.code)) + ": " + status.message;
  }
  run.outputs = st::Outputs{.out = std::move(tensors.out), .lse = std::move(tensors.lse)};
  return {run};
}

TEST(RandomConfigsCpu, CpuBackendMatchesTheReferenceAndTheOracle) {
  const st::RunPlan plan = st::plan_from_env(kCpuRandomConfigs);
  Census census;  // the runner is called on one thread
  const auto run = [&](const st::RandomConfig& config, const st::HostBatch& batch) {
    take_census(config, batch, census);
    return run_cpu_backend(config, batch);
  };
  const st::RandomRunResult result =
      st::run_random_configs(st::cpu_space(), plan, {"cpu"}, run, oracle_check,
                             "swa_decode_tests --gtest_filter=RandomConfigsCpu.CpuBackend*");
  st::print_result(result, plan);
  for (size_t i = 0; i < result.failures.size() && i < 10; ++i) ADD_FAILURE() << result.failures[i];
  EXPECT_EQ(result.failed_configs, 0) << result.failures.size() << " failing (configuration, family) pairs";
  EXPECT_EQ(result.families[0].ran, plan.count) << "the CPU backend runs every valid configuration";
  if (!plan.single && plan.count >= st::kMinConfigsForCoverage) {
    print_census(census, "cpu draw");
    EXPECT_EQ(census_shortfall(census, /*gpu=*/false, 3), "");
  }
}

// ---- The GPU draw on a simulated H200 ----

constexpr DeviceInfo kH200{.cc_major = 9, .cc_minor = 0, .num_sms = 132, .smem_optin_bytes = 232448};

// DecodeArgs over addresses that are never dereferenced (validation and selection read no data):
// 256-byte aligned, as cudaMalloc returns.
DecodeArgs simulated_device_args(const st::HostBatch& batch) {
  auto address = [](uintptr_t k) { return reinterpret_cast<void*>(k << 32); };
  const st::TensorPointers at{
      .q = address(1),
      .kv_cache = address(2),
      .inv_scale = address(3),
      .indices = address(4),
      .lens = address(5),
      .attn_sink = batch.sinks.empty() ? nullptr : static_cast<const float*>(address(6)),
      .lse = batch.options.with_lse ? static_cast<float*>(address(7)) : nullptr,
      .out = address(8),
      .extra_kv_cache = batch.extra && batch.extra->shares_window_cache ? address(2) : address(9),
      .extra_inv_scale = batch.extra && batch.extra->shares_window_cache ? address(3) : address(10),
      .extra_indices = address(11),
      .extra_lens = address(12),
  };
  return st::batch_args(batch, at, batch.num_tokens, Backend::kCuda, nullptr);
}

// Whether a family (kNone: any) runs, on an H200, the shape every kernel that reads such sources
// should run: H = 64, T = 128, W = 128, 16-byte rows, the window in `window_format` and, if
// `extra_format` is given, a C4A-like extra source (512 entries) in it. Until a family's kernel
// reads extra sources, or kModel1 rows in a source, its record refuses them.
bool reads_sources(KernelId family, KvFormat window_format, std::optional<KvFormat> extra_format) {
  DecodeShape shape{.num_tokens = 128, .num_heads = 64, .head_dim = kGpuHeadDim, .window_size = 128,
                    .kv_row_alignment = 16, .q_out_aligned_16 = true, .kv_last_row_offset = int64_t{1} << 20,
                    .window_format = window_format};
  if (extra_format) {
    shape.has_extra = true;
    shape.extra_max_entries = 512;
    shape.extra_kv_row_alignment = 16;
    shape.extra_kv_last_row_offset = int64_t{1} << 20;
    shape.extra_format = *extra_format;
  }
  return select_kernel(shape, kH200, family).id() != KernelId::kNone;
}

// Whether a family reads what `batch`'s sources are (an extra source, kModel1 rows).
bool reads_sources_of(KernelId family, const st::HostBatch& batch) {
  return reads_sources(family, batch.format, batch.extra ? std::optional(batch.extra->format) : std::nullopt);
}

// Whether a family reads kModel1 rows in every combination of sources a draw holds.
bool reads_model1(KernelId family) {
  constexpr KvFormat kE4m3 = KvFormat::kE4m3, kModel1 = KvFormat::kModel1;
  return reads_sources(family, kModel1, std::nullopt) && reads_sources(family, kModel1, kModel1) &&
         reads_sources(family, kModel1, kE4m3) && reads_sources(family, kE4m3, kModel1);
}

TEST(RandomConfigsCpu, GpuDrawReachesEveryKernelOnAnH200) {
  const std::vector<std::pair<std::string, KernelId>> families = {
      {"free", KernelId::kNone}, {"portable", KernelId::kPortableMma}, {"sm90", KernelId::kSm90Wgmma},
      {"few_heads", KernelId::kFewHeadsMma}};
  // Per family: every configuration, and those whose sources it reads (the coverage of a family
  // that reads no extra source or no kModel1 rows yet is judged on the configurations without them).
  std::vector<st::FamilyTally> tallies, readable_tallies;
  std::vector<int64_t> readable_configs(families.size(), 0);
  std::vector<bool> reads_extra, reads_model1_rows;
  for (const auto& family : families) {
    st::FamilyTally tally;
    tally.family = family.first;
    tallies.push_back(tally);
    readable_tallies.push_back(tally);
    reads_extra.push_back(reads_sources(family.second, KvFormat::kE4m3, KvFormat::kE4m3));
    reads_model1_rows.push_back(reads_model1(family.second));
  }
  const bool sm90_built = sm90_kernel_built();
  Census census;
  int64_t sm90_class = 0, misaligned_class = 0, large_tokens = 0, with_extra = 0, with_model1 = 0, largest_pool = 0;
  int64_t model1_kernel_aligned = 0, model1_sm90_shaped = 0;
  const st::RunPlan plan = st::plan_from_env(st::kGpuRandomConfigs);  // the GPU test's plan
  for (int64_t index = plan.first; index < plan.first + plan.count; ++index) {
    const st::RandomConfig config = st::draw_config(st::gpu_space(), plan.seed, index);
    SCOPED_TRACE(config.describe());
    sm90_class += config.shape_class == st::ShapeClass::kSm90;
    misaligned_class += config.shape_class == st::ShapeClass::kMisaligned;
    large_tokens += config.options.num_tokens >= 64;
    with_extra += config.options.extra.has_value();
    const st::HostBatch batch = st::make_batch(config.options);
    with_model1 += batch.has_model1_source();
    model1_kernel_aligned += batch.has_model1_source() && config.kernel_aligned;
    model1_sm90_shaped += batch.has_model1_source() && config.sm90_shaped;
    take_census(config, batch, census);
    largest_pool = std::max(largest_pool, batch.kv_cache_bytes() + (batch.extra ? batch.extra->kv_cache_bytes() : 0));
    const DecodeArgs args = simulated_device_args(batch);
    const Status valid = validate_args(args);
    ASSERT_TRUE(valid.ok()) << valid.message;
    const DecodeShape shape = decode_shape(make_params(args));
    for (size_t f = 0; f < families.size(); ++f) {
      const KernelChoice choice = select_kernel(shape, kH200, families[f].second);
      const bool ran = choice.id() != KernelId::kNone;
      // The few-heads kernel (sm_90a too) takes the sm90 kernel's shapes (W <= 128, 16-byte rows).
      const bool hopper_family = families[f].second == KernelId::kSm90Wgmma || families[f].second == KernelId::kFewHeadsMma;
      const bool aligned = hopper_family ? sm90_built && config.sm90_shaped : config.kernel_aligned;
      const bool readable = reads_sources_of(families[f].second, batch);
      EXPECT_EQ(ran, aligned && readable) << families[f].first << ": " << choice.plan.name << choice.why_not;
      readable_configs[f] += readable;
      for (st::FamilyTally* tally : {&tallies[f], readable ? &readable_tallies[f] : nullptr}) {
        if (tally == nullptr) continue;
        tally->ran += ran;
        tally->ran_with_extra += ran && batch.extra;
        tally->ran_with_model1 += ran && batch.has_model1_source();
        tally->skipped += !ran;
        if (ran) tally->ran_by_kernel[choice.plan.name] += 1;
      }
    }
  }
  std::printf("random-configs (simulated H200, seed %llu): %lld configurations, %lld sm90-shaped class, %lld "
              "misaligned class, %lld with T >= 64, %lld with an extra source, %lld with a kModel1 source (%lld "
              "kernel-aligned, %lld sm90-shaped), largest cache pools %.1f MiB\n",
              static_cast<unsigned long long>(plan.seed), static_cast<long long>(plan.count),
              static_cast<long long>(sm90_class), static_cast<long long>(misaligned_class),
              static_cast<long long>(large_tokens), static_cast<long long>(with_extra),
              static_cast<long long>(with_model1), static_cast<long long>(model1_kernel_aligned),
              static_cast<long long>(model1_sm90_shaped), static_cast<double>(largest_pool) / (1 << 20));
  const bool enough = !plan.single && plan.count >= st::kMinConfigsForCoverage;
  print_census(census, "gpu draw");
  if (enough) {
    EXPECT_EQ(census_shortfall(census, /*gpu=*/true, 3), "");
  }
  for (size_t f = 0; f < families.size(); ++f) {
    // A family is held to the minimums on the configurations whose sources it reads.
    const st::FamilyTally& tally = readable_tallies[f];
    std::printf("random-configs (simulated H200): family=%s ran=%lld (with an extra source %lld, with a kModel1 "
                "source %lld) skipped=%lld; reads the sources of %lld configurations%s%s\n",
                tallies[f].family.c_str(), static_cast<long long>(tallies[f].ran),
                static_cast<long long>(tallies[f].ran_with_extra), static_cast<long long>(tallies[f].ran_with_model1),
                static_cast<long long>(tallies[f].skipped), static_cast<long long>(readable_configs[f]),
                reads_extra[f] ? "" : "; reads no extra source yet",
                reads_model1_rows[f] ? "" : "; reads no kModel1 rows yet");
    for (const auto& [kernel, count] : tallies[f].ran_by_kernel) {
      std::printf("random-configs (simulated H200): family=%s kernel=%s ran=%lld\n", tally.family.c_str(),
                  kernel.c_str(), static_cast<long long>(count));
    }
    if (!enough || ((tally.family == "sm90" || tally.family == "few_heads") && !sm90_built)) continue;
    EXPECT_EQ(st::coverage_shortfall(tally, readable_configs[f],
                                     /*per_kernel=*/sm90_built || tally.family == "portable",
                                     /*with_extra=*/reads_extra[f], /*with_model1=*/reads_model1_rows[f]),
              "");
  }
}

}  // namespace
}  // namespace swa_decode
