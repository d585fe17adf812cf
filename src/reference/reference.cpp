// Written from docs/semantics.md alone; see reference.h for what it promises.
#include "src/reference/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace swa_decode::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

int64_t read_int(const void* base, DType dtype, int64_t element) {
  if (dtype == DType::kInt64) return static_cast<const int64_t*>(base)[element];
  return static_cast<const int32_t*>(base)[element];
}

double read_bf16(const void* base, int64_t element) {
  return bf16_to_float(static_cast<const uint16_t*>(base)[element]);
}

double read_scale(const void* base, DType dtype, int64_t slot) {
  if (dtype == DType::kFloat32) return static_cast<const float*>(base)[slot];
  return read_bf16(base, slot);
}

// Appends to k the 512 values of a kModel1 row ("Row formats"): offset `offset` of the block at
// `block`, B = block_size rows of 576 bytes and then B scale rows of 8 bytes. d < 448: e4m3 byte d
// times 2^(scale[d / 64] - 127); d >= 448: the bf16 values after the e4m3 bytes, little-endian.
void append_model1_row(const uint8_t* block, int64_t block_size, int64_t offset, std::vector<double>& k) {
  const uint8_t* row = block + offset * kModel1RowBytes;
  const uint8_t* scales = block + block_size * kModel1RowBytes + offset * kModel1ScaleRowBytes;
  constexpr int64_t kDimsPerScale = 64;
  for (int64_t d = 0; d < kModel1E4m3Dims; ++d) {
    k.push_back(decode_e4m3(row[d]) * decode_ue8m0(scales[d / kDimsPerScale]));
  }
  for (int64_t d = kModel1E4m3Dims; d < kModel1HeadDim; ++d) {
    const uint8_t* bytes = row + kModel1E4m3Dims + 2 * (d - kModel1E4m3Dims);
    k.push_back(bf16_to_float(static_cast<uint16_t>(bytes[0] | (bytes[1] << 8))));
  }
}

// Appends to k ([J, D]) the dequantized row of every valid entry of token t in one source, in
// column order, duplicates kept ("Valid entries", "The extra source"): k_j[d] = e4m3(row(slot)[d])
// * inv_scale[slot] for kE4m3, append_model1_row for kModel1. DecodeArgs names the window's fields
// as KvSource names the extra source's, so the one template reads either; `max_entries` and
// `format` are window_size and kv_format for the window.
template <class Source>
void append_valid_rows(const Source& src, int64_t max_entries, KvFormat format, int64_t head_dim, int64_t t,
                       std::vector<double>& k) {
  // "Valid entries": one lens entry per lens_rows_per_entry consecutive tokens; without lens, every
  // index column counts.
  const int64_t len = src.lens == nullptr ? src.index_cols
                                          : read_int(src.lens, src.lens_dtype, t / src.lens_rows_per_entry);
  const int64_t columns = std::min(std::max<int64_t>(len, 0), max_entries);
  const int64_t num_slots = src.num_blocks * src.block_size;
  const auto* cache = static_cast<const uint8_t*>(src.kv_cache);
  for (int64_t c = 0; c < columns; ++c) {
    const int64_t slot = read_int(src.indices, src.index_dtype, t * src.stride_indices_token + c);
    if (slot < 0 || slot >= num_slots) continue;  // no entry: neither its row nor its scale is read
    const uint8_t* block = cache + (slot / src.block_size) * src.stride_kv_block;
    if (format == KvFormat::kModel1) {
      append_model1_row(block, src.block_size, slot % src.block_size, k);
      continue;
    }
    const uint8_t* row = block + (slot % src.block_size) * src.stride_kv_token;
    const double inv_scale = read_scale(src.inv_scale, src.inv_scale_dtype, slot);
    for (int64_t d = 0; d < head_dim; ++d) k.push_back(decode_e4m3(row[d]) * inv_scale);
  }
}

}  // namespace

double decode_e4m3(uint8_t code) {
  const int sign = code >> 7;
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, 1 - 7)
                                         : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

double decode_ue8m0(uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<double>::quiet_NaN();
  return std::ldexp(1.0, code - 127);
}

