// validate_args: every bad argument is kInvalidArgument with a message naming the field, the
// expected and the actual value; good arguments (including num_tokens = 0) pass.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <locale>
#include <string>
#include <vector>

#include "swa_decode/limits.h"
#include "src/api/validate.h"
#include "src/reference/reference.h"
#include "testing/host_problem.h"

namespace swa_decode {
namespace {

using testing::HostProblem;
using testing::ProblemShape;

ProblemShape small_shape() {
  ProblemShape s;
  s.num_tokens = 2;
  s.num_heads = 4;
  s.head_dim = 8;
  s.num_blocks = 3;
  s.block_size = 4;
  s.window_size = 4;
  s.index_cols = 5;
  return s;
}

// small_shape() with an extra source whose every size differs from the window's, so a message
// that names the wrong source's value shows: S_x = 2 * 3 = 6 slots, 6 entries, 7 index columns.
ProblemShape shape_with_extra() {
  ProblemShape s = small_shape();
  s.extra = testing::ExtraShape{.num_blocks = 2, .block_size = 3, .max_entries = 6, .index_cols = 7};
  return s;
}

struct BadCase {
  const char* name;
  std::function<void(DecodeArgs&)> mutate;
  std::vector<std::string> substrings;  // the field, the expected and the actual value
};

void expect_invalid(const DecodeArgs& a, const BadCase& c) {
  const Status status = validate_args(a);
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument) << c.name << ": " << status.message;
  for (const std::string& part : c.substrings) {
    EXPECT_NE(status.message.find(part), std::string::npos)
        << c.name << ": message \"" << status.message << "\" lacks \"" << part << "\"";
  }
  // decode() reports the same status without touching anything.
  const Status from_decode = decode(a);
  EXPECT_EQ(from_decode.code, StatusCode::kInvalidArgument) << c.name;
  EXPECT_EQ(from_decode.message, status.message) << c.name;
}

// Each case, applied alone to valid arguments over `shape` (sinks and lse set), is refused.
void expect_each_invalid(const ProblemShape& shape, const std::vector<BadCase>& cases) {
  for (const BadCase& c : cases) {
    HostProblem p(shape, 7);
    p.set_sink({0.0f, 1.0f, 2.0f, 3.0f});
    DecodeArgs a = p.args();
    ASSERT_TRUE(validate_args(a).ok()) << c.name << ": " << validate_args(a).message;
    c.mutate(a);
    expect_invalid(a, c);
  }
}

TEST(Validation, GoodArgumentsPass) {
  HostProblem p(small_shape(), 1);
  EXPECT_TRUE(validate_args(p.args()).ok()) << validate_args(p.args()).message;
  DecodeArgs a = p.args();
  a.backend = Backend::kCuda;
  EXPECT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  a.attn_sink = nullptr;
  a.lse = nullptr;
  EXPECT_TRUE(validate_args(a).ok());
  EXPECT_TRUE(decode(p.args()).ok());
}

TEST(Validation, StridedAndHeadMajorLayoutsPass) {
  ProblemShape s = small_shape();
  s.q_head_pad = 8;
  s.q_token_pad = 3;
  s.out_head_pad = 1;
  s.kv_token_pad = 72;  // a 584-byte row with D = 512 has 72 bytes of padding
  s.kv_block_pad = 5;
  s.index_pad = 4;
  s.lse_pad = 1;
  HostProblem strided(s, 2);
  EXPECT_TRUE(validate_args(strided.args()).ok()) << validate_args(strided.args()).message;
  s.head_major_q = true;
  HostProblem head_major(s, 3);
  EXPECT_TRUE(validate_args(head_major.args()).ok()) << validate_args(head_major.args()).message;
}

TEST(Validation, StridesOfSizeOneDimensionsAreIgnored) {
  ProblemShape s = small_shape();
  s.num_tokens = 1;
  s.num_heads = 1;
  s.num_blocks = 1;
  HostProblem p(s, 4);
  DecodeArgs a = p.args();
  a.stride_q_token = a.stride_q_head = 0;
  a.stride_out_token = a.stride_out_head = -3;
  a.stride_indices_token = 1;
  a.stride_lse_token = 0;
  a.stride_kv_block = 0;
  EXPECT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  const DecodeParams params = make_params(a);  // strides of size-1 dimensions become 0
  EXPECT_EQ(params.stride_q_token, 0);
  EXPECT_EQ(params.stride_q_head, 0);
  EXPECT_EQ(params.stride_out_token, 0);
  EXPECT_EQ(params.stride_out_head, 0);
  EXPECT_EQ(params.window.stride_indices_token, 0);
  EXPECT_EQ(params.stride_lse_token, 0);
  EXPECT_EQ(params.window.stride_kv_block, 0);
  EXPECT_EQ(params.window.stride_kv_token, a.stride_kv_token);
  EXPECT_TRUE(decode(a).ok());
}

// The kernels write lse for a token without entries from DecodeParams: -inf by default, +inf for
// FlashMLA's convention.
TEST(Validation, EmptyTokenLseBecomesTheValueTheKernelsWrite) {
  HostProblem p(small_shape(), 6);
  DecodeArgs a = p.args();
  EXPECT_EQ(make_params(a).empty_token_lse, -std::numeric_limits<float>::infinity());
  a.empty_token_lse = EmptyTokenLse::kPositiveInfinity;
  ASSERT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  EXPECT_EQ(make_params(a).empty_token_lse, std::numeric_limits<float>::infinity());
}

// lens may be absent in either source (every index column counts) and may hold one length per
// lens_rows_per_entry tokens when that divides T; make_params passes both as they are.
TEST(Validation, AbsentLensAndLensCoveringSeveralTokensPass) {
  ProblemShape s = shape_with_extra();
  s.num_tokens = 6;
  HostProblem p(s, 17);
  DecodeArgs a = p.args();
  a.lens = nullptr;
  a.extra.lens_rows_per_entry = 3;
  ASSERT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  DecodeParams params = make_params(a);
  EXPECT_EQ(params.window.lens, nullptr);
  EXPECT_EQ(params.window.lens_rows_per_entry, 1);
  EXPECT_EQ(params.extra.lens, a.extra.lens);
  EXPECT_EQ(params.extra.lens_rows_per_entry, 3);
  EXPECT_TRUE(decode(a).ok());

  a = p.args();
  a.lens_rows_per_entry = 6;
  a.extra.lens = nullptr;
  a.extra.lens_rows_per_entry = 4;  // ignored nowhere: it must still divide T
  EXPECT_NE(validate_args(a).message.find("extra.lens_rows_per_entry must divide num_tokens = 6"), std::string::npos)
      << validate_args(a).message;
  a.extra.lens_rows_per_entry = 2;
  ASSERT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  params = make_params(a);
  EXPECT_EQ(params.window.lens_rows_per_entry, 6);
  EXPECT_EQ(params.extra.lens, nullptr);
  EXPECT_EQ(params.extra.lens_rows_per_entry, 2);
}

TEST(Validation, ZeroTokensIsAValidNoOpEvenWithNullPerTokenPointers) {
  HostProblem p(small_shape(), 5);
  DecodeArgs a = p.args();
  a.num_tokens = 0;
  a.q = nullptr;
  a.indices = nullptr;
  a.lens = nullptr;
  a.out = nullptr;
  a.lse = nullptr;
  a.stride_q_token = a.stride_out_token = a.stride_indices_token = a.stride_lse_token = 0;
  EXPECT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  EXPECT_TRUE(decode(a).ok());
}

TEST(Validation, EveryBadArgumentNamesFieldExpectedAndActual) {
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<BadCase> cases = {
      {"backend", [](DecodeArgs& a) { a.backend = static_cast<Backend>(7); }, {"backend", "kCuda or kCpu", "7"}},
      {"num_tokens < 0", [](DecodeArgs& a) { a.num_tokens = -1; }, {"num_tokens", "[0, 2147483647]", "got -1"}},
      {"num_tokens > int32", [](DecodeArgs& a) { a.num_tokens = int64_t{1} << 31; }, {"num_tokens", "got 2147483648"}},
      {"num_heads 0", [](DecodeArgs& a) { a.num_heads = 0; }, {"num_heads", "[1, 2147483647]", "got 0"}},
      {"num_heads > kMaxGpuHeads on CUDA",
       [](DecodeArgs& a) { a.backend = Backend::kCuda; a.num_heads = kMaxGpuHeads + 1; },
       {"num_heads", "[1, " + std::to_string(kMaxGpuHeads) + "]", "got " + std::to_string(kMaxGpuHeads + 1)}},
      {"head_dim 0", [](DecodeArgs& a) { a.head_dim = 0; }, {"head_dim", "[1, ", "got 0"}},
      {"num_blocks 0", [](DecodeArgs& a) { a.num_blocks = 0; }, {"num_blocks", "got 0"}},
      {"block_size -4", [](DecodeArgs& a) { a.block_size = -4; }, {"block_size", "got -4"}},
      {"window_size 0", [](DecodeArgs& a) { a.window_size = 0; },
       {"window_size must be in [1, " + std::to_string(kMaxWindow) + "], got 0"}},
      {"window_size > kMaxWindow", [](DecodeArgs& a) { a.window_size = a.index_cols = kMaxWindow + 1; },
       {"window_size must be in [1, " + std::to_string(kMaxWindow) + "], got " + std::to_string(kMaxWindow + 1)}},
      {"slots overflow", [](DecodeArgs& a) { a.num_blocks = int64_t{1} << 40; a.block_size = int64_t{1} << 30; },
       {"num_blocks * block_size", "int64", "1099511627776", "1073741824"}},
      {"index_cols", [](DecodeArgs& a) { a.index_cols = 3; }, {"index_cols must be >= window_size = 4, got 3"}},
      {"num_scales", [](DecodeArgs& a) { a.num_scales = 11; }, {"num_scales", ">= num_blocks * block_size = 12", "got 11"}},
      {"scale nan", [kNan](DecodeArgs& a) { a.scale = kNan; }, {"scale must be finite", "nan"}},
      {"scale inf", [](DecodeArgs& a) { a.scale = std::numeric_limits<float>::infinity(); }, {"scale must be finite", "inf"}},
      {"inv_scale_dtype", [](DecodeArgs& a) { a.inv_scale_dtype = DType::kInt32; },
       {"inv_scale_dtype", "bf16 or fp32", "got int32"}},
      {"index_dtype", [](DecodeArgs& a) { a.index_dtype = DType::kFloat32; }, {"index_dtype", "int32 or int64", "got fp32"}},
      {"lens_dtype", [](DecodeArgs& a) { a.lens_dtype = static_cast<DType>(42); }, {"lens_dtype", "int32 or int64", "DType(42)"}},
      {"kv_cache null", [](DecodeArgs& a) { a.kv_cache = nullptr; }, {"kv_cache must be non-null", "got nullptr"}},
      {"inv_scale null", [](DecodeArgs& a) { a.inv_scale = nullptr; }, {"inv_scale must be non-null", "got nullptr"}},
      {"q null", [](DecodeArgs& a) { a.q = nullptr; }, {"q must be non-null when num_tokens > 0", "got nullptr"}},
      {"indices null", [](DecodeArgs& a) { a.indices = nullptr; }, {"indices must be non-null", "got nullptr"}},
      {"lens_rows_per_entry 0", [](DecodeArgs& a) { a.lens_rows_per_entry = 0; },
       {"lens_rows_per_entry must be in [1, 2147483647], got 0"}},
      {"lens_rows_per_entry > int32", [](DecodeArgs& a) { a.lens_rows_per_entry = int64_t{1} << 31; },
       {"lens_rows_per_entry must be in [1, 2147483647], got 2147483648"}},
      {"lens_rows_per_entry does not divide T", [](DecodeArgs& a) { a.lens_rows_per_entry = 3; },
       {"lens_rows_per_entry must divide num_tokens = 2", "got 3"}},
      {"out null", [](DecodeArgs& a) { a.out = nullptr; }, {"out must be non-null", "got nullptr"}},
      {"q misaligned", [](DecodeArgs& a) { a.q = static_cast<const char*>(a.q) + 1; }, {"q must be aligned to 2 bytes", "got address 0x"}},
      {"out misaligned", [](DecodeArgs& a) { a.out = static_cast<char*>(a.out) + 1; }, {"out must be aligned to 2 bytes"}},
      {"fp32 scale misaligned", [](DecodeArgs& a) { a.inv_scale_dtype = DType::kFloat32; a.inv_scale = static_cast<const char*>(a.inv_scale) + 2; },
       {"inv_scale must be aligned to 4 bytes (fp32)"}},
      {"int64 indices misaligned", [](DecodeArgs& a) { a.index_dtype = DType::kInt64; a.indices = static_cast<const char*>(a.indices) + 4; },
       {"indices must be aligned to 8 bytes (int64)"}},
      {"lens misaligned", [](DecodeArgs& a) { a.lens = static_cast<const char*>(a.lens) + 2; }, {"lens must be aligned to 4 bytes (int32)"}},
      {"sink misaligned", [](DecodeArgs& a) { a.attn_sink = reinterpret_cast<const float*>(reinterpret_cast<const char*>(a.attn_sink) + 1); },
       {"attn_sink must be aligned to 4 bytes"}},
      {"lse misaligned", [](DecodeArgs& a) { a.lse = reinterpret_cast<float*>(reinterpret_cast<char*>(a.lse) + 2); },
       {"lse must be aligned to 4 bytes"}},
      {"q heads overlap", [](DecodeArgs& a) { a.stride_q_head = 7; }, {"stride_q_head must be >= 8", "q does not overlap", "got 7"}},
      {"q tokens overlap", [](DecodeArgs& a) { a.stride_q_token = 31; }, {"stride_q_token must be >= 32", "got 31"}},
      {"q equal strides", [](DecodeArgs& a) { a.stride_q_token = 8; a.stride_q_head = 8; }, {"must be >= 16", "got 8"}},
      {"q negative stride", [](DecodeArgs& a) { a.stride_q_head = -8; }, {"stride_q_head must be >= 8", "got -8"}},
      {"out heads overlap", [](DecodeArgs& a) { a.stride_out_head = 4; }, {"stride_out_head must be >= 8", "out does not overlap", "got 4"}},
      {"out tokens overlap", [](DecodeArgs& a) { a.stride_out_token = 0; }, {"stride_out_token must be >= 8", "got 0"}},
      {"kv rows overlap", [](DecodeArgs& a) { a.stride_kv_token = 6; }, {"stride_kv_token must be >= 8", "kv_cache", "got 6"}},
      {"kv blocks overlap", [](DecodeArgs& a) { a.stride_kv_block = 31; }, {"stride_kv_block must be >= 32", "got 31"}},
      {"indices rows overlap", [](DecodeArgs& a) { a.stride_indices_token = 4; }, {"stride_indices_token must be >= 5", "got 4"}},
      {"lse rows overlap", [](DecodeArgs& a) { a.stride_lse_token = 3; }, {"stride_lse_token must be >= 4", "got 3"}},
      {"empty_token_lse outside the enum", [](DecodeArgs& a) { a.empty_token_lse = static_cast<EmptyTokenLse>(2); },
       {"empty_token_lse must be EmptyTokenLse::kNegativeInfinity (0) or kPositiveInfinity (1), got 2"}},
      {"stride overflow", [](DecodeArgs& a) { a.stride_q_token = std::numeric_limits<int64_t>::max(); },
       {"stride_q_token", "int64", "9223372036854775807"}},
  };
  expect_each_invalid(small_shape(), cases);
}

TEST(Validation, EveryBadExtraSourceArgumentNamesExtraFieldExpectedAndActual) {
  const std::vector<BadCase> cases = {
      {"extra.num_blocks 0", [](DecodeArgs& a) { a.extra.num_blocks = 0; },
       {"extra.num_blocks must be in [1, ", "got 0"}},
      {"extra.block_size -4", [](DecodeArgs& a) { a.extra.block_size = -4; }, {"extra.block_size", "got -4"}},
      {"extra.block_size > int32", [](DecodeArgs& a) { a.extra.block_size = int64_t{1} << 31; },
       {"extra.block_size must be in [1, 2147483647], got 2147483648"}},
      {"extra.max_entries 0", [](DecodeArgs& a) { a.extra.max_entries = 0; },
       {"extra.max_entries must be in [1, " + std::to_string(kMaxExtraEntries) + "], got 0"}},
      {"extra.max_entries > kMaxExtraEntries",
       [](DecodeArgs& a) { a.extra.max_entries = a.extra.index_cols = kMaxExtraEntries + 1; },
       {"extra.max_entries must be in [1, " + std::to_string(kMaxExtraEntries) + "], got " +
        std::to_string(kMaxExtraEntries + 1)}},
      {"extra slots overflow",
       [](DecodeArgs& a) { a.extra.num_blocks = int64_t{1} << 40; a.extra.block_size = int64_t{1} << 30; },
       {"extra.num_blocks * extra.block_size must fit in int64", "extra.num_blocks = 1099511627776",
        "extra.block_size = 1073741824"}},
      {"extra.index_cols", [](DecodeArgs& a) { a.extra.index_cols = 5; },
       {"extra.index_cols must be >= extra.max_entries = 6, got 5"}},
      {"extra.num_scales", [](DecodeArgs& a) { a.extra.num_scales = 5; },
       {"extra.num_scales must be >= extra.num_blocks * extra.block_size = 6, got 5"}},
      {"extra.inv_scale_dtype", [](DecodeArgs& a) { a.extra.inv_scale_dtype = DType::kInt32; },
       {"extra.inv_scale_dtype must be bf16 or fp32, got int32"}},
      {"extra.index_dtype", [](DecodeArgs& a) { a.extra.index_dtype = DType::kFloat32; },
       {"extra.index_dtype must be int32 or int64, got fp32"}},
      {"extra.lens_dtype", [](DecodeArgs& a) { a.extra.lens_dtype = static_cast<DType>(42); },
       {"extra.lens_dtype must be int32 or int64, got DType(42)"}},
      {"extra.inv_scale null", [](DecodeArgs& a) { a.extra.inv_scale = nullptr; },
       {"extra.inv_scale must be non-null, got nullptr"}},
      {"extra.indices null", [](DecodeArgs& a) { a.extra.indices = nullptr; },
       {"extra.indices must be non-null when num_tokens > 0, got nullptr"}},
      {"extra.lens_rows_per_entry -1", [](DecodeArgs& a) { a.extra.lens_rows_per_entry = -1; },
       {"extra.lens_rows_per_entry must be in [1, 2147483647], got -1"}},
      {"extra.lens_rows_per_entry does not divide T", [](DecodeArgs& a) { a.extra.lens_rows_per_entry = 4; },
       {"extra.lens_rows_per_entry must divide num_tokens = 2 (extra.lens holds one length per "
        "extra.lens_rows_per_entry consecutive tokens), got 4"}},
      {"extra fp32 scale misaligned",
       [](DecodeArgs& a) {
         a.extra.inv_scale_dtype = DType::kFloat32;
         a.extra.inv_scale = static_cast<const char*>(a.extra.inv_scale) + 2;
       },
       {"extra.inv_scale must be aligned to 4 bytes (fp32)", "got address 0x"}},
      {"extra bf16 scale misaligned", [](DecodeArgs& a) { a.extra.inv_scale = static_cast<const char*>(a.extra.inv_scale) + 1; },
       {"extra.inv_scale must be aligned to 2 bytes (bf16)"}},
      {"extra int64 indices misaligned",
       [](DecodeArgs& a) {
         a.extra.index_dtype = DType::kInt64;
         a.extra.indices = static_cast<const char*>(a.extra.indices) + 4;
       },
       {"extra.indices must be aligned to 8 bytes (int64)"}},
      {"extra lens misaligned", [](DecodeArgs& a) { a.extra.lens = static_cast<const char*>(a.extra.lens) + 2; },
       {"extra.lens must be aligned to 4 bytes (int32)"}},
      {"extra kv rows overlap", [](DecodeArgs& a) { a.extra.stride_kv_token = 6; },
       {"extra.stride_kv_token must be >= 8", "extra.kv_cache does not overlap itself", "got 6"}},
      {"extra kv blocks overlap", [](DecodeArgs& a) { a.extra.stride_kv_block = 23; },
       {"extra.stride_kv_block must be >= 24", "the span of head_dim x extra.stride_kv_token", "got 23"}},
      {"extra kv negative row stride", [](DecodeArgs& a) { a.extra.stride_kv_token = -8; },
       {"extra.stride_kv_token must be >= 8", "got -8"}},
      {"extra indices rows overlap", [](DecodeArgs& a) { a.extra.stride_indices_token = 6; },
       {"extra.stride_indices_token must be >= 7", "extra.indices does not overlap itself",
        "the span of extra.index_cols", "got 6"}},
      {"extra stride overflow", [](DecodeArgs& a) { a.extra.stride_kv_block = std::numeric_limits<int64_t>::max(); },
       {"extra.stride_kv_block * (size - 1) must fit in int64 for extra.kv_cache", "9223372036854775807"}},
  };
  expect_each_invalid(shape_with_extra(), cases);
}

// Both sources in the engines' 584-byte rows (KvFormat::kModel1, docs/semantics.md "Row formats"):
// D = 512, the window in blocks of 2 (stride 1,728) and the extra source in blocks of 3 (3 * 584 =
// 1,752 rounded up to 2,304), so a message naming the wrong source's value shows.
ProblemShape model1_shape() {
  ProblemShape s = small_shape();
  s.head_dim = 512;
  s.block_size = 2;
  s.kv_format = KvFormat::kModel1;
  s.extra = testing::ExtraShape{.num_blocks = 2, .block_size = 3, .max_entries = 6, .index_cols = 7,
                                .format = KvFormat::kModel1};
  return s;
}

// kModel1 keeps its scales in the cache, so inv_scale, its dtype and num_scales are not checked; the
// CPU backend runs it, and on CUDA the arguments are valid (the dispatch refuses them,
// test_select_kernel.cpp).
TEST(Validation, Model1SourcesPassWithoutInvScale) {
  HostProblem p(model1_shape(), 7);
  DecodeArgs a = p.args();
  ASSERT_EQ(a.stride_kv_block, 1728);
  ASSERT_EQ(a.extra.stride_kv_block, 2304);
  ASSERT_EQ(a.inv_scale, nullptr);
  ASSERT_EQ(a.extra.inv_scale, nullptr);
  EXPECT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  a.inv_scale_dtype = static_cast<DType>(9);
  a.extra.inv_scale_dtype = static_cast<DType>(9);
  a.num_scales = -1;
  a.extra.num_scales = -1;
  EXPECT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  EXPECT_TRUE(decode(a).ok()) << decode(a).message;
  a.extra.stride_kv_block = 2304 + 576;  // more padding, still a multiple of 576
  EXPECT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  a.backend = Backend::kCuda;
  EXPECT_TRUE(validate_args(a).ok()) << validate_args(a).message;
}

TEST(Validation, Model1RulesNameTheFieldTheExpectedAndTheActualValue) {
  const std::vector<BadCase> cases = {
      {"model1 head_dim", [](DecodeArgs& a) { a.head_dim = 8; },
       {"head_dim must be 512 when kv_format is kModel1 (448 e4m3 dims and 64 bf16 RoPE dims a row), got 8"}},
      {"model1 row stride", [](DecodeArgs& a) { a.stride_kv_token = 584; },
       {"stride_kv_token must be 576 when kv_format is kModel1 (448 e4m3 bytes and 64 bf16 values a row), got 584"}},
      {"model1 block stride short", [](DecodeArgs& a) { a.stride_kv_block = 1152; },
       {"stride_kv_block must be >= block_size * 584 = 1168 when kv_format is kModel1 (576-byte rows, then "
        "8-byte scale rows), got 1152"}},
      {"model1 block stride unpadded", [](DecodeArgs& a) { a.stride_kv_block = 1168; },
       {"stride_kv_block must be a multiple of 576 when kv_format is kModel1 (FlashMLA pads each block to a "
        "multiple of 576 bytes), got 1168"}},
      {"model1 block stride overflow", [](DecodeArgs& a) { a.stride_kv_block = int64_t{576} << 53; },
       {"stride_kv_block * (size - 1) must fit in int64 for kv_cache, got stride 5188146770730811392 with size 3"}},
      {"model1 cache alignment",
       [](DecodeArgs& a) { a.kv_cache = static_cast<const uint8_t*>(a.kv_cache) + 1; },
       {"kv_cache must be aligned to 2 bytes (the bf16 RoPE values of kModel1 rows), got address 0x"}},
      {"extra model1 row stride", [](DecodeArgs& a) { a.extra.stride_kv_token = 512; },
       {"extra.stride_kv_token must be 576 when extra.format is kModel1 (448 e4m3 bytes and 64 bf16 values a row), "
        "got 512"}},
      {"extra model1 block stride short", [](DecodeArgs& a) { a.extra.stride_kv_block = 1728; },
       {"extra.stride_kv_block must be >= extra.block_size * 584 = 1752 when extra.format is kModel1", "got 1728"}},
      {"extra model1 block stride unpadded", [](DecodeArgs& a) { a.extra.stride_kv_block = 1752; },
       {"extra.stride_kv_block must be a multiple of 576 when extra.format is kModel1 (FlashMLA pads each block to "
        "a multiple of 576 bytes), got 1752"}},
      {"extra model1 cache alignment",
       [](DecodeArgs& a) { a.extra.kv_cache = static_cast<const uint8_t*>(a.extra.kv_cache) + 3; },
       {"extra.kv_cache must be aligned to 2 bytes (the bf16 RoPE values of kModel1 rows), got address 0x"}},
      {"unknown window format", [](DecodeArgs& a) { a.kv_format = static_cast<KvFormat>(7); },
       {"kv_format must be KvFormat::kE4m3 (0) or KvFormat::kModel1 (1), got 7"}},
      {"unknown extra format", [](DecodeArgs& a) { a.extra.format = static_cast<KvFormat>(-1); },
       {"extra.format must be KvFormat::kE4m3 (0) or KvFormat::kModel1 (1), got -1"}},
  };
  expect_each_invalid(model1_shape(), cases);
}

// head_dim is the call's: a kModel1 extra source needs 512 even when the window is kE4m3 and takes
// any, and the message names the source whose format asks for it.
TEST(Validation, Model1ExtraSourceNeedsHeadDim512) {
  ProblemShape s = shape_with_extra();
  s.extra->format = KvFormat::kModel1;
  HostProblem p(s, 7);
  const Status status = validate_args(p.args());
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message,
            "head_dim must be 512 when extra.format is kModel1 (448 e4m3 dims and 64 bf16 RoPE dims a row), got 8");
}

