// The CPU reference against (a) a brute-force dense version written here, differently (long double,
// every cache row materialized, one softmax over the window plus the sink as an extra logit, the
// LSE without any max shift), on tiny random problems, and (b) cases checked by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "src/api/validate.h"
#include "src/common/window_rule.h"
#include "src/reference/reference.h"
#include "testing/host_problem.h"

namespace swa_decode {
namespace {

using testing::HostProblem;
using testing::ProblemShape;

constexpr double kInf = std::numeric_limits<double>::infinity();

// e4m3 from the bit layout by building the binary32 with the same sign, exponent and mantissa
// (normals) or by scaling the integer mantissa (subnormals: m * 2^-9).
float e4m3_via_binary32(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  const uint32_t exponent = (code >> 3) & 0xF;
  const uint32_t mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-9f;
    return sign ? -magnitude : magnitude;
  }
  const uint32_t word = sign | ((exponent - 7 + 127) << 23) | (mantissa << 20);
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

float bf16_value(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

struct Dense {
  std::vector<long double> out;  // [T, H, D]
  std::vector<long double> lse;  // [T, H]
};

Dense dense_decode(const DecodeArgs& a) {
  const int64_t T = a.num_tokens, H = a.num_heads, D = a.head_dim, W = a.window_size;
  const int64_t S = a.num_blocks * a.block_size;
  // Every cache row, poisoned or not, dequantized up front.
  std::vector<long double> k_all(S * D);
  for (int64_t slot = 0; slot < S; ++slot) {
    const auto* row = static_cast<const uint8_t*>(a.kv_cache) + (slot / a.block_size) * a.stride_kv_block +
                      (slot % a.block_size) * a.stride_kv_token;
    const long double inv_scale =
        a.inv_scale_dtype == DType::kFloat32 ? static_cast<const float*>(a.inv_scale)[slot]
                                             : bf16_value(static_cast<const uint16_t*>(a.inv_scale)[slot]);
    for (int64_t d = 0; d < D; ++d) k_all[slot * D + d] = e4m3_via_binary32(row[d]) * inv_scale;
  }
  auto index_at = [&](int64_t t, int64_t c) -> int64_t {
    const int64_t e = t * a.stride_indices_token + c;
    return a.index_dtype == DType::kInt64 ? static_cast<const int64_t*>(a.indices)[e]
                                          : static_cast<const int32_t*>(a.indices)[e];
  };
  auto len_at = [&](int64_t t) -> int64_t {
    return a.lens_dtype == DType::kInt64 ? static_cast<const int64_t*>(a.lens)[t]
                                         : static_cast<const int32_t*>(a.lens)[t];
  };

  Dense r;
  r.out.assign(T * H * D, 0.0L);
  r.lse.assign(T * H, -std::numeric_limits<long double>::infinity());
  for (int64_t t = 0; t < T; ++t) {
    // The window rule re-derived from docs/semantics.md on purpose (not src/common/window_rule.h):
    // this is the reference's independent oracle.
    std::vector<bool> valid(W);
    bool any = false;
    for (int64_t c = 0; c < W; ++c) {
      const int64_t id = index_at(t, c);
      valid[c] = c < len_at(t) && id >= 0 && id < S;
      any = any || valid[c];
    }
    if (!any) continue;
    for (int64_t h = 0; h < H; ++h) {
      // logits[0..W) are the window columns (-inf where no entry), logits[W] the sink.
      std::vector<long double> logits(W + 1, -std::numeric_limits<long double>::infinity());
      long double sum_exp = 0.0L;
      for (int64_t c = 0; c < W; ++c) {
        if (!valid[c]) continue;
        long double dot = 0.0L;
        for (int64_t d = 0; d < D; ++d) {
          const long double q = bf16_value(static_cast<const uint16_t*>(a.q)[t * a.stride_q_token + h * a.stride_q_head + d]);
          dot += q * k_all[index_at(t, c) * D + d];
        }
        logits[c] = static_cast<long double>(a.scale) * dot;
        sum_exp += std::exp(logits[c]);
      }
      r.lse[t * H + h] = std::log(sum_exp);
      if (a.attn_sink != nullptr) logits[W] = a.attn_sink[h];

      std::vector<long double> p(W + 1, 0.0L);
      if (logits[W] == std::numeric_limits<long double>::infinity()) {
        p[W] = 1.0L;
      } else {
        const long double m = *std::max_element(logits.begin(), logits.end());
        long double z = 0.0L;
        for (int64_t c = 0; c <= W; ++c) z += std::exp(logits[c] - m);
        for (int64_t c = 0; c <= W; ++c) p[c] = std::exp(logits[c] - m) / z;
      }
      for (int64_t c = 0; c < W; ++c) {
        if (!valid[c]) continue;
        for (int64_t d = 0; d < D; ++d) r.out[(t * H + h) * D + d] += p[c] * k_all[index_at(t, c) * D + d];
      }
    }
  }
  return r;
}

void expect_matches_dense(const DecodeArgs& a, const char* label) {
  ASSERT_TRUE(validate_args(a).ok()) << label << ": " << validate_args(a).message;
  const reference::Result ref = reference::compute(a);
  const Dense dense = dense_decode(a);
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    for (int64_t h = 0; h < a.num_heads; ++h) {
      const double lse = ref.lse_at(t, h);
      const long double want_lse = dense.lse[t * a.num_heads + h];
      if (std::isinf(want_lse)) {
        EXPECT_EQ(lse, -kInf) << label << " t=" << t << " h=" << h;
      } else {
        EXPECT_NEAR(lse, static_cast<double>(want_lse), 1e-12 * (1 + std::fabs(lse))) << label << " t=" << t << " h=" << h;
      }
      for (int64_t d = 0; d < a.head_dim; ++d) {
        const double got = ref.out_at(t, h, d);
        const double want = static_cast<double>(dense.out[(t * a.num_heads + h) * a.head_dim + d]);
        ASSERT_FALSE(std::isnan(got)) << label << " t=" << t << " h=" << h << " d=" << d;
        EXPECT_NEAR(got, want, 1e-12 * (1 + std::fabs(want))) << label << " t=" << t << " h=" << h << " d=" << d;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Number formats

TEST(ReferenceE4m3, AllCodesMatchTheFormatDefinition) {
  int nan_count = 0;
  for (int code = 0; code < 256; ++code) {
    const double got = reference::decode_e4m3(static_cast<uint8_t>(code));
    const float want = e4m3_via_binary32(static_cast<uint8_t>(code));
    if (std::isnan(want)) {
      ++nan_count;
      EXPECT_TRUE(std::isnan(got)) << "code " << code;
      continue;
    }
    EXPECT_FALSE(std::isinf(got)) << "code " << code;
    EXPECT_EQ(got, static_cast<double>(want)) << "code " << code;
    EXPECT_EQ(std::signbit(got), (code & 0x80) != 0) << "code " << code;
  }
  EXPECT_EQ(nan_count, 2);  // 0x7F and 0xFF only
}

TEST(ReferenceE4m3, HandCheckedCodes) {
  EXPECT_EQ(reference::decode_e4m3(0x00), 0.0);
  EXPECT_TRUE(std::signbit(reference::decode_e4m3(0x80)));
  EXPECT_EQ(reference::decode_e4m3(0x01), 0x1p-9);          // smallest subnormal: 1/8 * 2^-6
  EXPECT_EQ(reference::decode_e4m3(0x07), 7 * 0x1p-9);      // largest subnormal
  EXPECT_EQ(reference::decode_e4m3(0x08), 0x1p-6);          // smallest normal
  EXPECT_EQ(reference::decode_e4m3(0x38), 1.0);             // e = 7, m = 0
  EXPECT_EQ(reference::decode_e4m3(0x3C), 1.5);
  EXPECT_EQ(reference::decode_e4m3(0x40), 2.0);
  EXPECT_EQ(reference::decode_e4m3(0xC0), -2.0);
  EXPECT_EQ(reference::decode_e4m3(0x77), 240.0);           // e = 14, m = 7
  EXPECT_EQ(reference::decode_e4m3(0x78), 256.0);           // e = 15 is finite in e4m3fn
  EXPECT_EQ(reference::decode_e4m3(0x7E), 448.0);           // largest finite
  EXPECT_EQ(reference::decode_e4m3(0xFE), -448.0);
  EXPECT_TRUE(std::isnan(reference::decode_e4m3(0x7F)));
  EXPECT_TRUE(std::isnan(reference::decode_e4m3(0xFF)));
  for (int code = 1; code <= 0x7E; ++code) {  // positive codes increase strictly
    EXPECT_LT(reference::decode_e4m3(static_cast<uint8_t>(code - 1)), reference::decode_e4m3(static_cast<uint8_t>(code)));
  }
}

TEST(ReferenceBf16, RoundTripsEveryNonNanPattern) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const float value = reference::bf16_to_float(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    EXPECT_EQ(reference::float_to_bf16(value), bits) << "bits " << bits;
  }
  EXPECT_EQ(reference::bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(reference::bf16_to_float(0xC040), -3.0f);
}

TEST(ReferenceBf16, RoundsOnceToNearestEven) {
  EXPECT_EQ(reference::double_to_bf16(1.0), 0x3F80);
  EXPECT_EQ(reference::double_to_bf16(1.0 + 0x1p-8), 0x3F80);            // tie -> even (down)
  EXPECT_EQ(reference::double_to_bf16(1.0 + 3 * 0x1p-8), 0x3F82);        // tie -> even (up)
  EXPECT_EQ(reference::double_to_bf16(1.0 + 0x1p-8 + 0x1p-40), 0x3F81);  // above the tie: a double
                                                                          // rounding via float gives 0x3F80
  EXPECT_EQ(reference::double_to_bf16(-1.0 - 0x1p-8 - 0x1p-40), 0xBF81);
  EXPECT_EQ(reference::double_to_bf16(0x1p-133), 0x0001);                 // smallest subnormal
  EXPECT_EQ(reference::double_to_bf16(0x1p-134), 0x0000);                 // tie -> even (zero)
  EXPECT_EQ(reference::double_to_bf16(1.5 * 0x1p-134), 0x0001);
  EXPECT_EQ(reference::double_to_bf16(0x1.fep127), 0x7F7F);               // largest finite (exact)
  EXPECT_EQ(reference::double_to_bf16(3.4e38), 0x7F80);                   // rounds past the max
  EXPECT_EQ(reference::double_to_bf16(-kInf), 0xFF80);
  EXPECT_EQ(reference::double_to_bf16(-0.0), 0x8000);
  EXPECT_EQ(reference::double_to_bf16(std::nan("")) & 0x7FC0, 0x7FC0);
}

// ---------------------------------------------------------------------------------------------
// Against the dense version

TEST(ReferenceVsDense, RandomTinyProblems) {
  int cases = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const int64_t window = std::vector<int64_t>{1, 5, 8}[(seed / 9) % 3];
    const ProblemShape shape{
        .num_tokens = 6,
        .num_heads = std::vector<int64_t>{1, 3, 8}[seed % 3],
        .head_dim = std::vector<int64_t>{4, 16, 64}[(seed / 3) % 3],
        .num_blocks = 4,
        .block_size = 3,
        .window_size = window,
        .index_cols = window + static_cast<int64_t>(seed % 2) * 3,
        .inv_scale_dtype = seed % 2 ? DType::kFloat32 : DType::kBFloat16,
        .index_dtype = seed % 4 < 2 ? DType::kInt64 : DType::kInt32,
        .lens_dtype = seed % 5 < 2 ? DType::kInt64 : DType::kInt32,
    };
    HostProblem p(shape, seed);
    const int64_t W = shape.window_size, S = p.num_slots();
    // Slot S - 1 is never filled: it stays poisoned and fills the columns that must not be read.
    auto slot = [&] { return p.rng().uniform_int(0, S - 2); };
    const std::vector<int64_t> lens = {0, -1, 1, W - 1, W, W + 1};
    for (int64_t t = 0; t < shape.num_tokens; ++t) {
      p.set_len(t, lens[t]);
      const int32_t L = columns_in_window(lens[t], static_cast<int32_t>(W));
      int64_t previous = slot();
      for (int32_t c = 0; c < L; ++c) {
        const int64_t r = p.rng().uniform_int(0, 7);
        // Mostly real slots; some holes, out-of-range ids and repeats of the previous slot.
        if (r == 0) {
          p.set_index_raw(t, c, -1);
        } else if (r == 1) {
          p.set_index_raw(t, c, S + 7);
        } else {
          previous = r == 2 ? previous : slot();
          p.set_index(t, c, previous);
        }
      }
      for (int64_t c = L; c < shape.index_cols; ++c) p.set_index_raw(t, c, S - 1);
    }
    std::vector<float> sink(shape.num_heads);
    for (int64_t h = 0; h < shape.num_heads; ++h) {
      const float choices[] = {-std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity(),
                               0.0f, 1.5f, -2.0f};
      sink[h] = choices[(seed + h) % 5];
    }
    if (seed % 3 != 0) p.set_sink(sink);
    expect_matches_dense(p.args(), ("seed " + std::to_string(seed)).c_str());
    ++cases;
  }
  EXPECT_EQ(cases, 40);
}

TEST(ReferenceVsDense, StridedLayoutsGiveTheSameResultAsContiguous) {
  const ProblemShape contiguous{.num_tokens = 3, .num_heads = 4, .head_dim = 16, .window_size = 4, .index_cols = 4};
  ProblemShape strided = contiguous;
  strided.index_cols = 6;
  strided.q_head_pad = 8;
  strided.q_token_pad = 3;
  strided.out_head_pad = 5;
  strided.out_token_pad = 7;
  strided.kv_token_pad = 9;  // like a 584-byte row for D = 512
  strided.kv_block_pad = 13;
  strided.index_pad = 2;
  strided.lse_pad = 3;
  ProblemShape head_major = strided;
  head_major.head_major_q = true;

  auto build = [](const ProblemShape& shape) {
    HostProblem p(shape, 99);  // same seed: same q values, same slot rows in the same order
    for (int64_t t = 0; t < shape.num_tokens; ++t) {
      p.set_len(t, 3 + t % 2);
      for (int64_t c = 0; c < 4; ++c) p.set_index(t, c, (5 * t + 3 * c) % p.num_slots());
    }
    return p;
  };
  HostProblem a = build(contiguous), b = build(strided), c = build(head_major);
  // q values: copy element-wise, since the fill order follows the layout.
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t d = 0; d < 16; ++d) {
        const float v = static_cast<float>((t * 7 + h * 3 + d) % 11) / 4.0f - 1.0f;
        a.set_q(t, h, d, v);
        b.set_q(t, h, d, v);
        c.set_q(t, h, d, v);
      }
  const reference::Result ra = reference::compute(a.args());
  expect_matches_dense(b.args(), "strided");
  expect_matches_dense(c.args(), "head-major q");
  for (HostProblem* other : {&b, &c}) {
    const reference::Result r = reference::compute(other->args());
    EXPECT_EQ(r.out, ra.out);
    EXPECT_EQ(r.lse, ra.lse);
  }
}

// ---------------------------------------------------------------------------------------------
// Hand-checked cases

ProblemShape one_token(int64_t heads = 2, int64_t dim = 4, int64_t window = 4) {
  return ProblemShape{.num_tokens = 1, .num_heads = heads, .head_dim = dim, .window_size = window, .index_cols = window};
}

TEST(ReferenceCases, OneEntryWindowGivesTheRow) {
  HostProblem p(one_token(3, 8), 5);
  p.set_len(0, 1);
  p.set_index(0, 0, 7);
  p.set_sink({-std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
              -std::numeric_limits<float>::infinity()});
  const DecodeArgs a = p.args();
  const reference::Result r = reference::compute(a);
  const double inv_scale = bf16_value(static_cast<const uint16_t*>(a.inv_scale)[7]);
  for (int64_t h = 0; h < 3; ++h) {
    double dot = 0.0;
    for (int64_t d = 0; d < 8; ++d) {
      const double k = reference::decode_e4m3(p.row(7)[d]) * inv_scale;
      EXPECT_DOUBLE_EQ(r.out_at(0, h, d), k);
      dot += bf16_value(static_cast<const uint16_t*>(a.q)[h * a.stride_q_head + d]) * k;
    }
    EXPECT_NEAR(r.lse_at(0, h), a.scale * dot, 1e-12);  // lse of one score is the score
  }
}

TEST(ReferenceCases, TwoEntriesAndAFiniteSinkByHand) {
  HostProblem p(one_token(1, 4), 1);
  p.set_row(2, {0x38}, 1.0f);  // k = [1, 1, 1, 1]
  p.set_row(9, {0x40}, 1.0f);  // k = [2, 2, 2, 2]
  p.set_len(0, 2);
  p.set_index(0, 0, 2);
  p.set_index(0, 1, 9);
  for (int64_t d = 0; d < 4; ++d) p.set_q(0, 0, d, d == 0 ? 0.5f : 0.0f);  // scale 1: s1 = 0.5, s2 = 1
  const float sink = 0.25f;
  p.set_sink({sink});
  DecodeArgs a = p.args();
  a.scale = 1.0f;
  const reference::Result r = reference::compute(a);
  const double e1 = std::exp(0.5), e2 = std::exp(1.0), ez = std::exp(0.25);
  for (int64_t d = 0; d < 4; ++d) EXPECT_NEAR(r.out_at(0, 0, d), (e1 * 1 + e2 * 2) / (e1 + e2 + ez), 1e-14);
  EXPECT_NEAR(r.lse_at(0, 0), std::log(e1 + e2), 1e-14);  // the sink is not in the LSE
}

TEST(ReferenceCases, EmptyTokensGiveZeroAndMinusInfWhateverTheSink) {
  ProblemShape s = one_token(2, 4, 3);
  s.num_tokens = 5;
  s.lens_dtype = DType::kInt64;
  s.index_dtype = DType::kInt64;
  HostProblem p(s, 3);
  const int64_t S = p.num_slots();
  p.set_len(0, 0);
  p.set_index_raw(0, 0, 1);  // a poisoned slot behind a length of 0
  p.set_len(1, -1);          // graph padding: counts as 0, never as UINT_MAX
  p.set_index_raw(1, 0, 2);
  p.set_len(2, 3);           // all holes
  p.set_len(3, 3);           // all out of range
  p.set_index_raw(3, 0, S);
  p.set_index_raw(3, 1, -7);
  p.set_index_raw(3, 2, std::numeric_limits<int64_t>::max());
  p.set_len(4, std::numeric_limits<int64_t>::min());
  for (const std::vector<float>& sink : {std::vector<float>{}, std::vector<float>{0.5f, 3.0f},
                                         std::vector<float>{std::numeric_limits<float>::infinity(),
                                                            -std::numeric_limits<float>::infinity()}}) {
    p.set_sink(sink);
    const reference::Result r = reference::compute(p.args());
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t h = 0; h < 2; ++h) {
        EXPECT_EQ(r.lse_at(t, h), -kInf) << "t=" << t;
        for (int64_t d = 0; d < 4; ++d) {
          EXPECT_EQ(r.out_at(t, h, d), 0.0) << "t=" << t;
          EXPECT_FALSE(std::signbit(r.out_at(t, h, d)));
        }
      }
  }
}

TEST(ReferenceCases, SinkPlusInfZeroesOutAndMinusInfIsNoSink) {
  HostProblem p(one_token(2, 8), 11);
  p.set_len(0, 3);
  for (int64_t c = 0; c < 3; ++c) p.set_index(0, c, 4 + c);
  const reference::Result none = reference::compute(p.args());
  p.set_sink({-std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()});
  const reference::Result minus_inf = reference::compute(p.args());
  EXPECT_EQ(minus_inf.out, none.out);
  EXPECT_EQ(minus_inf.lse, none.lse);
  p.set_sink({std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()});
  const reference::Result plus_inf = reference::compute(p.args());
  for (int64_t d = 0; d < 8; ++d) {
    EXPECT_EQ(plus_inf.out_at(0, 0, d), 0.0);
    EXPECT_EQ(plus_inf.out_at(0, 1, d), none.out_at(0, 1, d));  // the other head has no sink
  }
  EXPECT_EQ(plus_inf.lse, none.lse);  // the LSE never includes the sink
  EXPECT_TRUE(std::isfinite(plus_inf.lse_at(0, 0)));
}

TEST(ReferenceCases, DuplicatesCountAsManyTimesAsTheyAppear) {
  HostProblem p(one_token(2, 4, 5), 13);
  p.set_len(0, 5);
  for (int64_t c = 0; c < 3; ++c) p.set_index(0, c, 6);  // slot 6 three times
  p.set_index(0, 3, 1);
  p.set_index(0, 4, 6);  // and a fourth time after another slot
  const DecodeArgs a = p.args();
  const reference::Result r = reference::compute(a);
  const double scale6 = bf16_value(static_cast<const uint16_t*>(a.inv_scale)[6]);
  const double scale1 = bf16_value(static_cast<const uint16_t*>(a.inv_scale)[1]);
  for (int64_t h = 0; h < 2; ++h) {
    double s6 = 0.0, s1 = 0.0;
    for (int64_t d = 0; d < 4; ++d) {
      const double q = bf16_value(static_cast<const uint16_t*>(a.q)[h * a.stride_q_head + d]);
      s6 += q * reference::decode_e4m3(p.row(6)[d]) * scale6;
      s1 += q * reference::decode_e4m3(p.row(1)[d]) * scale1;
    }
    s6 *= a.scale;
    s1 *= a.scale;
    const double w6 = 4 * std::exp(s6), w1 = std::exp(s1);
    EXPECT_NEAR(r.lse_at(0, h), std::log(w6 + w1), 1e-12);
    for (int64_t d = 0; d < 4; ++d) {
      const double want = (w6 * reference::decode_e4m3(p.row(6)[d]) * scale6 +
                           w1 * reference::decode_e4m3(p.row(1)[d]) * scale1) / (w6 + w1);
      EXPECT_NEAR(r.out_at(0, h, d), want, 1e-12);
    }
  }
  expect_matches_dense(a, "duplicates");
}

TEST(ReferenceCases, OnlyTheFirstMinLenWindowColumnsAreRead) {
  ProblemShape s = one_token(1, 4, 3);
  s.index_cols = 6;
  s.num_tokens = 2;
  HostProblem p(s, 17);
  p.set_len(0, 2);  // column 2 holds a poisoned slot: must not be read
  p.set_index(0, 0, 0);
  p.set_index(0, 1, 1);
  p.set_index_raw(0, 2, 5);
  p.set_len(1, 100);  // longer than the window: columns 3..5 hold poisoned slots
  for (int64_t c = 0; c < 3; ++c) p.set_index(1, c, 2 + c);
  for (int64_t c = 3; c < 6; ++c) p.set_index_raw(1, c, 8 + c);
  const reference::Result r = reference::compute(p.args());
  for (double v : r.out) EXPECT_FALSE(std::isnan(v));
  for (double v : r.lse) EXPECT_TRUE(std::isfinite(v));
  expect_matches_dense(p.args(), "window columns");
}

TEST(ReferenceCases, IndexAndScaleDtypesAgree) {
  std::vector<reference::Result> results;
  for (int variant = 0; variant < 4; ++variant) {
    ProblemShape s = one_token(2, 8, 4);
    s.num_tokens = 2;
    s.index_dtype = variant & 1 ? DType::kInt64 : DType::kInt32;
    s.lens_dtype = variant & 2 ? DType::kInt64 : DType::kInt32;
    s.inv_scale_dtype = variant & 1 ? DType::kFloat32 : DType::kBFloat16;
    HostProblem p(s, 23);
    for (int64_t t = 0; t < 2; ++t) {
      p.set_len(t, 4 - t);
      for (int64_t c = 0; c < 4; ++c) p.set_index(t, c, (3 * c + t) % p.num_slots());
    }
    results.push_back(reference::compute(p.args()));
  }
  for (int variant = 1; variant < 4; ++variant) {
    EXPECT_EQ(results[variant].out, results[0].out) << variant;
    EXPECT_EQ(results[variant].lse, results[0].lse) << variant;
  }
}

TEST(ReferenceRun, DecodeOnCpuWritesRoundedOutputsAndLeavesGapsAlone) {
  ProblemShape s = one_token(3, 16, 4);
  s.num_tokens = 3;
  s.out_head_pad = 4;
  s.out_token_pad = 6;
  s.lse_pad = 2;
  HostProblem p(s, 29);
  p.set_len(0, 4);
  p.set_len(1, 0);
  p.set_len(2, 2);
  for (int64_t c = 0; c < 4; ++c) p.set_index(0, c, c + 3);
  p.set_index(2, 0, 1);
  p.set_index(2, 1, 11);
  const DecodeArgs a = p.args();
  const reference::Result r = reference::compute(a);
  ASSERT_TRUE(decode(a).ok()) << decode(a).message;

  std::vector<bool> written(p.out_buffer().size(), false);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t h = 0; h < 3; ++h) {
      EXPECT_EQ(p.lse(t, h), static_cast<float>(r.lse_at(t, h)));
      for (int64_t d = 0; d < 16; ++d) {
        EXPECT_EQ(p.out_bits(t, h, d), reference::double_to_bf16(r.out_at(t, h, d)));
        written[t * a.stride_out_token + h * a.stride_out_head + d] = true;
      }
    }
  EXPECT_EQ(p.lse(1, 0), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(p.out_bits(1, 2, 15), 0x0000);
  for (size_t i = 0; i < written.size(); ++i) {
    if (!written[i]) {
      EXPECT_EQ(p.out_buffer()[i], testing::kBf16PoisonBits) << "gap element " << i << " written";
    }
  }
}

TEST(ReferenceRun, NullLseIsNotWritten) {
  HostProblem p(one_token(), 31);
  p.set_len(0, 1);
  p.set_index(0, 0, 0);
  DecodeArgs a = p.args();
  a.lse = nullptr;
  ASSERT_TRUE(decode(a).ok());
  for (float v : p.lse_buffer()) EXPECT_TRUE(std::isnan(v));
  EXPECT_NE(p.out_bits(0, 0, 0), testing::kBf16PoisonBits);
}

}  // namespace
}  // namespace swa_decode
