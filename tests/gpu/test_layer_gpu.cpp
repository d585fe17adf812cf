// The whole DeepSeek-V4 attention layer on the GPU (issue 11): the window and an extra source of
// compressed entries in one softmax, against the float64 reference, every unused slot and scale of
// both caches poisoned with NaN. GpuLayer covers each rule of docs/semantics.md, "The extra
// source" (lengths -1 / 0 / past the limit in either source, an empty window with extra entries
// and the reverse, ids past the extra slot range, both sources on one cache, duplicates within and
// across the sources, a q head of NaN that no other head may see, strides, dtypes, head counts,
// the largest entry limit) and realistic C4A (H = 64 with 512 entries, H = 128 with 1024) and
// C128A (512 and 8192 entries) layers at T = 1, 8, 64 and 300 (testing/layer.h), in the seed's
// rows and, as `swa-decode bench --format model1` builds them, with every source in MODEL1 rows.
//
// Cases run on the kernel under test (SWA_DECODE_TEST_KERNEL, tests/gpu/gpu_test.h), exactly as in
// test_decode_gpu.cpp: every case here is one the library must run, so a case no kernel runs fails.
// The float64 reference dominates the time: each case checks the tokens that fit in
// kCaseReferenceMacs on every host core (~30 GMAC in all, 2-4 s on the H200 machine's 16 cores).
//
// LayerHarness checks the generator and the check themselves on the CPU (no GPU needed).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "swa_decode/limits.h"
#include "swa_decode/swa_decode.h"
#include "src/common/window_rule.h"
#include "src/reference/reference.h"
#include "testing/batch.h"
#include "testing/check.h"
#include "testing/host_numerics.h"
#include "testing/layer.h"
#include "testing/parallel_for.h"
#include "tests/gpu/gpu_test.h"

namespace {

namespace st = swa_decode::testing;
using swa_decode::DType;
using swa_decode::EmptyTokenLse;
using st::LayerKind;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// What the reference may spend on one case: 2 GMAC is 2-4 s on one core, a fraction of a second
// on 16; a C128A token at a 1M context and H = 128 alone is ~1.1 GMAC.
constexpr int64_t kCaseReferenceMacs = 2'000'000'000;
constexpr int64_t kCaseCheckedTokens = 48;

// The extra source of the rule tests: a top-300 of up to 1200 compressed positions (contexts up
// to 4800) in blocks of 64, index rows 40 columns longer than X with in-range ids of poisoned
// slots past the entries; the window as test_decode_gpu.cpp's edge cases have it.
constexpr int64_t kRuleTopK = 300;

st::BatchOptions rule_options(int64_t num_tokens, int64_t num_heads, uint64_t seed) {
  return st::BatchOptions{
      .num_tokens = num_tokens,
      .num_heads = num_heads,
      .window_size = 128,
      .index_cols = 160,
      .max_context = 4 * 1200,
      .with_sink = true,
      .garbage_past_window = true,
      .extra = st::ExtraOptions{.compress_ratio = 4, .top_k = kRuleTopK, .max_entries = kRuleTopK,
                                .index_cols = kRuleTopK + 40, .block_size = 64, .garbage_past_entries = true},
      .seed = seed,
  };
}

class GpuLayer : public st::GpuTest {
 protected:
  // One case: the batch of `options`, its tokens within the case's reference budget compared on
  // every core, all of them scanned.
  void expect_layer_matches_reference(const st::BatchOptions& options) {
    SCOPED_TRACE(st::describe(options));
    const st::HostBatch batch = st::make_batch(options);
    expect_batch_matches_reference(
        batch, st::budgeted_tokens(batch, kCaseReferenceMacs, kCaseCheckedTokens, options.seed ^ 0xC4EC4ull),
        st::host_threads());
  }

