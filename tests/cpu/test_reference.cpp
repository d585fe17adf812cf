// The CPU reference against (a) a brute-force dense version written here, differently (long double,
// every cache row materialized, one softmax over the window plus the sink as an extra logit, the
// LSE without any max shift), on tiny random problems, and (b) cases checked by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/api/validate.h"
#include "src/common/window_rule.h"
#include "src/reference/reference.h"
#include "testing/host_problem.h"

namespace swa_decode {
namespace {

using testing::HostProblem;
using testing::ProblemShape;
using testing::Source;

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

// UE8M0 (kModel1's scales, "Row formats": 2^(code - 127)) as the binary32 whose exponent field is
// the code itself; code 0 is the binary32 subnormal 2^-127 (mantissa bit 22); 0xFF is NaN (OCP).
float ue8m0_via_binary32(uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  const uint32_t word = code == 0 ? 0x00400000u : static_cast<uint32_t>(code) << 23;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

// One kModel1 row decoded from the spec's text alone, literal numbers and all: a block of B rows of
// 576 bytes, then B scale rows of 8 bytes; slot (block b, offset o) has its row at b * stride + o * 576
// and its scales at b * stride + B * 576 + o * 8; dims 0..447 are e4m3 times the scale of their
// 64-dim group, 448..511 the bf16 values that follow (host order: little-endian, as the GPU's).
void dense_model1_row(const uint8_t* cache, int64_t stride_kv_block, int64_t block_size, int64_t slot,
                      long double* k) {
  const uint8_t* block = cache + (slot / block_size) * stride_kv_block;
  const uint8_t* row = block + (slot % block_size) * 576;
  const uint8_t* scales = block + block_size * 576 + (slot % block_size) * 8;
  for (int64_t d = 0; d < 448; ++d) {
    k[d] = static_cast<long double>(e4m3_via_binary32(row[d])) * ue8m0_via_binary32(scales[d / 64]);
  }
  for (int64_t i = 0; i < 64; ++i) {
    uint16_t bits;
    std::memcpy(&bits, row + 448 + 2 * i, sizeof(bits));
    k[448 + i] = bf16_value(bits);
  }
}

struct Dense {
  std::vector<long double> out;  // [T, H, D]
  std::vector<long double> lse;  // [T, H]
};

// One source as the dense version sees it: every row of its pool dequantized up front (kE4m3 or
// kModel1), poisoned or not, and per token the row each of its first max_entries columns names (nullptr: no entry).
struct DenseSource {
  int64_t max_entries = 0;
  std::vector<long double> k_all;         // [S, D]
  std::vector<const long double*> named;  // [T, max_entries]
};

// DecodeArgs names its window fields as KvSource names the extra source's, so this reads either.
template <class Source>
DenseSource dense_source(const Source& s, int64_t max_entries, KvFormat format, int64_t T, int64_t D) {
  const int64_t S = s.num_blocks * s.block_size;
  DenseSource r{.max_entries = max_entries, .k_all = std::vector<long double>(S * D), .named = {}};
  for (int64_t slot = 0; slot < S; ++slot) {
    if (format == KvFormat::kModel1) {
      dense_model1_row(static_cast<const uint8_t*>(s.kv_cache), s.stride_kv_block, s.block_size, slot,
                       &r.k_all[slot * D]);
      continue;
    }
    const auto* row = static_cast<const uint8_t*>(s.kv_cache) + (slot / s.block_size) * s.stride_kv_block +
                      (slot % s.block_size) * s.stride_kv_token;
    const long double inv_scale =
        s.inv_scale_dtype == DType::kFloat32 ? static_cast<const float*>(s.inv_scale)[slot]
                                             : bf16_value(static_cast<const uint16_t*>(s.inv_scale)[slot]);
    for (int64_t d = 0; d < D; ++d) r.k_all[slot * D + d] = e4m3_via_binary32(row[d]) * inv_scale;
  }
  // The window rule re-derived from docs/semantics.md on purpose (not src/common/window_rule.h):
  // this is the reference's independent oracle. Tokens [e * n, (e + 1) * n) share lens entry e; no
  // lens is a length of every index column.
  r.named.assign(T * max_entries, nullptr);
  for (int64_t t = 0; t < T; ++t) {
    int64_t len = s.index_cols;
    if (s.lens != nullptr) {
      const int64_t e = t / s.lens_rows_per_entry;
      len = s.lens_dtype == DType::kInt64 ? static_cast<const int64_t*>(s.lens)[e]
                                          : static_cast<const int32_t*>(s.lens)[e];
    }
    for (int64_t c = 0; c < max_entries; ++c) {
      const int64_t e = t * s.stride_indices_token + c;
      const int64_t id = s.index_dtype == DType::kInt64 ? static_cast<const int64_t*>(s.indices)[e]
                                                        : static_cast<const int32_t*>(s.indices)[e];
      if (c < len && id >= 0 && id < S) r.named[t * max_entries + c] = &r.k_all[id * D];
    }
  }
  return r;
}

Dense dense_decode(const DecodeArgs& a) {
  const int64_t T = a.num_tokens, H = a.num_heads, D = a.head_dim;
  std::vector<DenseSource> sources;
  sources.push_back(dense_source(a, a.window_size, a.kv_format, T, D));
  if (a.extra.kv_cache != nullptr) {
    sources.push_back(dense_source(a.extra, a.extra.max_entries, a.extra.format, T, D));
  }

  Dense r;
  r.out.assign(T * H * D, 0.0L);
  r.lse.assign(T * H, -std::numeric_limits<long double>::infinity());
  for (int64_t t = 0; t < T; ++t) {
    // Every column of every source, the window's first, each the row it names or nullptr.
    std::vector<const long double*> k;
    for (const DenseSource& source : sources) {
      k.insert(k.end(), source.named.begin() + t * source.max_entries,
               source.named.begin() + (t + 1) * source.max_entries);
    }
    const int64_t C = static_cast<int64_t>(k.size());
    if (std::count(k.begin(), k.end(), nullptr) == C) continue;
    for (int64_t h = 0; h < H; ++h) {
      // logits[0..C) are the columns (-inf where no entry), logits[C] the sink.
      std::vector<long double> logits(C + 1, -std::numeric_limits<long double>::infinity());
      long double sum_exp = 0.0L;
      for (int64_t c = 0; c < C; ++c) {
        if (k[c] == nullptr) continue;
        long double dot = 0.0L;
        for (int64_t d = 0; d < D; ++d) {
          const long double q = bf16_value(static_cast<const uint16_t*>(a.q)[t * a.stride_q_token + h * a.stride_q_head + d]);
          dot += q * k[c][d];
        }
        logits[c] = static_cast<long double>(a.scale) * dot;
        sum_exp += std::exp(logits[c]);
      }
      r.lse[t * H + h] = std::log(sum_exp);
      if (a.attn_sink != nullptr) logits[C] = a.attn_sink[h];

      std::vector<long double> p(C + 1, 0.0L);
      if (logits[C] == std::numeric_limits<long double>::infinity()) {
        p[C] = 1.0L;
      } else {
        const long double m = *std::max_element(logits.begin(), logits.end());
        long double z = 0.0L;
        for (int64_t c = 0; c <= C; ++c) z += std::exp(logits[c] - m);
        for (int64_t c = 0; c <= C; ++c) p[c] = std::exp(logits[c] - m) / z;
      }
      for (int64_t c = 0; c < C; ++c) {
        if (k[c] == nullptr) continue;
        for (int64_t d = 0; d < D; ++d) r.out[(t * H + h) * D + d] += p[c] * k[c][d];
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

// How one source's columns are drawn for a random problem.
struct ColumnDraw {
  Source source;
  int64_t max_entries;    // the source's limit: window_size or extra.max_entries
  int64_t index_cols;
  int64_t real_slots;     // real entries name slots in [0, real_slots)
  int64_t poisoned_slot;  // a slot below the source's range, never filled: fills the columns that must not be read
  int64_t past_id;        // an id past the source's slot range
};

// Sets token t's length and columns in one source: in the first min(len, limit) columns mostly
// real slots, some holes (-1), some ids past the slot range and repeats of the previous slot.
void draw_columns(HostProblem& p, const ColumnDraw& draw, int64_t t, int64_t len) {
  auto slot = [&] { return p.rng().uniform_int(0, draw.real_slots - 1); };
  p.set_len(t, len, draw.source);
  const int32_t L = columns_in_window(len, static_cast<int32_t>(draw.max_entries));
  int64_t previous = slot();
  for (int32_t c = 0; c < L; ++c) {
    const int64_t r = p.rng().uniform_int(0, 7);
    if (r == 0) {
      p.set_index_raw(t, c, -1, draw.source);
    } else if (r == 1) {
      p.set_index_raw(t, c, draw.past_id, draw.source);
    } else {
      previous = r == 2 ? previous : slot();
      p.set_index(t, c, previous, draw.source);
    }
  }
  for (int64_t c = L; c < draw.index_cols; ++c) p.set_index_raw(t, c, draw.poisoned_slot, draw.source);
}

// Sinks of -inf, +inf and finite values on the heads, on two seeds in three.
void maybe_set_sinks(HostProblem& p, uint64_t seed) {
  std::vector<float> sink(p.shape().num_heads);
  for (size_t h = 0; h < sink.size(); ++h) {
    const float choices[] = {-std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity(),
                             0.0f, 1.5f, -2.0f};
    sink[h] = choices[(seed + h) % 5];
  }
  if (seed % 3 != 0) p.set_sink(sink);
}

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
    const ColumnDraw columns{.source = Source::kWindow, .max_entries = W, .index_cols = shape.index_cols,
                             .real_slots = S - 1, .poisoned_slot = S - 1, .past_id = S + 7};
    const std::vector<int64_t> lens = {0, -1, 1, W - 1, W, W + 1};
    for (int64_t t = 0; t < shape.num_tokens; ++t) draw_columns(p, columns, t, lens[t]);
    maybe_set_sinks(p, seed);
    expect_matches_dense(p.args(), ("seed " + std::to_string(seed)).c_str());
    ++cases;
  }
  EXPECT_EQ(cases, 40);
}

TEST(ReferenceVsDense, RandomTinyProblemsWithAnExtraSource) {
  // The extra source is described with one block fewer than its pool holds, so its "past the slot
  // range" ids name real memory: poisoned rows of its own pool, or, when it shares the window's
  // cache, window rows that window entries fill. Either way no entry, and a read shows.
  int tokens_the_extra_source_changes = 0;
  for (uint64_t seed = 1; seed <= 48; ++seed) {
    const int64_t W = std::vector<int64_t>{1, 4, 8}[seed % 3];
    const int64_t X = std::vector<int64_t>{1, 6, 11}[(seed / 3) % 3];
    ProblemShape shape{
        .num_tokens = 8,
        .num_heads = std::vector<int64_t>{1, 3, 8}[(seed / 9) % 3],
        .head_dim = std::vector<int64_t>{4, 16, 64}[(seed / 2) % 3],
        .num_blocks = 4,
        .block_size = 3,
        .window_size = W,
        .index_cols = W + static_cast<int64_t>(seed % 2) * 2,
        .kv_token_pad = static_cast<int64_t>(seed % 3),
        .inv_scale_dtype = seed % 2 ? DType::kFloat32 : DType::kBFloat16,
        .index_dtype = seed % 4 < 2 ? DType::kInt64 : DType::kInt32,
    };
    shape.extra = testing::ExtraShape{
        .num_blocks = 3 + static_cast<int64_t>(seed % 2),
        .block_size = std::vector<int64_t>{2, 5}[(seed / 4) % 2],
        .max_entries = X,
        .index_cols = X + static_cast<int64_t>((seed / 2) % 2) * 3,
        .kv_token_pad = static_cast<int64_t>((seed / 5) % 2) * 4,
        .kv_block_pad = static_cast<int64_t>(seed % 3),
        .index_pad = static_cast<int64_t>(seed % 2),
        .inv_scale_dtype = seed % 3 == 0 ? DType::kFloat32 : DType::kBFloat16,
        .index_dtype = seed % 5 < 2 ? DType::kInt64 : DType::kInt32,
        .lens_dtype = seed % 7 < 3 ? DType::kInt64 : DType::kInt32,
        .shares_window_cache = seed % 4 == 0,
    };
    HostProblem p(shape, seed);
    const int64_t S = p.num_slots();
    const int64_t extra_block_size = shape.extra->shares_window_cache ? shape.block_size : shape.extra->block_size;
    const int64_t S_x = p.num_slots(Source::kExtra) - extra_block_size;  // the range args() will describe
    const ColumnDraw window{.source = Source::kWindow, .max_entries = W, .index_cols = shape.index_cols,
                            .real_slots = S - 1, .poisoned_slot = S - 1, .past_id = S + 7};
    const ColumnDraw extra{.source = Source::kExtra, .max_entries = X, .index_cols = shape.extra->index_cols,
                           .real_slots = S_x - 1, .poisoned_slot = S_x - 1, .past_id = S_x};
    // Per token (window, extra): an empty window with a full extra source, nothing in either, each
    // source alone, and lengths -1 / 0 / 1 / limit - 1 / limit / limit + 1 / huge on both sides.
    const std::vector<std::pair<int64_t, int64_t>> lens = {{0, X + 1}, {-1, 0},     {1, X},     {W - 1, -1},
                                                           {W, 1},     {W + 1, X - 1}, {W, 1000}, {0, -1}};
    for (int64_t t = 0; t < shape.num_tokens; ++t) {
      draw_columns(p, window, t, lens[t].first);
      draw_columns(p, extra, t, lens[t].second);
    }
    maybe_set_sinks(p, seed);
    DecodeArgs a = p.args();
    a.extra.num_blocks -= 1;
    const std::string label = "seed " + std::to_string(seed);
    expect_matches_dense(a, label.c_str());

    DecodeArgs window_alone = a;
    window_alone.extra = KvSource{};
    const reference::Result both = reference::compute(a), alone = reference::compute(window_alone);
    for (int64_t t = 0; t < shape.num_tokens; ++t) {
      tokens_the_extra_source_changes += both.lse_at(t, 0) != alone.lse_at(t, 0);
    }
  }
  EXPECT_GT(tokens_the_extra_source_changes, 48);  // about half of the 8 x 48 tokens have extra entries
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

// Five ways for one source to give token (way + shift) % 5 no entry. Needs int64 ids and lengths,
// 5 tokens and a limit of at least 3.
void give_no_entries(HostProblem& p, Source source, int64_t shift) {
  const int64_t S = p.num_slots(source);
  const auto token = [shift](int64_t way) { return (way + shift) % 5; };
  p.set_len(token(0), 0, source);
  p.set_index_raw(token(0), 0, 1, source);  // a poisoned slot behind a length of 0
  p.set_len(token(1), -1, source);          // graph padding: counts as 0, never as UINT_MAX
  p.set_index_raw(token(1), 0, 2, source);
  p.set_len(token(2), 3, source);           // all holes
  p.set_len(token(3), 3, source);           // all out of range
  p.set_index_raw(token(3), 0, S, source);
  p.set_index_raw(token(3), 1, -7, source);
  p.set_index_raw(token(3), 2, std::numeric_limits<int64_t>::max(), source);
  p.set_len(token(4), std::numeric_limits<int64_t>::min(), source);
}

// Every token of `p` (5 tokens, 2 heads, D = 4) gets out = +0 and lse = -inf (or +inf where the
// args ask FlashMLA's convention), whatever the sink.
void expect_every_token_empty_whatever_the_sink(HostProblem& p) {
  const double empty_lse = p.args().empty_token_lse == EmptyTokenLse::kPositiveInfinity ? kInf : -kInf;
  for (const std::vector<float>& sink : {std::vector<float>{}, std::vector<float>{0.5f, 3.0f},
                                         std::vector<float>{std::numeric_limits<float>::infinity(),
                                                            -std::numeric_limits<float>::infinity()}}) {
    p.set_sink(sink);
    const reference::Result r = reference::compute(p.args());
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t h = 0; h < 2; ++h) {
        EXPECT_EQ(r.lse_at(t, h), empty_lse) << "t=" << t;
        for (int64_t d = 0; d < 4; ++d) {
          EXPECT_EQ(r.out_at(t, h, d), 0.0) << "t=" << t;
          EXPECT_FALSE(std::signbit(r.out_at(t, h, d)));
        }
      }
  }
}

ProblemShape five_empty_tokens() {
  ProblemShape s = one_token(2, 4, 3);
  s.num_tokens = 5;
  s.lens_dtype = DType::kInt64;
  s.index_dtype = DType::kInt64;
  return s;
}

TEST(ReferenceCases, EmptyTokensGiveZeroAndMinusInfWhateverTheSink) {
  HostProblem p(five_empty_tokens(), 3);
  give_no_entries(p, Source::kWindow, 0);
  expect_every_token_empty_whatever_the_sink(p);
}

TEST(ReferenceCases, EmptyTokensGetPlusInfWhereFlashMlasConventionIsAsked) {
  ProblemShape s = five_empty_tokens();
  s.empty_token_lse = EmptyTokenLse::kPositiveInfinity;
  HostProblem p(s, 3);
  give_no_entries(p, Source::kWindow, 0);
  expect_every_token_empty_whatever_the_sink(p);
}

TEST(ReferenceCases, ATokenWithNoEntryInEitherSourceIsEmpty) {
  for (const bool shared : {false, true}) {
    ProblemShape s = five_empty_tokens();
    s.extra = testing::ExtraShape{.num_blocks = 2, .block_size = 4, .max_entries = 3, .index_cols = 3,
                                  .index_dtype = DType::kInt64, .lens_dtype = DType::kInt64,
                                  .shares_window_cache = shared};
    for (int64_t shift = 0; shift < 5; ++shift) {  // every pairing of the five ways
      HostProblem p(s, 4);
      give_no_entries(p, Source::kWindow, 0);
      give_no_entries(p, Source::kExtra, shift);
      expect_every_token_empty_whatever_the_sink(p);
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

// ---------------------------------------------------------------------------------------------
// The extra source, by comparison with a window that holds the same entries in the same order
// (the reference then does the same arithmetic, so the results are equal, not near).

// Gives `slots` rows of known codes and scales in `source`'s cache, the same for every problem.
void set_known_rows(HostProblem& p, const std::vector<int64_t>& slots, Source source) {
  for (size_t i = 0; i < slots.size(); ++i) {
    const auto step = static_cast<uint8_t>(i);
    p.set_row(slots[i], {static_cast<uint8_t>(0x30 + step), 0x3C, static_cast<uint8_t>(0xB0 + 2 * step), 0x41},
              0.5f + 0.25f * static_cast<float>(i), source);
  }
}

// One token's columns, all valid.
void set_columns(HostProblem& p, const std::vector<int64_t>& slots, Source source) {
  p.set_len(0, static_cast<int64_t>(slots.size()), source);
  for (size_t c = 0; c < slots.size(); ++c) p.set_index(0, static_cast<int64_t>(c), slots[c], source);
}

void expect_same_result(const DecodeArgs& a, const DecodeArgs& b, const char* label) {
  const reference::Result ra = reference::compute(a), rb = reference::compute(b);
  EXPECT_EQ(ra.out, rb.out) << label;
  EXPECT_EQ(ra.lse, rb.lse) << label;
  for (double v : ra.out) ASSERT_FALSE(std::isnan(v)) << label;
}

testing::ExtraShape small_extra(int64_t max_entries) {
  return testing::ExtraShape{.num_blocks = 3, .block_size = 2, .max_entries = max_entries, .index_cols = max_entries};
}

TEST(ReferenceExtra, ExtraEntriesJoinTheWindowsSoftmaxByHand) {
  ProblemShape s = one_token(1, 4, 1);
  s.extra = small_extra(1);
  HostProblem p(s, 1);
  p.set_row(2, {0x38}, 1.0f);                  // window k = [1, 1, 1, 1]
  p.set_row(5, {0x40}, 1.0f, Source::kExtra);  // extra k = [2, 2, 2, 2]
  set_columns(p, {2}, Source::kWindow);
  set_columns(p, {5}, Source::kExtra);
  for (int64_t d = 0; d < 4; ++d) p.set_q(0, 0, d, d == 0 ? 0.5f : 0.0f);  // scale 1: s1 = 0.5, s2 = 1
  p.set_sink({0.25f});
  DecodeArgs a = p.args();
  a.scale = 1.0f;
  const reference::Result r = reference::compute(a);
  const double e1 = std::exp(0.5), e2 = std::exp(1.0), ez = std::exp(0.25);
  for (int64_t d = 0; d < 4; ++d) EXPECT_NEAR(r.out_at(0, 0, d), (e1 * 1 + e2 * 2) / (e1 + e2 + ez), 1e-14);
  EXPECT_NEAR(r.lse_at(0, 0), std::log(e1 + e2), 1e-14);  // both sources, not the sink
  expect_matches_dense(a, "window + extra by hand");
}

TEST(ReferenceExtra, EitherSourceAloneIsTheSoftmaxOverItsEntries) {
  const std::vector<int64_t> slots = {1, 4, 2};
  HostProblem window(one_token(2, 8, 3), 5);  // the same seed: the same q
  set_known_rows(window, slots, Source::kWindow);
  set_columns(window, slots, Source::kWindow);

  ProblemShape s = one_token(2, 8, 3);
  s.extra = small_extra(3);
  HostProblem extra_only(s, 5);  // an empty window: a poisoned id behind a length of 0
  set_known_rows(extra_only, slots, Source::kExtra);
  set_columns(extra_only, slots, Source::kExtra);
  extra_only.set_index_raw(0, 0, 7);
  expect_same_result(extra_only.args(), window.args(), "extra alone");
  expect_matches_dense(extra_only.args(), "extra alone");

  // An empty extra source: a length of -1, then holes and an id past S_x. Described with 2 of its
  // 3 blocks, so S_x = 4 and slot 4 is poisoned memory of its pool.
  HostProblem window_only(s, 5);
  set_known_rows(window_only, slots, Source::kWindow);
  set_columns(window_only, slots, Source::kWindow);
  window_only.set_len(0, -1, Source::kExtra);
  window_only.set_index_raw(0, 0, 3, Source::kExtra);
  DecodeArgs a = window_only.args();
  a.extra.num_blocks = 2;
  expect_same_result(a, window.args(), "window alone, extra length -1");
  window_only.set_len(0, 3, Source::kExtra);
  window_only.set_index_raw(0, 0, -1, Source::kExtra);
  window_only.set_index_raw(0, 1, 4, Source::kExtra);
  expect_same_result(a, window.args(), "window alone, extra holes and an id past its slots");
}

TEST(ReferenceExtra, DuplicatesCountAsOftenAsTheyAppearAcrossSources) {
  // Window [5, 5] and extra [5, 2] on one cache are the window [5, 5, 5, 2].
  HostProblem window(one_token(2, 8, 4), 6);
  set_known_rows(window, {5, 2}, Source::kWindow);
  set_columns(window, {5, 5, 5, 2}, Source::kWindow);

  ProblemShape s = one_token(2, 8, 2);
  s.extra = testing::ExtraShape{.max_entries = 2, .index_cols = 2, .shares_window_cache = true};
  HostProblem both(s, 6);
  set_known_rows(both, {5, 2}, Source::kWindow);
  set_columns(both, {5, 5}, Source::kWindow);
  set_columns(both, {5, 2}, Source::kExtra);
  for (const std::vector<float>& sink : {std::vector<float>{}, std::vector<float>{0.75f, -1.0f}}) {
    window.set_sink(sink);
    both.set_sink(sink);
    expect_same_result(both.args(), window.args(), "duplicates across sources");
  }
  expect_matches_dense(both.args(), "duplicates across sources");
}

TEST(ReferenceExtra, BothSourcesMayBeTheSameTensors) {
  // The extra source reading the window's own cache, scales, ids and lengths doubles every entry.
  const std::vector<int64_t> slots = {3, 9, 0};
  HostProblem doubled(one_token(3, 8, 6), 7);
  set_known_rows(doubled, slots, Source::kWindow);
  set_columns(doubled, {3, 9, 0, 3, 9, 0}, Source::kWindow);

  ProblemShape s = one_token(3, 8, 3);
  s.extra = testing::ExtraShape{.max_entries = 3, .index_cols = 3, .shares_window_cache = true};
  HostProblem same(s, 7);
  set_known_rows(same, slots, Source::kWindow);
  set_columns(same, slots, Source::kWindow);
  DecodeArgs a = same.args();
  a.extra.indices = a.indices;
  a.extra.lens = a.lens;
  a.extra.index_dtype = a.index_dtype;
  a.extra.lens_dtype = a.lens_dtype;
  a.extra.index_cols = a.index_cols;
  a.extra.stride_indices_token = a.stride_indices_token;
  ASSERT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  expect_same_result(a, doubled.args(), "one set of tensors, two sources");
}

TEST(ReferenceExtra, ExtraColumnsPastItsLimitAndIdsPastItsSlotsAreNeverRead) {
  ProblemShape s = one_token(2, 8, 2);
  s.num_tokens = 2;
  s.extra = testing::ExtraShape{.num_blocks = 3, .block_size = 2, .max_entries = 3, .index_cols = 6};
  HostProblem p(s, 8);
  // Described with 2 of its 3 blocks: S_x = 4, and slots 4 and 5 are poisoned memory past its range.
  p.set_len(0, 0);
  p.set_len(0, 100, Source::kExtra);  // past the limit: columns 3..5 name a poisoned slot in range
  for (int64_t c = 0; c < 3; ++c) p.set_index(0, c, std::vector<int64_t>{0, 1, 3}[c], Source::kExtra);
  for (int64_t c = 3; c < 6; ++c) p.set_index_raw(0, c, 2, Source::kExtra);
  p.set_len(1, 2);
  p.set_index(1, 0, 6);
  p.set_index(1, 1, 11);
  p.set_len(1, 3, Source::kExtra);
  p.set_index_raw(1, 0, 4, Source::kExtra);
  p.set_index_raw(1, 1, 5, Source::kExtra);
  p.set_index(1, 2, 1, Source::kExtra);
  DecodeArgs a = p.args();
  a.extra.num_blocks = 2;
  const reference::Result r = reference::compute(a);
  for (double v : r.out) EXPECT_FALSE(std::isnan(v));
  for (double v : r.lse) EXPECT_TRUE(std::isfinite(v));
  expect_matches_dense(a, "extra columns and ids out of range");
}

// ---------------------------------------------------------------------------------------------
// Lengths ("Valid entries"): one lens entry for lens_rows_per_entry consecutive tokens, or no lens

TEST(ReferenceLens, OneLengthPerGroupOfTokensIsTheLengthOfEachOfThem) {
  // T = 12 tokens, the window's lengths shared by groups of n_w and the extra source's by groups of
  // n_x. Consecutive groups get different lengths (-1, 0, 1, limit - 1, limit, limit + 1 in turn),
  // so a reader of lens[t] instead of lens[t / n] sees another group's length.
  int cases = 0;
  for (const auto& [n_w, n_x] : std::vector<std::pair<int64_t, int64_t>>{{3, 4}, {2, 1}, {1, 6}, {12, 2}, {4, 12}}) {
    for (const uint64_t seed : {1, 2}) {
      const int64_t W = 5, X = 4;
      ProblemShape shape{.num_tokens = 12, .num_heads = 3, .head_dim = 8, .num_blocks = 4, .block_size = 3,
                         .window_size = W, .index_cols = W + 2,
                         .index_dtype = seed == 1 ? DType::kInt32 : DType::kInt64,
                         .lens_dtype = seed == 1 ? DType::kInt64 : DType::kInt32};
      shape.extra = testing::ExtraShape{.num_blocks = 3, .block_size = 2, .max_entries = X, .index_cols = X + 3,
                                        .lens_dtype = seed == 1 ? DType::kInt32 : DType::kInt64};
      HostProblem p(shape, seed);
      const int64_t S = p.num_slots(), S_x = p.num_slots(Source::kExtra);
      const ColumnDraw window{.source = Source::kWindow, .max_entries = W, .index_cols = shape.index_cols,
                              .real_slots = S - 1, .poisoned_slot = S - 1, .past_id = S + 7};
      const ColumnDraw extra{.source = Source::kExtra, .max_entries = X, .index_cols = shape.extra->index_cols,
                             .real_slots = S_x - 1, .poisoned_slot = S_x - 1, .past_id = S_x + 3};
      const std::vector<int64_t> window_kinds = {W, -1, 0, 1, W - 1, W + 1};
      const std::vector<int64_t> extra_kinds = {X - 1, X, 1, -1, X + 1, 0};
      for (int64_t t = 0; t < shape.num_tokens; ++t) {
        draw_columns(p, window, t, window_kinds[(t / n_w) % window_kinds.size()]);
        draw_columns(p, extra, t, extra_kinds[(t / n_x) % extra_kinds.size()]);
      }
      maybe_set_sinks(p, seed);
      const DecodeArgs per_token = p.args();
      const DecodeArgs per_group = p.args_with_lens_per_rows(n_w, n_x);
      const std::string label = "n_w=" + std::to_string(n_w) + " n_x=" + std::to_string(n_x) + " seed " +
                                std::to_string(seed);
      ASSERT_TRUE(validate_args(per_group).ok()) << label << ": " << validate_args(per_group).message;
      expect_same_result(per_group, per_token, label.c_str());
      expect_matches_dense(per_group, label.c_str());
      // A source's group lengths read one per token (lens[t], not lens[t / n]) are another problem
      // on its first groups: the case can tell them apart.
      for (const bool misread_window : {true, false}) {
        const int64_t n = misread_window ? n_w : n_x;
        const int64_t groups = shape.num_tokens / n;
        if (n == 1 || groups == 1) continue;
        DecodeArgs misread = per_group;
        (misread_window ? misread.lens_rows_per_entry : misread.extra.lens_rows_per_entry) = 1;
        misread.num_tokens = groups;
        DecodeArgs first_tokens = per_token;
        first_tokens.num_tokens = groups;
        EXPECT_NE(reference::compute(misread).lse, reference::compute(first_tokens).lse)
            << label << (misread_window ? ": window" : ": extra source");
      }
      ++cases;
    }
  }
  EXPECT_EQ(cases, 10);
}

TEST(ReferenceLens, NoLensCountsEveryIndexColumnUpToTheLimit) {
  // Index columns past each limit name a poisoned slot: counting them would make the result NaN.
  const int64_t W = 4, X = 3;
  ProblemShape shape{.num_tokens = 3, .num_heads = 2, .head_dim = 8, .num_blocks = 4, .block_size = 3,
                     .window_size = W, .index_cols = W + 3};
  shape.extra = testing::ExtraShape{.num_blocks = 3, .block_size = 2, .max_entries = X, .index_cols = X + 2};
  HostProblem p(shape, 5);
  const int64_t S = p.num_slots(), S_x = p.num_slots(Source::kExtra);
  const ColumnDraw window{.source = Source::kWindow, .max_entries = W, .index_cols = shape.index_cols,
                          .real_slots = S - 1, .poisoned_slot = S - 1, .past_id = S + 7};
  const ColumnDraw extra{.source = Source::kExtra, .max_entries = X, .index_cols = shape.extra->index_cols,
                         .real_slots = S_x - 1, .poisoned_slot = S_x - 1, .past_id = S_x + 3};
  for (int64_t t = 0; t < shape.num_tokens; ++t) {
    draw_columns(p, window, t, std::numeric_limits<int32_t>::max());
    draw_columns(p, extra, t, std::numeric_limits<int32_t>::max());
  }
  p.set_sink({0.5f, -std::numeric_limits<float>::infinity()});
  const DecodeArgs with_lens = p.args();
  for (const bool window_lens : {false, true}) {
    DecodeArgs a = with_lens;
    if (!window_lens) a.lens = nullptr;
    if (window_lens) a.extra.lens = nullptr;
    a.lens_rows_per_entry = 3;  // unused without lens, and harmless with them: every length is the same
    const char* label = window_lens ? "no extra.lens" : "no lens";
    ASSERT_TRUE(validate_args(a).ok()) << label << ": " << validate_args(a).message;
    expect_same_result(a, with_lens, label);
    expect_matches_dense(a, label);
  }
}

// ---------------------------------------------------------------------------------------------
// kModel1 rows ("Row formats"): against the dense version's own decoder and by hand

TEST(ReferenceUe8m0, AllCodesMatchTheFormatDefinition) {
  for (int code = 0; code < 255; ++code) {
    EXPECT_EQ(reference::decode_ue8m0(static_cast<uint8_t>(code)), ue8m0_via_binary32(static_cast<uint8_t>(code)))
        << code;
  }
  EXPECT_EQ(reference::decode_ue8m0(0), 0x1p-127);
  EXPECT_EQ(reference::decode_ue8m0(127), 1.0);
  EXPECT_EQ(reference::decode_ue8m0(254), 0x1p127);
  EXPECT_TRUE(std::isnan(reference::decode_ue8m0(0xFF)));
}

ProblemShape model1_problem(int64_t block_size, bool window_model1, std::optional<KvFormat> extra_format) {
  ProblemShape s{.num_tokens = 3, .num_heads = 2, .head_dim = 512, .num_blocks = 3, .block_size = block_size,
                 .window_size = 3, .index_cols = 4};
  s.kv_format = window_model1 ? KvFormat::kModel1 : KvFormat::kE4m3;
  if (extra_format) {
    s.extra = testing::ExtraShape{.num_blocks = 2, .block_size = block_size, .max_entries = 3, .index_cols = 3,
                                  .format = *extra_format};
  }
  return s;
}

// FlashMLA's block strides: B * 584 bytes rounded up to a multiple of 576.
TEST(ReferenceModel1, TheFixtureLaysBlocksOutAsFlashMla) {
  const std::vector<std::pair<int64_t, int64_t>> strides = {{1, 1152}, {2, 1728}, {64, 37440}, {256, 149760}};
  for (const auto& [block_size, stride] : strides) {
    HostProblem p(model1_problem(block_size, true, KvFormat::kModel1), 1);
    const DecodeArgs a = p.args();
    EXPECT_EQ(a.stride_kv_block, stride) << block_size;
    EXPECT_EQ(a.extra.stride_kv_block, stride) << block_size;
    EXPECT_EQ(a.stride_kv_token, 576);
    EXPECT_EQ(a.inv_scale, nullptr);
    EXPECT_EQ(a.num_scales, 0);
  }
}

// Random entries (holes, ids past the slots, repeats, poisoned columns past the length) at block
// sizes 1, 2, 64 and 256, with both sources in kModel1, one in each format, and the window alone,
// and a block stride padded by one more 576-byte unit.
TEST(ReferenceModel1, MatchesTheDenseDecoderAcrossBlockSizesAndFormats) {
  const std::vector<std::pair<bool, std::optional<KvFormat>>> formats = {
      {true, KvFormat::kModel1}, {true, KvFormat::kE4m3}, {false, KvFormat::kModel1}, {true, std::nullopt}};
  uint64_t seed = 0;
  for (const int64_t block_size : {1, 2, 64, 256}) {
    for (const auto& [window_model1, extra_format] : formats) {
      ++seed;
      ProblemShape s = model1_problem(block_size, window_model1, extra_format);
      if (seed % 3 == 0) s.kv_block_pad = 576;
      HostProblem p(s, seed);
      maybe_set_sinks(p, seed);
      const int64_t S = p.num_slots();
      const ColumnDraw window{Source::kWindow, s.window_size, s.index_cols, S - 1, S - 1, S + 5};
      for (int64_t t = 0; t < s.num_tokens; ++t) draw_columns(p, window, t, p.rng().uniform_int(-1, 4));
      if (extra_format) {
        const int64_t X = p.num_slots(Source::kExtra);
        const ColumnDraw extra{Source::kExtra, 3, 3, X - 1, X - 1, X};
        for (int64_t t = 0; t < s.num_tokens; ++t) draw_columns(p, extra, t, p.rng().uniform_int(0, 3));
      }
      const std::string label = "B " + std::to_string(block_size) + " window " + (window_model1 ? "model1" : "e4m3") +
                                " extra " + (extra_format ? (*extra_format == KvFormat::kModel1 ? "model1" : "e4m3") : "none");
      expect_matches_dense(p.args(), label.c_str());
    }
  }
}

// One entry, so its weight is exactly 1 and out is the row itself: scale bytes 0 and 254 (2^-127,
// 2^127) among others, e4m3 codes up to +-448 and the smallest subnormal, RoPE values at the bf16
// extremes (largest finite, smallest subnormal, -0, most negative). The slot is offset 1 of block 1
// (B = 2); offset 0 of that block, its row and its scale row, stays poisoned.
TEST(ReferenceModel1, EdgeScalesAndRopeExtremesComeOutExactly) {
  HostProblem p(model1_problem(2, true, std::nullopt), 3);
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t d = 0; d < 512; ++d) p.set_q(t, h, d, 0.0f);  // scores 0: the huge rows cannot overflow exp
    }
  }
  const std::vector<uint8_t> codes = {0x01, 0x7E, 0xFE, 0x38, 0x00, 0x80, 0x55};
  const std::array<uint8_t, 7> scales = {0, 254, 127, 1, 253, 128, 126};
  const std::vector<uint16_t> rope = {0x7F7F, 0x0001, 0x8000, 0xFF7F, 0x3F80};
  p.set_model1_row(3, codes, scales, rope);
  p.set_len(0, 1);
  p.set_index_raw(0, 0, 3);
  const DecodeArgs a = p.args();
  ASSERT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  const reference::Result r = reference::compute(a);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t d = 0; d < 448; ++d) {
      const double want = std::ldexp(static_cast<double>(e4m3_via_binary32(codes[d % codes.size()])),
                                     scales[d / 64] - 127);
      EXPECT_EQ(r.out_at(0, h, d), want) << "d=" << d;
    }
    for (int64_t i = 0; i < 64; ++i) {
      EXPECT_EQ(r.out_at(0, h, 448 + i), static_cast<double>(bf16_value(rope[i % rope.size()]))) << "i=" << i;
    }
    EXPECT_EQ(r.lse_at(0, h), 0.0);
  }
  EXPECT_EQ(r.out_at(0, 0, 64), 448 * 0x1p127);       // code 0x7E at d = 64, scale byte 254
  EXPECT_EQ(r.out_at(0, 0, 0), 0x1p-9 * 0x1p-127);    // code 0x01 at d = 0, scale byte 0
  EXPECT_EQ(r.out_at(0, 0, 448), 0x1.FEp127);          // bf16 0x7F7F
  EXPECT_EQ(r.out_at(0, 0, 449), 0x1p-133);            // bf16 0x0001
  expect_matches_dense(a, "edge scales and RoPE values");
  // run() rounds once to bf16: the RoPE values come back bit for bit (-0 as 0: out sums from +0).
  ASSERT_TRUE(reference::run(a).ok());
  EXPECT_EQ(p.out_bits(0, 0, 448), 0x7F7F);
  EXPECT_EQ(p.out_bits(0, 0, 449), 0x0001);
  EXPECT_EQ(p.out_bits(0, 0, 451), 0xFF7F);
  EXPECT_EQ(p.out_bits(0, 0, 452), 0x3F80);
}

// The poison is live: naming a row never filled, or poisoning the one scale byte a filled row uses
// for a group, turns the result into NaN; the pad byte of a scale row and the other rows' footers
// stay poisoned and are never read.
TEST(ReferenceModel1, PoisonedRowsAndFootersShowWhenRead) {
  HostProblem p(model1_problem(2, true, std::nullopt), 4);
  p.set_len(0, 1);
  p.set_index(0, 0, 1);  // fills slot 1 (block 0, offset 1); slot 0 shares its block and stays poisoned
  ASSERT_EQ(p.model1_scales(1)[7], testing::kUe8m0NaN);  // the pad byte
  ASSERT_EQ(p.model1_scales(0)[0], testing::kUe8m0NaN);
  expect_matches_dense(p.args(), "one filled row beside poisoned ones");

  HostProblem unfilled(model1_problem(2, true, std::nullopt), 4);
  unfilled.set_len(0, 1);
  unfilled.set_index_raw(0, 0, 0);
  EXPECT_TRUE(std::isnan(reference::compute(unfilled.args()).out_at(0, 0, 0)));
  EXPECT_TRUE(std::isnan(reference::compute(unfilled.args()).out_at(0, 0, 500)));  // the RoPE part too

  p.model1_scales(1)[6] = testing::kUe8m0NaN;  // the scale of dims 384..447: the score is NaN
  EXPECT_TRUE(std::isnan(reference::compute(p.args()).out_at(0, 0, 0)));
}

// Both sources reading one kModel1 cache count each entry twice, as the window naming it twice
// (moderate scales: the dense version's LSE has no max shift).
TEST(ReferenceModel1, BothSourcesOnOneModel1Cache) {
  const std::vector<int64_t> slots = {3, 0, 5};
  ProblemShape doubled_shape = model1_problem(2, true, std::nullopt);
  doubled_shape.window_size = doubled_shape.index_cols = 6;
  HostProblem doubled(doubled_shape, 8);
  ProblemShape s = model1_problem(2, true, std::nullopt);
  s.extra = testing::ExtraShape{.max_entries = 3, .index_cols = 3, .shares_window_cache = true};
  HostProblem same(s, 8);
  for (HostProblem* p : {&doubled, &same}) {
    for (size_t i = 0; i < slots.size(); ++i) {
      const auto step = static_cast<uint8_t>(i);
      p->set_model1_row(slots[i], {static_cast<uint8_t>(0x30 + step), 0xB9}, {120, 127, 130, 125, 129, 126, 128},
                        {static_cast<uint16_t>(0x3F00 + step), 0xBF80});
    }
  }
  set_columns(doubled, {3, 0, 5, 3, 0, 5}, Source::kWindow);
  set_columns(same, slots, Source::kWindow);
  set_columns(same, slots, Source::kExtra);
  const DecodeArgs a = same.args();
  ASSERT_EQ(a.extra.format, KvFormat::kModel1);
  ASSERT_EQ(a.extra.kv_cache, a.kv_cache);
  ASSERT_TRUE(validate_args(a).ok()) << validate_args(a).message;
  expect_same_result(a, doubled.args(), "one kModel1 cache, two sources");
  expect_matches_dense(a, "one kModel1 cache, two sources");
}

TEST(ReferenceRun, DecodeOnCpuReadsTheExtraSource) {
  ProblemShape s = one_token(2, 16, 2);
  s.extra = small_extra(4);
  HostProblem p(s, 9);
  set_columns(p, {1, 8}, Source::kWindow);
  set_columns(p, {0, 5, 3, 5}, Source::kExtra);
  DecodeArgs a = p.args();
  const reference::Result r = reference::compute(a);
  ASSERT_TRUE(decode(a).ok()) << decode(a).message;
  for (int64_t h = 0; h < 2; ++h) {
    EXPECT_EQ(p.lse(0, h), static_cast<float>(r.lse_at(0, h)));
    for (int64_t d = 0; d < 16; ++d) EXPECT_EQ(p.out_bits(0, h, d), reference::double_to_bf16(r.out_at(0, h, d)));
  }
  a.extra = KvSource{};
  EXPECT_NE(reference::compute(a).lse, r.lse);  // the extra entries took part
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
