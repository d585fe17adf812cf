// The GPU kernel against the float64 reference on fresh random realistic inputs, every unused cache
// slot, scale and padding element poisoned with NaN, covering each rule of docs/semantics.md.
// Every test skips cleanly when no CUDA device is present; the TestingHarness suite checks the
// harness itself on the CPU backend and runs everywhere.
//
// SWA_DECODE_TEST_KERNEL=auto|portable|sm90 (unset = auto; any other value fails every GPU test)
// picks the kernel under test. A case is one decode on one batch; a test may loop over several.
// Each case is decided on its own (testing/kernel_under_test.h): with a forced family it runs on
// that family or, where the family cannot run it, is skipped with the family's why_not; it never
// runs on another kernel. A test whose every case was skipped is reported SKIPPED with
//   kernel under test <family> cannot run this case: <why_not>
// and a test where some cases ran is judged on those, records the property
// kernel_under_test_skipped_cases and prints
//   kernel under test <family> skipped <N> of <M> cases: <why_not>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "swa_decode/swa_decode.h"
#include "src/common/window_rule.h"
#include "src/reference/reference.h"
#include "testing/batch.h"
#include "testing/check.h"
#include "testing/cuda_check.h"
#include "testing/device_batch.h"
#include "testing/device_buffer.h"
#include "testing/host_numerics.h"
#include "testing/kernel_under_test.h"
#include "tests/gpu/gpu_test.h"