TEST(Validation, AnExtraSourceWithoutACacheIsNoneAndNeverChecked) {
  HostProblem p(small_shape(), 11);
  p.set_len(0, 2);
  p.set_index(0, 0, 3);
  p.set_index(0, 1, 7);
  const DecodeArgs plain = p.args();
  ASSERT_EQ(plain.extra.kv_cache, nullptr);
  DecodeArgs a = plain;
  a.extra.num_blocks = -1;
  a.extra.max_entries = kMaxExtraEntries + 1;
  a.extra.inv_scale_dtype = static_cast<DType>(9);
  a.extra.stride_kv_token = -5;
  a.extra.lens = reinterpret_cast<const void*>(uintptr_t{3});
  EXPECT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  EXPECT_EQ(make_params(a).extra.kv_cache, nullptr);
  EXPECT_EQ(make_params(a).extra.num_slots, 0);
  const reference::Result with_garbage = reference::compute(a), without = reference::compute(plain);
  EXPECT_EQ(with_garbage.out, without.out);
  EXPECT_EQ(with_garbage.lse, without.lse);
}

TEST(Validation, GoodExtraSourcesPass) {
  // Its own dtypes, strides and a limit past the window's (C128A at a 1M context: 8192 entries).
  ProblemShape s = shape_with_extra();
  s.extra->max_entries = 8192;
  s.extra->index_cols = 8195;
  s.extra->index_pad = 3;
  s.extra->kv_token_pad = 72;
  s.extra->kv_block_pad = 5;
  s.extra->inv_scale_dtype = DType::kFloat32;
  s.extra->index_dtype = DType::kInt64;
  s.extra->lens_dtype = DType::kInt64;
  HostProblem p(s, 12);
  DecodeArgs a = p.args();
  EXPECT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  a.backend = Backend::kCuda;
  EXPECT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  a.extra.max_entries = a.extra.index_cols = kMaxExtraEntries;
  a.extra.stride_indices_token = kMaxExtraEntries;  // validation reads no data: the buffer size is not its concern
  EXPECT_TRUE(validate_args(a).ok()) << validate_args(a).message;

  // Both sources on the window's cache and scales.
  ProblemShape shared = shape_with_extra();
  shared.extra->shares_window_cache = true;
  HostProblem q(shared, 13);
  const DecodeArgs b = q.args();
  EXPECT_EQ(b.extra.kv_cache, b.kv_cache);
  EXPECT_EQ(b.extra.inv_scale, b.inv_scale);
  EXPECT_TRUE(validate_args(b).ok()) << validate_args(b).message;
}

