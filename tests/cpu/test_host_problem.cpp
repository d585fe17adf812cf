// testing/host_problem.h itself: it poisons what no entry names, rounds to bf16 as testing/batch.h
// does (the copy it replaced truncated), and reproduces from its seed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "src/reference/reference.h"
#include "testing/host_numerics.h"
#include "testing/host_problem.h"

namespace swa_decode::testing {
namespace {

ProblemShape strided_shape() {
  return ProblemShape{.num_tokens = 2, .num_heads = 3, .head_dim = 8, .num_blocks = 3, .block_size = 4,
                      .window_size = 4, .index_cols = 6, .q_head_pad = 2, .q_token_pad = 3, .out_head_pad = 1,
                      .out_token_pad = 2, .kv_token_pad = 5, .kv_block_pad = 7, .index_pad = 1, .lse_pad = 2};
}

uint16_t q_bits(const DecodeArgs& a, int64_t t, int64_t h, int64_t d) {
  return static_cast<const uint16_t*>(a.q)[t * a.stride_q_token + h * a.stride_q_head + d];
}

TEST(HostProblem, RoundsToNearestBf16) {
  HostProblem p(ProblemShape{}, 1);
  const float between = 1.0f + 3 * 0x1p-9f;  // 3/4 of the way from bf16 1.0 (0x3F80) to 0x3F81
  p.set_q(1, 2, 7, between);
  p.set_scale(5, between);
  const DecodeArgs a = p.args();
  EXPECT_EQ(q_bits(a, 1, 2, 7), 0x3F81);  // truncation gives 0x3F80
  EXPECT_EQ(static_cast<const uint16_t*>(a.inv_scale)[5], 0x3F81);
  EXPECT_EQ(q_bits(a, 1, 2, 7), float_to_bf16_bits(between));
}

TEST(HostProblem, Bf16AndFp32ScalesHoldTheSameValue) {
  ProblemShape shape;
  HostProblem bf16(shape, 2);
  shape.inv_scale_dtype = DType::kFloat32;
  HostProblem fp32(shape, 2);
  for (int64_t slot = 0; slot < bf16.num_slots(); ++slot) {
    bf16.fill_slot(slot);
    fp32.fill_slot(slot);
  }
  const DecodeArgs a = bf16.args(), b = fp32.args();
  for (int64_t slot = 0; slot < bf16.num_slots(); ++slot) {
    const float from_bf16 = reference::bf16_to_float(static_cast<const uint16_t*>(a.inv_scale)[slot]);
    EXPECT_EQ(static_cast<const float*>(b.inv_scale)[slot], from_bf16) << "slot " << slot;
    EXPECT_GE(from_bf16, 0.5f);
    EXPECT_LE(from_bf16, 2.0f);
  }
}

TEST(HostProblem, PoisonsEverythingNoEntryNames) {
  HostProblem p(strided_shape(), 3);
  p.set_index(0, 0, 5);
  p.set_index(1, 2, 10);
  p.set_index_raw(1, 3, 11);  // named, never filled
  const DecodeArgs a = p.args();
  const auto* cache = static_cast<const uint8_t*>(a.kv_cache);
  const int64_t cache_bytes = a.num_blocks * a.stride_kv_block;
  std::vector<bool> live_byte(cache_bytes, false);
  for (int64_t slot : {5, 10}) {
    const int64_t row = (slot / a.block_size) * a.stride_kv_block + (slot % a.block_size) * a.stride_kv_token;
    for (int64_t d = 0; d < a.head_dim; ++d) live_byte[row + d] = true;
  }
  for (int64_t b = 0; b < cache_bytes; ++b) {
    if (live_byte[b]) {
      EXPECT_NE(cache[b] & 0x7F, 0x7F) << "live byte " << b << " is NaN";
    } else {
      EXPECT_EQ(cache[b], kE4m3NaN) << "byte " << b;
    }
  }
  for (int64_t slot = 0; slot < p.num_slots(); ++slot) {
    const float scale = reference::bf16_to_float(static_cast<const uint16_t*>(a.inv_scale)[slot]);
    EXPECT_EQ(std::isnan(scale), slot != 5 && slot != 10) << "slot " << slot;
  }
  for (uint16_t bits : p.out_buffer()) EXPECT_EQ(bits, kBf16PoisonBits);
  for (float value : p.lse_buffer()) EXPECT_TRUE(std::isnan(value));

  // q: every element finite, every padding element poison.
  const int64_t q_elements = (a.num_tokens - 1) * a.stride_q_token + (a.num_heads - 1) * a.stride_q_head + a.head_dim;
  std::vector<bool> is_element(q_elements, false);
  for (int64_t t = 0; t < a.num_tokens; ++t)
    for (int64_t h = 0; h < a.num_heads; ++h)
      for (int64_t d = 0; d < a.head_dim; ++d) is_element[t * a.stride_q_token + h * a.stride_q_head + d] = true;
  const auto* q = static_cast<const uint16_t*>(a.q);
  for (int64_t e = 0; e < q_elements; ++e) {
    if (is_element[e]) {
      EXPECT_TRUE(std::isfinite(reference::bf16_to_float(q[e]))) << "q element " << e;
    } else {
      EXPECT_EQ(q[e], kBf16PoisonBits) << "q padding " << e;
    }
  }
}

TEST(HostProblem, LensPerRowsHoldOneLengthPerGroupInEachSourcesDtype) {
  ProblemShape shape{.num_tokens = 6, .lens_dtype = DType::kInt64};
  shape.extra = ExtraShape{.lens_dtype = DType::kInt32};
  HostProblem p(shape, 3);
  const std::vector<int64_t> window = {4, 4, 4, -1, -1, -1}, extra = {0, 0, 3, 3, 2, 2};
  for (int64_t t = 0; t < 6; ++t) {
    p.set_len(t, window[t]);
    p.set_len(t, extra[t], Source::kExtra);
  }
  const DecodeArgs a = p.args_with_lens_per_rows(3, 2);
  EXPECT_EQ(a.lens_rows_per_entry, 3);
  EXPECT_EQ(a.extra.lens_rows_per_entry, 2);
  EXPECT_EQ(std::vector<int64_t>(static_cast<const int64_t*>(a.lens), static_cast<const int64_t*>(a.lens) + 2),
            (std::vector<int64_t>{4, -1}));
  const auto* x = static_cast<const int32_t*>(a.extra.lens);
  EXPECT_EQ(std::vector<int32_t>(x, x + 3), (std::vector<int32_t>{0, 3, 2}));
  EXPECT_EQ(p.args().lens_rows_per_entry, 1);  // args() keeps one length per token
  EXPECT_THROW(p.args_with_lens_per_rows(3, 3), std::invalid_argument);  // tokens 2 and 0 differ
  EXPECT_THROW(p.args_with_lens_per_rows(4, 2), std::invalid_argument);  // 4 does not divide 6
}

TEST(HostProblem, ReproducesFromItsSeed) {
  HostProblem a(ProblemShape{}, 7), b(ProblemShape{}, 7), c(ProblemShape{}, 8);
  for (HostProblem* p : {&a, &b, &c}) p->fill_slot(3);
  const DecodeArgs x = a.args(), y = b.args(), z = c.args();
  bool q_differs = false;
  for (int64_t h = 0; h < 3; ++h)
    for (int64_t d = 0; d < 8; ++d) {
      EXPECT_EQ(q_bits(x, 1, h, d), q_bits(y, 1, h, d));
      q_differs = q_differs || q_bits(x, 1, h, d) != q_bits(z, 1, h, d);
    }
  EXPECT_TRUE(q_differs);
  EXPECT_EQ(std::memcmp(a.row(3), b.row(3), 8), 0);
}

}  // namespace
}  // namespace swa_decode::testing