namespace {

namespace st = swa_decode::testing;
using swa_decode::DType;
using swa_decode::EmptyTokenLse;

constexpr float kInf = std::numeric_limits<float>::infinity();

// The window every edge-case test uses, with index rows longer than it whose extra columns hold
// in-range ids of poisoned slots: reading past window_size (or past lens) turns the output NaN.
st::BatchOptions edge_options(int64_t num_tokens, int64_t num_heads, uint64_t seed) {
  st::BatchOptions o;
  o.num_tokens = num_tokens;
  o.num_heads = num_heads;
  o.window_size = 128;
  o.index_cols = 160;
  o.garbage_past_window = true;
  o.with_sink = true;
  o.seed = seed;
  return o;
}

using st::GpuTest;

class GpuDecode : public GpuTest {};

TEST_F(GpuDecode, RealisticBatch) {
  st::BatchOptions o;
  o.num_tokens = 64;
  o.num_heads = 128;
  o.index_dtype = DType::kInt32;
  o.lens_dtype = DType::kInt32;
  o.with_sink = true;
  o.seed = 11;
  expect_matches_reference(o);
}

// lens 0, -1, 1, W-1, W, W+1, once with contexts longer than the window (full index rows, so
// lens < W leaves valid-looking ids past lens) and once with context = max(lens, 1).
TEST_F(GpuDecode, LengthsAroundTheWindow) {
  const std::vector<int64_t> lens = {0, -1, 1, 127, 128, 129};
  for (DType type : {DType::kInt32, DType::kInt64}) {
    st::BatchOptions o = edge_options(12, 16, 21);
    o.index_dtype = o.lens_dtype = type;
    for (int64_t len : lens) {
      o.lens.push_back(len);
      o.context_lens.push_back(1000 + len);
    }
    for (int64_t len : lens) {
      o.lens.push_back(len);
      o.context_lens.push_back(std::max<int64_t>(len, 1));
    }
    expect_matches_reference(o);
  }
}

TEST_F(GpuDecode, HolesInTheWindow) {
  st::BatchOptions o = edge_options(40, 32, 31);
  o.hole_fraction = 0.3;
  expect_matches_reference(o);
}

TEST_F(GpuDecode, DuplicateSlots) {
  st::BatchOptions o = edge_options(40, 32, 41);
  o.duplicate_fraction = 0.4;
  expect_matches_reference(o);
}

TEST_F(GpuDecode, AllEntriesMissing) {
  st::BatchOptions o = edge_options(16, 64, 51);
  o.all_invalid_fraction = 1.0;  // every token empty: out 0, lse -inf, whatever the sink
  expect_matches_reference(o);
  o.all_invalid_fraction = 0.3;  // empty tokens next to full ones
  o.seed = 52;
  expect_matches_reference(o);
  o.empty_token_lse = EmptyTokenLse::kPositiveInfinity;  // FlashMLA's lse for the empty ones
  expect_matches_reference(o);
}

TEST_F(GpuDecode, IdsOutOfRange) {
  for (DType type : {DType::kInt32, DType::kInt64}) {
    st::BatchOptions o = edge_options(40, 16, 61);
    o.index_dtype = o.lens_dtype = type;
    o.out_of_range_fraction = 0.3;
    expect_matches_reference(o);
  }
}

TEST_F(GpuDecode, StridedTensors) {
  st::BatchOptions o = edge_options(24, 32, 71);
  o.kv_row_stride = 576;              // padded row format
  o.q_head_stride = 576;
  o.q_token_stride = 32 * 576 + 64;
  o.out_head_stride = 640;
  o.out_token_stride = 32 * 640 + 32;
  o.lse_token_stride = 32 + 3;
  o.index_row_pad = 5;
  o.hole_fraction = 0.1;
  expect_matches_reference(o);
}

TEST_F(GpuDecode, SinksInfiniteAndFinite) {
  st::BatchOptions o = edge_options(16, 16, 81);
  o.sinks = {kInf, -kInf, 0.0f, 3.5f, -1.0f, 8.0f, kInf, -kInf, 1.0f, -20.0f, 20.0f, 0.5f, -kInf, kInf, 2.0f, -3.0f};
  o.lens = {128, 0, 1, 129, -1, 64, 128, 127, 5, 0, 128, 128, 33, 1, 128, 100};
  o.context_lens.assign(16, 4000);
  expect_matches_reference(o);
}

// q from 2^-30 to 2^24 (per head, so rows of one mma take different power-of-two scales into
// f16) and inv_scale from 2^-20 to 2^12: the portable kernel's f16 path must rescale all of them
// exactly. The scale keeps the largest heads' scores at a few units.
TEST_F(GpuDecode, MagnitudesAcrossTheF16Range) {
  for (const double inv_scale_magnitude : {0x1p-20, 0x1p12}) {
    st::BatchOptions o = edge_options(16, 32, 95);
    o.q_magnitudes = {0x1p-30, 0x1p-3, 1.0, 0x1p12, 0x1p24, 0x1p-14};
    o.inv_scale_magnitude = inv_scale_magnitude;
    o.inv_scale_dtype = DType::kFloat32;
    o.scale = static_cast<float>(0x1p-24 / std::sqrt(512.0) / inv_scale_magnitude);
    o.with_sink = true;
    expect_matches_reference(o);
  }
}

TEST_F(GpuDecode, NoSinkNoLse) {
  st::BatchOptions o = edge_options(16, 32, 91);
  o.with_sink = false;
  o.with_lse = false;
  o.hole_fraction = 0.1;
  expect_matches_reference(o);
}

// H x index dtype x inv_scale dtype, every edge case mixed into one batch.
class GpuDecodeShapes : public GpuTest, public ::testing::WithParamInterface<std::tuple<int64_t, DType, DType>> {};

TEST_P(GpuDecodeShapes, MixedEdgeCases) {
  const auto [heads, index_type, scale_type] = GetParam();
  st::BatchOptions o = edge_options(48, heads, 100 + heads);
  o.index_dtype = o.lens_dtype = index_type;
  o.inv_scale_dtype = scale_type;
  o.hole_fraction = 0.1;
  o.duplicate_fraction = 0.1;
  o.out_of_range_fraction = 0.05;
  o.all_invalid_fraction = 0.05;
  expect_matches_reference(o);
}

std::string shape_name(const ::testing::TestParamInfo<std::tuple<int64_t, DType, DType>>& info) {
  const auto& [heads, index_type, scale_type] = info.param;
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a known false positive) on "H" + string.
  std::string name = std::to_string(heads);
  name.insert(0, 1, 'H');
  name.append(index_type == DType::kInt32 ? "_int32" : "_int64");
  name.append(scale_type == DType::kFloat32 ? "_fp32scale" : "_bf16scale");
  return name;
}