TEST(Validation, ZeroTokensTakeNullExtraIdsAndLengths) {
  HostProblem p(shape_with_extra(), 14);
  DecodeArgs a = p.args();
  a.num_tokens = 0;
  a.q = a.out = nullptr;
  a.indices = a.lens = nullptr;
  a.lse = nullptr;
  a.extra.indices = a.extra.lens = nullptr;
  a.extra.stride_indices_token = 0;
  EXPECT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  EXPECT_TRUE(decode(a).ok());
  a.extra.inv_scale = nullptr;  // the cache and its scales are not per-token: still required
  const Status status = validate_args(a);
  EXPECT_NE(status.message.find("extra.inv_scale must be non-null"), std::string::npos) << status.message;
}

TEST(Validation, ExtraStridesOfSizeOneDimensionsAreIgnored) {
  ProblemShape s = shape_with_extra();
  s.num_tokens = 1;
  s.extra->num_blocks = 1;
  s.extra->block_size = 1;
  HostProblem p(s, 15);
  DecodeArgs a = p.args();
  a.extra.stride_kv_block = -7;
  a.extra.stride_kv_token = 0;
  a.extra.stride_indices_token = 2;
  EXPECT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  const DecodeParams params = make_params(a);
  EXPECT_EQ(params.extra.stride_kv_block, 0);
  EXPECT_EQ(params.extra.stride_kv_token, 0);
  EXPECT_EQ(params.extra.stride_indices_token, 0);
  EXPECT_TRUE(decode(a).ok());
}