float bf16_to_float(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

uint16_t double_to_bf16(double value) {
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0x0000;
  if (std::isnan(value)) return sign | 0x7FC0;
  if (std::isinf(value) || value == 0.0) {
    return sign | (std::isinf(value) ? 0x7F80 : 0x0000);
  }
  // bf16: 8 exponent bits (bias 127), 7 stored mantissa bits. For |value| in [2^(e-1), 2^e) the
  // spacing is 2^(e-8); below 2^-126 (subnormals) it is fixed at 2^-133.
  int e = 0;
  std::frexp(value, &e);
  const int ulp_exponent = std::max(e, -125) - 8;
  const double rounded = std::ldexp(std::nearbyint(std::ldexp(value, -ulp_exponent)), ulp_exponent);
  if (std::fabs(rounded) >= std::ldexp(1.0, 128)) return sign | 0x7F80;
  if (rounded == 0.0) return sign;
  const float as_float = static_cast<float>(rounded);  // exact: rounded is a bf16 value
  uint32_t word;
  std::memcpy(&word, &as_float, sizeof(word));
  return static_cast<uint16_t>(word >> 16);
}

Result compute(const DecodeArgs& a) {
  const int64_t T = a.num_tokens, H = a.num_heads, D = a.head_dim;
  Result r;
  r.num_tokens = T;
  r.num_heads = H;
  r.head_dim = D;
  r.out.assign(T * H * D, 0.0);
  // An empty token keeps this: the log of its empty sum, or +inf where the caller asks FlashMLA's.
  r.lse.assign(T * H, a.empty_token_lse == EmptyTokenLse::kPositiveInfinity ? kInf : -kInf);

  std::vector<double> k;  // [J, D]: J_t, the window's valid entries followed by the extra source's
  std::vector<double> scores;
  for (int64_t t = 0; t < T; ++t) {
    k.clear();
    append_valid_rows(a, a.window_size, a.kv_format, D, t, k);
    if (a.extra.kv_cache != nullptr) append_valid_rows(a.extra, a.extra.max_entries, a.extra.format, D, t, k);
    const int64_t J = static_cast<int64_t>(k.size()) / D;
    if (J == 0) continue;  // empty token (no entry in either source): out = 0, lse as above, whatever the sink
    scores.assign(J, 0.0);

    for (int64_t h = 0; h < H; ++h) {
      const int64_t q_base = t * a.stride_q_token + h * a.stride_q_head;
      for (int64_t j = 0; j < J; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += read_bf16(a.q, q_base + d) * k[j * D + d];
        scores[j] = static_cast<double>(a.scale) * dot;
      }
      const double sink = a.attn_sink != nullptr ? static_cast<double>(a.attn_sink[h]) : -kInf;
      const double max_score = *std::max_element(scores.begin(), scores.end());

      // lse = log sum_j exp(s_j), without the sink, shifted by the largest score for range.
      double sum_scores = 0.0;
      for (int64_t j = 0; j < J; ++j) sum_scores += std::exp(scores[j] - max_score);
      r.lse[t * H + h] = max_score + std::log(sum_scores);

      double* out = &r.out[(t * H + h) * D];
      if (sink == kInf) continue;  // all weight on the sink: out = 0
      // m = max(max_j s_j, sink); a sink of -inf contributes exp(-inf) = 0 to the denominator.
      const double m = std::max(max_score, sink);
      double denominator = sink == -kInf ? 0.0 : std::exp(sink - m);
      for (int64_t j = 0; j < J; ++j) denominator += std::exp(scores[j] - m);
      for (int64_t j = 0; j < J; ++j) {
        const double weight = std::exp(scores[j] - m) / denominator;
        for (int64_t d = 0; d < D; ++d) out[d] += weight * k[j * D + d];
      }
    }
  }
  return r;
}

Status run(const DecodeArgs& a) {
  const Result r = compute(a);
  auto* out = static_cast<uint16_t*>(a.out);
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    for (int64_t h = 0; h < a.num_heads; ++h) {
      uint16_t* row = out + t * a.stride_out_token + h * a.stride_out_head;
      for (int64_t d = 0; d < a.head_dim; ++d) row[d] = double_to_bf16(r.out_at(t, h, d));
      if (a.lse != nullptr) a.lse[t * a.stride_lse_token + h] = static_cast<float>(r.lse_at(t, h));
    }
  }
  return {};
}

}  // namespace swa_decode::reference