INSTANTIATE_TEST_SUITE_P(HeadsIndexScale, GpuDecodeShapes,
                         ::testing::Combine(::testing::Values(1, 8, 16, 32, 64, 128),
                                            ::testing::Values(DType::kInt32, DType::kInt64),
                                            ::testing::Values(DType::kBFloat16, DType::kFloat32)),
                         shape_name);

TEST_F(GpuDecode, LongWindows) {
  for (int64_t window : {512, 1024}) {
    for (int64_t heads : {16, 128}) {
      st::BatchOptions o = edge_options(8, heads, 200 + window + heads);
      o.window_size = window;
      o.index_cols = window + 100;
      o.hole_fraction = 0.05;
      expect_matches_reference(o);
    }
  }
}

TEST_F(GpuDecode, TokenCounts) {
  for (int64_t tokens : {1, 3, 64, 300}) {
    st::BatchOptions o = edge_options(tokens, tokens == 300 ? 128 : 64, 300 + tokens);
    o.index_dtype = o.lens_dtype = DType::kInt32;
    expect_matches_reference(o);
  }
}

// Head counts whose last block of 32 heads is partly empty (80, 112), with every edge case mixed in.
TEST_F(GpuDecode, PartlyEmptyLastHeadBlock) {
  for (int64_t heads : {112, 80}) {
    st::BatchOptions o = edge_options(64, heads, 500 + heads);
    o.hole_fraction = 0.1;
    o.duplicate_fraction = 0.05;
    o.all_invalid_fraction = 0.02;
    expect_matches_reference(o);
  }
}

// Batches small enough that on sm_90 the portable kernel splits each window over a cluster of 4
// CTAs (portable_plan.h, choose_window_splits: at most 8 CTAs before the split on 132 SMs), with
// lengths that leave some of the 4 CTAs without a tile (0, 1, 31, 33, 97) and every other edge case.
TEST_F(GpuDecode, SmallBatchesSplittingTheWindow) {
  struct Case {
    int64_t heads;
    std::vector<int64_t> lens;
  };
  const Case cases[] = {{128, {97}}, {64, {33, 128}}, {16, {0, 1, 31, 33, 97, 127, 128, 129}}, {1, {128, 5, 64, 96}}};
  for (const Case& c : cases) {
    st::BatchOptions o = edge_options(static_cast<int64_t>(c.lens.size()), c.heads, 600 + c.heads);
    o.lens = c.lens;
    for (int64_t len : c.lens) o.context_lens.push_back(std::max<int64_t>(len, 1) + 500);
    o.hole_fraction = 0.1;
    o.duplicate_fraction = 0.1;
    o.out_of_range_fraction = 0.05;
    expect_matches_reference(o);
  }
  for (int64_t window : {256, 1024}) {  // several tiles per CTA of the cluster
    st::BatchOptions o = edge_options(2, 16, 700 + window);
    o.window_size = window;
    o.index_cols = window + 8;
    o.hole_fraction = 0.05;
    expect_matches_reference(o);
  }
}

TEST_F(GpuDecode, ZeroTokensIsANoOp) {
  const st::HostBatch batch = st::make_batch(edge_options(1, 16, 400));
  st::DeviceBatch device = st::upload_batch(batch);
  st::Stream stream;
  const swa_decode::DecodeArgs args = st::device_args(batch, device, 0, 0, stream.get());
  if (!admit(args)) return;
  st::poison_outputs(device, stream.get());
  const swa_decode::Status status = run_decode(args);
  ASSERT_TRUE(status.ok()) << status.message;
  stream.synchronize();
  const st::Outputs outputs = st::download_outputs(device);
  for (uint16_t bits : outputs.out) ASSERT_EQ(bits, st::kBf16PoisonBits) << "num_tokens 0 wrote out";
}