// An engine may install a global C++ locale; the library's messages must not change with it.
TEST(Validation, MessagesIgnoreTheGlobalLocale) {
  struct ThousandsGrouping : std::numpunct<char> {
    char do_thousands_sep() const override { return ','; }
    std::string do_grouping() const override { return "\3"; }
  };
  HostProblem p(small_shape(), 9);
  DecodeArgs a = p.args();
  a.block_size = -1234567;
  const std::locale previous = std::locale::global(std::locale(std::locale::classic(), new ThousandsGrouping));
  const Status status = validate_args(a);
  std::locale::global(previous);
  EXPECT_NE(status.message.find("got -1234567"), std::string::npos) << status.message;
}

TEST(Validation, CpuBackendTakesAnyHeadCountAndHeadDim) {
  ProblemShape s = small_shape();
  s.num_heads = kMaxGpuHeads + 2;
  s.head_dim = 3;
  HostProblem p(s, 8);
  EXPECT_TRUE(validate_args(p.args()).ok()) << validate_args(p.args()).message;
  EXPECT_TRUE(decode(p.args()).ok());
}

TEST(Validation, ParamsCarryShapesDtypesAndSlots) {
  ProblemShape s = small_shape();
  s.inv_scale_dtype = DType::kFloat32;
  s.index_dtype = DType::kInt64;
  s.lens_dtype = DType::kInt64;
  HostProblem p(s, 9);
  const DecodeArgs a = p.args();
  const DecodeParams params = make_params(a);
  EXPECT_EQ(params.num_tokens, 2);
  EXPECT_EQ(params.num_heads, 4);
  EXPECT_EQ(params.head_dim, 8);
  EXPECT_EQ(params.window.block_size, 4);
  EXPECT_EQ(params.window.max_entries, 4);
  EXPECT_EQ(params.window.num_slots, 12);
  EXPECT_EQ(params.window.inv_scale_is_f32, 1);
  EXPECT_EQ(params.window.index_is_i64, 1);
  EXPECT_EQ(params.window.lens_is_i64, 1);
  EXPECT_EQ(params.stride_q_token, a.stride_q_token);
  EXPECT_EQ(params.window.stride_kv_token, a.stride_kv_token);
  EXPECT_EQ(params.window.stride_indices_token, a.stride_indices_token);
  EXPECT_EQ(params.scale, a.scale);
  EXPECT_EQ(static_cast<const void*>(params.q), a.q);
  EXPECT_EQ(static_cast<void*>(params.out), a.out);
  EXPECT_EQ(params.window.indices, a.indices);
  EXPECT_EQ(params.extra.kv_cache, nullptr);  // no extra source
}