  // A realistic layer at T = 1, 8, 64 and 300, each T with other dtypes of ids and scales.
  void expect_layers_match_reference(const st::LayerSpec& spec, int64_t num_heads, uint64_t seed) {
    struct Case {
      int64_t tokens;
      DType ids, scales;
    };
    const Case cases[] = {{1, DType::kInt32, DType::kBFloat16},
                          {8, DType::kInt64, DType::kFloat32},
                          {64, DType::kInt32, DType::kFloat32},
                          {300, DType::kInt64, DType::kBFloat16}};
    for (const Case& c : cases) {
      st::BatchOptions o = st::layer_options(spec, c.tokens, num_heads, 128, c.ids, seed + c.tokens);
      o.inv_scale_dtype = c.scales;  // kModel1 sources have no inv_scale: ignored there
      if (o.extra) o.extra->inv_scale_dtype = c.scales;
      expect_layer_matches_reference(o);
    }
  }
};

TEST_F(GpuLayer, C4aLayersOfV4Flash) {
  expect_layers_match_reference({.kind = LayerKind::kC4a, .top_k = 512}, 64, 1000);
}

TEST_F(GpuLayer, C4aLayersOfV4Pro) {
  expect_layers_match_reference({.kind = LayerKind::kC4a, .top_k = 1024}, 128, 2000);
}

TEST_F(GpuLayer, C128aLayersAt64kContext) {
  expect_layers_match_reference({.kind = LayerKind::kC128a, .mean_context = 65536}, 128, 3000);
}

TEST_F(GpuLayer, C128aLayersAt1MContext) {
  expect_layers_match_reference({.kind = LayerKind::kC128a, .mean_context = 1 << 20}, 128, 4000);
}

// The bench's MODEL1 layers (every source kModel1: the window in blocks of 64, C4A's compressed
// entries in 64, C128A's in 2, FlashMLA's padded blocks, 0xFF in every byte no entry names),
// uploaded span by span as the bench uploads them.
TEST_F(GpuLayer, Model1LayersOfTheEngines) {
  constexpr swa_decode::KvFormat kModel1 = swa_decode::KvFormat::kModel1;
  expect_layers_match_reference({.kind = LayerKind::kSwa, .format = kModel1}, 64, 5000);
  expect_layers_match_reference({.kind = LayerKind::kC4a, .format = kModel1, .top_k = 512}, 64, 6000);
  expect_layers_match_reference({.kind = LayerKind::kC4a, .format = kModel1, .top_k = 1024}, 128, 7000);
  expect_layers_match_reference({.kind = LayerKind::kC128a, .format = kModel1, .mean_context = 65536}, 128, 8000);
}

// Window lengths 0, -1, 1, W-1, W, W+1 against extra lengths 0, -1, 1, X-1, X, X+1 and INT32_MAX,
// every pair once, with full index rows behind them (valid-looking ids past every length), once
// with int32 window ids and int64 extra ids and once the other way round.
TEST_F(GpuLayer, LengthsAroundBothLimits) {
  const int64_t window_lens[] = {0, -1, 1, 127, 128, 129};
  const int64_t extra_lens[] = {0, -1, 1, kRuleTopK - 1, kRuleTopK, kRuleTopK + 1, kInt32Max};
  for (const DType window_ids : {DType::kInt32, DType::kInt64}) {
    const DType extra_ids = window_ids == DType::kInt32 ? DType::kInt64 : DType::kInt32;
    st::BatchOptions o = rule_options(42, 16, 10 + static_cast<uint64_t>(window_ids));
    o.index_dtype = o.lens_dtype = window_ids;
    o.extra->index_dtype = o.extra->lens_dtype = extra_ids;
    for (int64_t window_len : window_lens) {
      for (int64_t extra_len : extra_lens) {
        o.context_lens.push_back(4 * 1200);  // 1200 positions: the top-300 fills every entry column
        o.lens.push_back(window_len);
        o.extra->lens.push_back(extra_len);
      }
    }
    expect_layer_matches_reference(o);
  }
}

// A softmax over the extra entries alone, over the window alone, over neither, and over both,
// under sinks of -inf, +inf and finite values.
TEST_F(GpuLayer, EmptyWindowWithExtraEntriesAndTheReverse) {
  st::BatchOptions o = rule_options(24, 32, 20);
  const std::pair<int64_t, int64_t> lens[] = {{0, kRuleTopK}, {128, 0}, {0, 0}, {-1, 17}, {128, -1}, {1, 1}};
  for (int64_t t = 0; t < o.num_tokens; ++t) {
    o.lens.push_back(lens[t % 6].first);
    o.extra->lens.push_back(lens[t % 6].second);
  }
  for (int64_t h = 0; h < o.num_heads; ++h) o.sinks.push_back(h % 4 == 0 ? -kInf : h % 4 == 1 ? kInf : 0.5f * h - 4);
  expect_layer_matches_reference(o);
  o.seed = 21;  // the same lengths with whole index rows of -1 in either source
  o.all_invalid_fraction = 0.3;
  o.extra->all_invalid_fraction = 0.3;
  expect_layer_matches_reference(o);
  o.empty_token_lse = EmptyTokenLse::kPositiveInfinity;  // FlashMLA's lse for the empty tokens
  expect_layer_matches_reference(o);
}

// Extra ids at and past the extra pool's end, negative ones, and ids that are valid window slots
// but lie past the extra pool (the window's pool is ~4x larger here).
TEST_F(GpuLayer, ExtraIdsPastTheSlotRange) {
  for (const DType ids : {DType::kInt32, DType::kInt64}) {
    st::BatchOptions o = rule_options(40, 16, 30 + static_cast<uint64_t>(ids));
    o.extra->index_dtype = ids;
    o.extra->out_of_range_fraction = 0.3;
    o.out_of_range_fraction = 0.1;
    expect_layer_matches_reference(o);
  }
}

// Holes, duplicates within each source and tokens with no extra entry at all.
TEST_F(GpuLayer, HolesAndDuplicatesInBothSources) {
  st::BatchOptions o = rule_options(40, 32, 40);
  o.hole_fraction = 0.1;
  o.duplicate_fraction = 0.2;
  o.extra->hole_fraction = 0.2;
  o.extra->duplicate_fraction = 0.3;
  o.extra->all_invalid_fraction = 0.1;
  expect_layer_matches_reference(o);
}

// The extra source reading the window's cache and scales: entries at context positions (a top-k
// of every 4th, then all of every 128th), slots named by both sources of one token, duplicates.
TEST_F(GpuLayer, BothSourcesReadOneCache) {
  st::BatchOptions o = rule_options(32, 32, 50);
  o.extra->shares_window_cache = true;
  o.extra->cross_duplicate_fraction = 0.3;
  o.extra->duplicate_fraction = 0.1;
  expect_layer_matches_reference(o);
  o.seed = 51;
  o.extra->compress_ratio = 128;
  o.extra->top_k = 0;  // every position: up to 4800 / 128 = 37 entries
  expect_layer_matches_reference(o);
}

// A q row of NaN (an uninitialized padding head) makes its own output unspecified and must leave
// every other head of its token, and every other token, as the reference has them: one head of a
// 16-head mma group, the last head, a whole group, all heads but one, at H = 128 and at H = 24
// (a partly empty group).
TEST_F(GpuLayer, NanQHeadsStayInTheirHeads) {
  for (const int64_t heads : {128, 24}) {
    st::BatchOptions o = rule_options(6, heads, 60 + static_cast<uint64_t>(heads));
    o.nan_q_heads = {{0, 0}, {1, heads - 1}, {5, 3}};
    for (int64_t h = 16; h < std::min<int64_t>(32, heads); ++h) o.nan_q_heads.emplace_back(2, h);
    for (int64_t h = 0; h < heads; ++h) {
      if (h != 5) o.nan_q_heads.emplace_back(3, h);
    }
    expect_layer_matches_reference(o);
  }
}

// Padded rows in both caches, padded index rows, padded q / out / lse (q token-major, then
// head-major), and fp32 scales.
TEST_F(GpuLayer, StridedSources) {
  struct Layout {
    bool head_major_q;
    int64_t q_pad, out_pad;                       // elements, multiples of 8
    int64_t kv_row_stride, extra_kv_row_stride;   // bytes, multiples of 16
  };
  constexpr int64_t kTokens = 24, kHeads = 32, kDim = 512;
  for (const Layout& l : {Layout{false, 16, 88, 576, 592}, Layout{true, 8, 24, 528, 512}}) {
    st::BatchOptions o = rule_options(kTokens, kHeads, 70 + l.head_major_q);
    o.q_head_major = l.head_major_q;
    const int64_t q_row = kDim + l.q_pad;
    o.q_token_stride = l.head_major_q ? q_row : kHeads * q_row + l.q_pad;
    o.q_head_stride = l.head_major_q ? kTokens * q_row + l.q_pad : q_row;
    o.out_head_stride = kDim + l.out_pad;
    o.out_token_stride = kHeads * o.out_head_stride + l.out_pad;
    o.lse_token_stride = kHeads + 5;
    o.kv_row_stride = l.kv_row_stride;
    o.kv_block_pad = 32;
    o.extra->kv_row_stride = l.extra_kv_row_stride;
    o.extra->kv_block_pad = 48;
    o.index_row_pad = 3;
    o.extra->index_row_pad = 7;
    o.inv_scale_dtype = o.extra->inv_scale_dtype = DType::kFloat32;
    o.extra->hole_fraction = 0.1;
    expect_layer_matches_reference(o);
  }
}

// Each dtype of the extra source's ids, lengths and scales against the window's other one.
TEST_F(GpuLayer, DtypesOfEachSource) {
  for (const DType ids : {DType::kInt32, DType::kInt64}) {
    for (const DType scales : {DType::kBFloat16, DType::kFloat32}) {
      st::BatchOptions o = rule_options(16, 32, 80 + static_cast<uint64_t>(ids) * 4 + static_cast<uint64_t>(scales));
      o.extra->index_dtype = o.extra->lens_dtype = ids;
      o.extra->inv_scale_dtype = scales;
      o.index_dtype = o.lens_dtype = ids == DType::kInt32 ? DType::kInt64 : DType::kInt32;
      o.inv_scale_dtype = scales == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32;
      expect_layer_matches_reference(o);
    }
  }
}

// Head counts around the kernels' 16-head groups and 64-head warpgroups.
TEST_F(GpuLayer, HeadCounts) {
  for (const int64_t heads : {1, 8, 17, 32, 80, 128}) {
    st::BatchOptions o = rule_options(12, heads, 90 + static_cast<uint64_t>(heads));
    o.extra->hole_fraction = 0.05;
    expect_layer_matches_reference(o);
  }
}

// The largest entry limit the API takes, every column an entry (C128A at a 2M context), in blocks
// of 2: one token at X, one at X - 1 and one with a length past X.
TEST_F(GpuLayer, TheLargestExtraLimit) {
  st::BatchOptions o = rule_options(3, 16, 100);
  o.extra->top_k = 0;
  o.extra->max_entries = swa_decode::kMaxExtraEntries;
  o.extra->index_cols = swa_decode::kMaxExtraEntries;
  o.extra->block_size = st::kC128aBlockSize;
  o.extra->positions = {swa_decode::kMaxExtraEntries, swa_decode::kMaxExtraEntries - 1, swa_decode::kMaxExtraEntries};
  o.extra->lens = {swa_decode::kMaxExtraEntries, swa_decode::kMaxExtraEntries - 1, kInt32Max};
  expect_layer_matches_reference(o);
}

// q from 2^-30 to 2^24 per head and scales from 2^-20 to 2^12 in both caches (fp32 window scales,
// extra scales in either dtype: powers of two keep them exact in bf16): the f16 path must rescale
// the extra entries' scores as it does the window's.
TEST_F(GpuLayer, MagnitudesAcrossTheF16Range) {
  struct Case {
    double inv_scale_magnitude;
    DType extra_scales;
  };
  for (const Case c : {Case{0x1p-20, DType::kFloat32}, Case{0x1p12, DType::kBFloat16}}) {
    st::BatchOptions o = rule_options(16, 32, 110);
    o.scale = static_cast<float>(0x1p-24 / std::sqrt(512.0) / c.inv_scale_magnitude);
    o.extra->inv_scale_dtype = c.extra_scales;
    o.q_magnitudes = {0x1p-30, 0x1p-3, 1.0, 0x1p12, 0x1p24, 0x1p-14};
    o.inv_scale_dtype = DType::kFloat32;
    o.inv_scale_magnitude = c.inv_scale_magnitude;
    expect_layer_matches_reference(o);
  }
}

// ---- The generator and the check themselves, on the CPU backend (run without a GPU) ----

// rule_options with D = 64 and contexts short enough for dense host pools.
st::BatchOptions small_options(int64_t num_tokens, uint64_t seed) {
  st::BatchOptions o = rule_options(num_tokens, 4, seed);
  o.head_dim = 64;
  o.max_context = 4 * 400;
  return o;
}

st::Outputs run_cpu_backend(const st::HostBatch& batch, bool drop_extra = false) {
  st::HostTensors tensors = st::materialize_host(batch);
  swa_decode::DecodeArgs args = st::host_args(batch, tensors);
  if (drop_extra) args.extra = {};
  const swa_decode::Status status = swa_decode::decode(args);
  EXPECT_TRUE(status.ok()) << status.message;
  return st::Outputs{.out = tensors.out, .lse = tensors.lse};
}

// Per slot of `pool`: whether a valid entry of `sources` (all reading that pool) names it.
std::vector<bool> named_slots(const st::HostBatch& b, const st::HostSource& pool,
                              const std::vector<const st::HostSource*>& sources) {
  std::vector<bool> named(pool.num_slots, false);
  for (const st::HostSource* source : sources) {
    for (int64_t t = 0; t < b.num_tokens; ++t) {
      for (int64_t c = 0; c < source->columns(t); ++c) {
        const int64_t id = source->indices[t * source->index_stride + c];
        if (swa_decode::slot_is_valid(id, source->num_slots)) named[id] = true;
      }
    }
  }
  return named;
}

void expect_poisoned_but_named(const st::HostSource& pool, const std::vector<uint8_t>& cache,
                               const std::vector<uint8_t>& scales, const std::vector<bool>& named) {
  for (int64_t slot = 0; slot < pool.num_slots; ++slot) {
    float scale;
    if (pool.scale_bytes() == 4) {
      std::memcpy(&scale, &scales[slot * 4], 4);
    } else {
      scale = swa_decode::reference::bf16_to_float(static_cast<uint16_t>(scales[2 * slot] | scales[2 * slot + 1] << 8));
    }
    ASSERT_EQ(std::isnan(scale), !named[slot]) << "slot " << slot;
    const uint8_t* row = &cache[pool.kv_row_offset(slot)];
    for (int64_t b = 0; b < pool.kv_row_stride; ++b) {
      if (b >= pool.head_dim || !named[slot]) {
        ASSERT_EQ(row[b], st::kE4m3NaN) << "slot " << slot << " byte " << b;
      } else {
        ASSERT_NE(row[b] & 0x7F, 0x7F) << "live slot " << slot << " holds a NaN code";
      }
    }
  }
}

// Every slot of either pool that no valid entry names is poisoned, row, padding and scale; every
// named one is live. With one cache for both, a slot either source names is live.
TEST(LayerHarness, PoisonCoversEverySlotOfBothPools) {
  st::BatchOptions o = small_options(24, 200);
  o.kv_row_stride = 80;
  o.extra->kv_row_stride = 96;
  o.extra->kv_block_pad = 16;
  o.extra->inv_scale_dtype = DType::kFloat32;
  o.hole_fraction = o.duplicate_fraction = o.out_of_range_fraction = 0.2;
  o.extra->hole_fraction = o.extra->duplicate_fraction = o.extra->out_of_range_fraction = 0.2;
  for (int64_t t = 0; t < o.num_tokens; ++t) o.extra->lens.push_back(t % 4 == 0 ? 0 : t % 4 == 1 ? 17 : 1000);
  const st::HostBatch own = st::make_batch(o);
  const st::HostTensors own_tensors = st::materialize_host(own);
  expect_poisoned_but_named(own, own_tensors.kv_cache, own_tensors.inv_scale, named_slots(own, own, {&own.window()}));
  expect_poisoned_but_named(*own.extra, own_tensors.extra_kv_cache, own_tensors.extra_inv_scale,
                            named_slots(own, *own.extra, {&*own.extra}));

  o.extra->shares_window_cache = true;
  o.extra->cross_duplicate_fraction = 0.3;
  const st::HostBatch shared = st::make_batch(o);
  const st::HostTensors shared_tensors = st::materialize_host(shared);
  EXPECT_TRUE(shared_tensors.extra_kv_cache.empty());
  expect_poisoned_but_named(shared, shared_tensors.kv_cache, shared_tensors.inv_scale,
                            named_slots(shared, shared, {&shared.window(), &*shared.extra}));
}

// The layers have the entries testing/layer.h promises: c4a min(top_k, context / 4) distinct
// positions of the request, c128a all context / 128 of them in order, padding rows with lens 0
// in both sources, the window's lengths as ever.
TEST(LayerHarness, LayersHaveTheirEntries) {
  for (const LayerKind kind : {LayerKind::kC4a, LayerKind::kC128a}) {
    SCOPED_TRACE(st::layer_name(kind));
    const st::LayerSpec spec{.kind = kind, .mean_context = kind == LayerKind::kC4a ? 8192 : 131072};
    st::BatchOptions o = st::layer_options(spec, 512, 16, 128, DType::kInt32, 300);
    o.head_dim = 16;  // the rows' contents play no part here
    const st::HostBatch b = st::make_batch(o);
    const st::HostSource& x = *b.extra;
    int64_t padding = 0;
    for (int64_t t = 0; t < b.num_tokens; ++t) {
      const int64_t positions = b.context[t] / (kind == LayerKind::kC4a ? 4 : 128);
      const int64_t entries = kind == LayerKind::kC4a ? std::min<int64_t>(512, positions) : positions;
      if (b.lens[t] == 0) {
        ASSERT_EQ(x.lens[t], 0) << "a padding row has lens 0 in both sources, token " << t;
        ++padding;
        continue;
      }
      ASSERT_EQ(b.lens[t], std::min<int64_t>(b.context[t], 128)) << "token " << t;
      ASSERT_EQ(x.lens[t], entries) << "token " << t;
      ASSERT_EQ(x.entries[t], entries) << "token " << t;
      const int64_t* row = &x.indices[t * x.index_stride];
      ASSERT_EQ(std::set<int64_t>(row, row + entries).size(), static_cast<size_t>(entries)) << "token " << t;
      for (int64_t c = 1; c < entries && kind == LayerKind::kC128a; ++c) {
        if (c % st::kC128aBlockSize != 0) {
          ASSERT_EQ(row[c], row[c - 1] + 1) << "token " << t << " column " << c;
        }
      }
    }
    EXPECT_GT(padding, 0);
    EXPECT_LT(padding, b.num_tokens / 10);
    const double mean_extra = static_cast<double>(b.total_extra_entries(0, b.num_tokens)) / b.num_tokens;
    // c4a: contexts 1..16384, so 1 in 8 has fewer than 512 positions (256 on average): 480;
    // c128a: contexts 1..262144, 1024 positions on average.
    const double expected = kind == LayerKind::kC4a ? 480.0 : 1024.0;
    EXPECT_NEAR(mean_extra, expected * (1 - st::kLayerPaddingRowFraction), 0.08 * expected);
  }
}

// select_tokens keeps each token's result, with the extra source in its own pool and in the
// window's, and the reference split over threads equals the reference on one.
TEST(LayerHarness, CompactCopiesAndThreadedReferenceKeepResults) {
  for (const bool shared : {false, true}) {
    st::BatchOptions o = small_options(10, 400 + shared);
    o.extra->shares_window_cache = shared;
    o.extra->cross_duplicate_fraction = shared ? 0.3 : 0.0;
    o.extra->hole_fraction = o.extra->duplicate_fraction = o.extra->out_of_range_fraction = 0.15;
    o.hole_fraction = o.duplicate_fraction = o.out_of_range_fraction = 0.15;
    const st::HostBatch batch = st::make_batch(o);
    st::HostTensors full_tensors = st::materialize_host(batch);
    const auto full = swa_decode::reference::compute(st::host_args(batch, full_tensors));
    const std::vector<int64_t> tokens = {7, 2, 9, 0};
    for (const int threads : {1, 3}) {
      const st::ReferenceOutputs part = st::compute_reference(batch, tokens, threads);
      for (size_t i = 0; i < tokens.size(); ++i) {
        for (int64_t h = 0; h < batch.num_heads; ++h) {
          ASSERT_EQ(part.result.lse_at(i, h), full.lse_at(tokens[i], h)) << "token " << tokens[i];
          for (int64_t d = 0; d < batch.head_dim; ++d) {
            ASSERT_EQ(part.result.out_at(i, h, d), full.out_at(tokens[i], h, d)) << "token " << tokens[i];
          }
        }
      }
    }
  }
}

// The check passes the CPU backend and fails it when the extra source is left out: it covers
// both sources.
TEST(LayerHarness, CheckCoversTheExtraSource) {
  st::BatchOptions o = small_options(8, 500);
  o.out_head_stride = 72;
  const st::HostBatch batch = st::make_batch(o);
  ASSERT_GT(batch.total_extra_entries(0, batch.num_tokens), 0);
  const st::CheckReport good = st::check_outputs(batch, run_cpu_backend(batch), {}, {}, 2);
  EXPECT_TRUE(good.ok) << good.summary() << "\n" << good.failures;
  const st::CheckReport without_extra = st::check_outputs(batch, run_cpu_backend(batch, /*drop_extra=*/true));
  EXPECT_FALSE(without_extra.ok);
  EXPECT_GT(without_extra.out_violations, 0);
}

// A NaN q head is skipped, alone: its NaN output passes, a wrong value in another head of the
// same token fails.
TEST(LayerHarness, CheckSkipsOnlyTheNanHeads) {
  st::BatchOptions o = small_options(3, 600);
  o.nan_q_heads = {{1, 2}};
  o.context_lens = {1600, 1600, 1600};
  const st::HostBatch batch = st::make_batch(o);
  const st::Outputs outputs = run_cpu_backend(batch);
  const int64_t nan_head_out = batch.out_token_stride + 2 * batch.out_head_stride;
  ASSERT_TRUE(std::isnan(swa_decode::reference::bf16_to_float(outputs.out[nan_head_out])));
  const st::CheckReport report = st::check_outputs(batch, outputs);
  EXPECT_TRUE(report.ok) << report.summary() << "\n" << report.failures;
  st::Outputs wrong = outputs;
  const int64_t other_head_out = batch.out_token_stride + 1 * batch.out_head_stride + 5;
  const float value = swa_decode::reference::bf16_to_float(wrong.out[other_head_out]);
  wrong.out[other_head_out] = st::float_to_bf16_bits(value + 0.25f + 0.1f * std::fabs(value));
  EXPECT_EQ(st::check_outputs(batch, wrong).out_violations, 1);
}

// A poisoned copy with every span filled in is the dense pool, for the thresholds the upload uses
// and for one row per span; spans increase, do not overlap and respect the size cap.
TEST(LayerHarness, PoolSpansRebuildThePool) {
  st::BatchOptions o = small_options(16, 700);
  o.kv_row_stride = 72;
  o.extra->kv_row_stride = 80;
  o.extra->kv_block_pad = 8;
  const st::HostBatch batch = st::make_batch(o);
  for (const st::HostSource* pool : {&batch.window(), &*batch.extra}) {
    const std::vector<uint8_t> dense = st::dense_kv_cache(*pool);
    for (const auto& [max_gap, max_bytes] : {std::pair<int64_t, int64_t>{64 << 10, 64 << 20}, {0, 1}, {200, 4096}}) {
      std::vector<uint8_t> rebuilt(dense.size(), st::kE4m3NaN);
      const std::vector<st::PoolSpan> spans = st::pool_spans(*pool, max_gap, max_bytes);
      int64_t previous_end = 0, rows = 0;
      for (const st::PoolSpan& span : spans) {
        ASSERT_GE(span.begin, previous_end);
        ASSERT_TRUE(span.end - span.begin <= std::max(max_bytes, pool->head_dim)) << span.begin;
        st::fill_span(*pool, span, &rebuilt[span.begin]);
        previous_end = span.end;
        rows += span.end_live - span.first_live;
      }
      EXPECT_EQ(rows, static_cast<int64_t>(pool->live_slots.size()));
      EXPECT_EQ(rebuilt, dense) << "max_gap " << max_gap << ", max_bytes " << max_bytes;
    }
  }
}

// The layers a bench or a test may ask for, and the ones it may not.
TEST(LayerHarness, LayerLimits) {
  EXPECT_EQ(st::layer_problem({.kind = LayerKind::kC128a, .mean_context = 1 << 20}, 128), "");
  EXPECT_NE(st::layer_problem({.kind = LayerKind::kC128a, .mean_context = (1 << 20) + 1}, 128), "");
  EXPECT_NE(st::layer_problem({.kind = LayerKind::kC128a, .top_k = 512}, 128), "");
  EXPECT_NE(st::layer_problem({.kind = LayerKind::kSwa, .top_k = 512}, 128), "");
  EXPECT_NE(st::layer_problem({.kind = LayerKind::kC4a, .top_k = swa_decode::kMaxExtraEntries + 1}, 64), "");
  EXPECT_EQ(st::default_top_k(64), 512);
  EXPECT_EQ(st::default_top_k(128), 1024);
  EXPECT_EQ(st::parse_layer("c128a"), LayerKind::kC128a);
  EXPECT_FALSE(st::parse_layer("c64a").has_value());
  // The window-only layer is the bench's batch from before layers existed: contexts 1..8192 in a
  // pool covering them, no extra source, no padding rows.
  const st::BatchOptions swa = st::layer_options({.kind = LayerKind::kSwa}, 8, 128, 128, DType::kInt32, 1);
  EXPECT_EQ(swa.max_context, 8192);
  EXPECT_TRUE(swa.window_pool_covers_context);
  EXPECT_FALSE(swa.extra.has_value());
  EXPECT_EQ(swa.padding_row_fraction, 0.0);
}

}  // namespace