// Capture once, then replay with new inputs copied into the same buffers: the graph must read the
// data at replay time, not at capture time.
TEST_F(GpuDecode, GraphReplayWithNewInputs) {
  st::BatchOptions o = edge_options(32, 64, 500);
  o.context_lens.assign(32, 0);
  for (int64_t t = 0; t < 32; ++t) o.context_lens[t] = 50 + 250 * t;  // same pool size every draw
  o.spare_blocks = 8;
  o.hole_fraction = 0.1;
  const st::HostBatch first = st::make_batch(o);
  st::DeviceBatch device = st::upload_batch(first);
  st::Stream stream;
  const swa_decode::DecodeArgs args = st::device_args(first, device, 0, first.num_tokens, stream.get());
  if (!admit(args)) return;  // decided before the capture, which must hold nothing but the decode

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  SWAD_TESTING_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  const swa_decode::Status status = run_decode(args);
  SWAD_TESTING_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
  ASSERT_TRUE(status.ok()) << status.message;
  SWAD_TESTING_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  for (uint64_t replay = 1; replay <= 2; ++replay) {
    o.seed = 500 + replay;
    const st::HostBatch next = st::make_batch(o);
    st::upload_into(next, device);
    st::poison_outputs(device, stream.get());
    SWAD_TESTING_CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
    stream.synchronize();
    const st::CheckReport report = st::check_outputs(next, st::download_outputs(device));
    EXPECT_TRUE(report.ok) << "replay " << replay << ": " << report.summary() << "\n" << report.failures;
  }
  SWAD_TESTING_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SWAD_TESTING_CUDA_CHECK(cudaGraphDestroy(graph));
}

// ---- The harness itself, on the CPU backend (runs without a GPU) ----

st::Outputs run_cpu_backend(const st::HostBatch& batch) {
  st::HostTensors tensors = st::materialize_host(batch);
  const swa_decode::Status status = swa_decode::decode(st::host_args(batch, tensors));
  EXPECT_TRUE(status.ok()) << status.message;
  return st::Outputs{.out = tensors.out, .lse = tensors.lse};
}

TEST(TestingHarness, CpuBackendPassesTheCheck) {
  st::BatchOptions o = edge_options(6, 8, 600);
  o.head_dim = 64;
  o.hole_fraction = o.duplicate_fraction = o.out_of_range_fraction = 0.1;
  o.all_invalid_fraction = 0.2;
  o.kv_row_stride = 80;
  o.out_head_stride = 72;
  o.lse_token_stride = 11;
  const st::HostBatch batch = st::make_batch(o);
  const st::CheckReport report = st::check_outputs(batch, run_cpu_backend(batch));
  EXPECT_TRUE(report.ok) << report.summary() << "\n" << report.failures;
  EXPECT_EQ(report.tokens_compared, 6);
}

TEST(TestingHarness, CheckCatchesWrongUnwrittenAndOverrunOutputs) {
  st::BatchOptions o = edge_options(3, 4, 601);
  o.head_dim = 64;
  o.out_head_stride = 70;
  o.context_lens = {500, 500, 500};
  const st::HostBatch batch = st::make_batch(o);
  const st::Outputs good = run_cpu_backend(batch);

  st::Outputs wrong = good;
  const float value = swa_decode::reference::bf16_to_float(wrong.out[5]);
  wrong.out[5] = st::float_to_bf16_bits(value + 0.25f + 0.1f * std::fabs(value));
  EXPECT_GT(st::check_outputs(batch, wrong).out_violations, 0);

  st::Outputs unwritten = good;
  unwritten.out[batch.out_token_stride + 3] = st::kBf16PoisonBits;
  const st::CheckReport report = st::check_outputs(batch, unwritten);
  EXPECT_FALSE(report.ok);
  EXPECT_EQ(report.out_unwritten, 1);

  st::Outputs overrun = good;
  overrun.out[64] = 0;  // between head 0 and head 1 (head stride 70 > D = 64)
  EXPECT_EQ(st::check_outputs(batch, overrun).out_gap_writes, 1);

  st::Outputs bad_lse = good;
  bad_lse.lse[1] += 0.1f;
  EXPECT_EQ(st::check_outputs(batch, bad_lse).lse_violations, 1);
}