TEST(Validation, ParamsCarryTheExtraSourceAsTheWindow) {
  ProblemShape s = shape_with_extra();
  s.extra->kv_token_pad = 4;
  s.extra->kv_block_pad = 3;
  s.extra->index_pad = 2;
  s.extra->inv_scale_dtype = DType::kFloat32;
  s.extra->lens_dtype = DType::kInt64;
  HostProblem p(s, 16);
  const DecodeArgs a = p.args();
  const DecodeParams params = make_params(a);
  const KvSourceParams& x = params.extra;
  EXPECT_EQ((std::vector<const void*>{x.kv_cache, x.inv_scale, x.indices, x.lens}),
            (std::vector<const void*>{a.extra.kv_cache, a.extra.inv_scale, a.extra.indices, a.extra.lens}));
  // Rows of 8 + 4 bytes, 3 to a block with 3 bytes after each; 7 + 2 index columns a row.
  EXPECT_EQ((std::vector<int64_t>{x.stride_kv_block, x.stride_kv_token, x.stride_indices_token}),
            (std::vector<int64_t>{3 * 12 + 3, 12, 9}));
  // num_slots, block_size, max_entries, then the dtype flags: fp32 scales, int32 ids, int64 lens.
  EXPECT_EQ((std::vector<int64_t>{x.num_slots, x.block_size, x.max_entries, x.inv_scale_is_f32, x.index_is_i64,
                                  x.lens_is_i64}),
            (std::vector<int64_t>{6, 3, 6, 1, 0, 1}));
  // The window is untouched by the extra source.
  EXPECT_EQ(params.window.num_slots, 12);
  EXPECT_EQ(params.window.max_entries, 4);
  EXPECT_EQ(params.window.inv_scale_is_f32, 0);
  EXPECT_EQ(static_cast<const void*>(params.window.kv_cache), a.kv_cache);
}

}  // namespace
}  // namespace swa_decode