// Every slot no valid entry names is poisoned; every valid entry names a finite, live row.
TEST(TestingHarness, PoisonCoversEverySlotNoValidEntryNames) {
  st::BatchOptions o = edge_options(20, 2, 602);
  o.head_dim = 32;
  o.hole_fraction = o.duplicate_fraction = o.out_of_range_fraction = 0.2;
  o.lens = {0, -1, 1, 127, 128, 129, 5, 0, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128, 128};
  o.max_context = 600;
  o.kv_row_stride = 40;
  const st::HostBatch batch = st::make_batch(o);
  const st::HostTensors tensors = st::materialize_host(batch);
  std::vector<bool> named(batch.num_slots, false);
  for (int64_t t = 0; t < batch.num_tokens; ++t) {
    const int32_t cols = swa_decode::columns_in_window(batch.lens[t], static_cast<int32_t>(batch.window_size));
    for (int32_t c = 0; c < cols; ++c) {
      const int64_t id = batch.indices[t * batch.index_stride + c];
      if (swa_decode::slot_is_valid(id, batch.num_slots)) named[id] = true;
    }
  }
  for (int64_t slot = 0; slot < batch.num_slots; ++slot) {
    const uint8_t* row = &tensors.kv_cache[slot * batch.kv_row_stride];
    const float scale = swa_decode::reference::bf16_to_float(static_cast<uint16_t>(tensors.inv_scale[2 * slot] |
                                                                      tensors.inv_scale[2 * slot + 1] << 8));
    ASSERT_EQ(std::isnan(scale), !named[slot]) << "slot " << slot;
    for (int64_t b = 0; b < batch.kv_row_stride; ++b) {
      const bool poisoned = row[b] == st::kE4m3NaN;
      if (b >= batch.head_dim || !named[slot]) {
        ASSERT_TRUE(poisoned) << "slot " << slot << " byte " << b;
      } else {
        ASSERT_TRUE((row[b] & 0x7F) != 0x7F) << "live slot " << slot << " holds a NaN code";
      }
    }
  }
}

// The compact copy select_tokens builds gives the same reference result as the full batch.
TEST(TestingHarness, SelectTokensPreservesResults) {
  st::BatchOptions o = edge_options(10, 4, 603);
  o.head_dim = 64;
  o.index_dtype = DType::kInt64;
  o.hole_fraction = o.duplicate_fraction = o.out_of_range_fraction = 0.15;
  const st::HostBatch batch = st::make_batch(o);
  st::HostTensors full_tensors = st::materialize_host(batch);
  const auto full = swa_decode::reference::compute(st::host_args(batch, full_tensors));
  const std::vector<int64_t> tokens = {7, 2, 9};
  const st::HostBatch subset = st::select_tokens(batch, tokens);
  st::HostTensors subset_tensors = st::materialize_host(subset);
  const auto part = swa_decode::reference::compute(st::host_args(subset, subset_tensors));
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (int64_t h = 0; h < batch.num_heads; ++h) {
      EXPECT_EQ(part.lse_at(i, h), full.lse_at(tokens[i], h));
      for (int64_t d = 0; d < batch.head_dim; ++d) {
        ASSERT_EQ(part.out_at(i, h, d), full.out_at(tokens[i], h, d)) << "token " << tokens[i];
      }
    }
  }
}

TEST(TestingHarness, E4m3EncodeRoundTripsEveryFiniteCode) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;
    const double value = st::e4m3_to_double(static_cast<uint8_t>(code));
    const uint8_t back = st::double_to_e4m3(value);
    if (value == 0.0) {
      EXPECT_EQ(back & 0x7F, 0);
    } else {
      EXPECT_EQ(back, code) << value;
    }
  }
  EXPECT_EQ(st::double_to_e4m3(1e6), 0x7E);   // saturates, never NaN
  EXPECT_EQ(st::double_to_e4m3(-1e6), 0xFE);
}

}  // namespace
