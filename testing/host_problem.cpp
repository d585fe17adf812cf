#include "testing/host_problem.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "src/common/window_rule.h"
#include "src/reference/reference.h"
#include "testing/strides.h"

namespace swa_decode::testing {
namespace {

constexpr int64_t kNoEntry = -1;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// kv_cache strides of a source: the padded rows of kE4m3, the fixed layout of kModel1.
PaddedStrides kv_strides(KvFormat format, int64_t block_size, int64_t head_dim, int64_t token_pad, int64_t block_pad) {
  if (format == KvFormat::kModel1) return model1_strides(block_size, block_pad);
  return padded_strides(block_size, head_dim, token_pad, block_pad);
}

// The shapes, strides and dtypes of `s`, without tensor pointers.
DecodeArgs layout_of(const ProblemShape& s) {
  const int64_t T = s.num_tokens, H = s.num_heads, D = s.head_dim;
  // Token-major q nests head rows in tokens, head-major q token rows in heads.
  const PaddedStrides q = padded_strides(s.head_major_q ? T : H, D, s.q_head_pad, s.q_token_pad);
  const PaddedStrides kv = kv_strides(s.kv_format, s.block_size, D, s.kv_token_pad, s.kv_block_pad);
  const bool model1 = s.kv_format == KvFormat::kModel1;
  const PaddedStrides out = padded_strides(H, D, s.out_head_pad, s.out_token_pad);
  // The shapes, then one line per tensor, in DecodeArgs's order.
  return DecodeArgs{
      .num_tokens = T, .num_heads = H, .head_dim = D, .num_blocks = s.num_blocks, .block_size = s.block_size,
      .window_size = s.window_size, .scale = 1.0f / std::sqrt(static_cast<float>(D)),
      .stride_q_token = s.head_major_q ? q.row : q.group, .stride_q_head = s.head_major_q ? q.group : q.row,
      .stride_kv_block = kv.group, .stride_kv_token = kv.row, .kv_format = s.kv_format,
      .inv_scale_dtype = s.inv_scale_dtype, .num_scales = model1 ? 0 : s.num_blocks * s.block_size,
      .index_dtype = s.index_dtype, .index_cols = s.index_cols, .stride_indices_token = s.index_cols + s.index_pad,
      .lens_dtype = s.lens_dtype,
      .stride_lse_token = H + s.lse_pad, .empty_token_lse = s.empty_token_lse,
      .stride_out_token = out.group, .stride_out_head = out.row,
      .backend = Backend::kCpu,
  };
}

// The extra source's shapes, strides and dtypes, without tensor pointers (so kv_cache is null:
// args() sets it), or none. A source sharing the window's cache is laid out as the window's pool.
KvSource extra_layout_of(const ProblemShape& s) {
  if (!s.extra) return {};
  const ExtraShape& x = *s.extra;
  const bool shared = x.shares_window_cache;
  const int64_t num_blocks = shared ? s.num_blocks : x.num_blocks;
  const int64_t block_size = shared ? s.block_size : x.block_size;
  const KvFormat format = shared ? s.kv_format : x.format;
  const PaddedStrides kv = shared ? kv_strides(format, block_size, s.head_dim, s.kv_token_pad, s.kv_block_pad)
                                  : kv_strides(format, block_size, s.head_dim, x.kv_token_pad, x.kv_block_pad);
  const bool model1 = format == KvFormat::kModel1;
  return KvSource{
      .num_blocks = num_blocks, .block_size = block_size, .stride_kv_block = kv.group, .stride_kv_token = kv.row,
      .inv_scale_dtype = shared ? s.inv_scale_dtype : x.inv_scale_dtype,
      .num_scales = model1 ? 0 : num_blocks * block_size,
      .index_dtype = x.index_dtype, .index_cols = x.index_cols, .stride_indices_token = x.index_cols + x.index_pad,
      .lens_dtype = x.lens_dtype, .max_entries = x.max_entries, .format = format,
  };
}

// Elements from q's first to one past its last element (the padding between rows included).
size_t q_extent(const DecodeArgs& a) {
  const int64_t last_token = a.num_tokens > 0 ? a.num_tokens - 1 : 0;
  return static_cast<size_t>(last_token * a.stride_q_token + (a.num_heads - 1) * a.stride_q_head + a.head_dim);
}

}  // namespace

HostProblem::Pool::Pool(int64_t num_blocks, int64_t pool_block_size, int64_t block_stride, int64_t token_stride,
                        KvFormat pool_format)
    : block_size(pool_block_size),
      stride_kv_block(block_stride),
      stride_kv_token(token_stride),
      num_slots(num_blocks * pool_block_size),
      format(pool_format),
      cache(static_cast<size_t>(num_blocks * block_stride), kE4m3NaN),
      scales(static_cast<size_t>(num_slots), float_to_bf16_bits(kNaN), kNaN),
      filled(static_cast<size_t>(num_slots), false) {
  if (format != KvFormat::kModel1) return;
  // The RoPE values (bf16 NaN, 0xFFFF) and the whole footer (UE8M0 NaN) of every block; its e4m3
  // bytes already hold kE4m3NaN.
  for (int64_t b = 0; b < num_blocks; ++b) {
    uint8_t* block = &cache[b * stride_kv_block];
    for (int64_t o = 0; o < block_size; ++o) {
      std::fill_n(block + o * kModel1RowBytes + kModel1E4m3Dims, 2 * kModel1RopeDims, uint8_t{0xFF});
    }
    std::fill_n(block + block_size * kModel1RowBytes, block_size * kModel1ScaleRowBytes, kUe8m0NaN);
  }
}

HostProblem::Ids::Ids(int64_t num_tokens, int64_t row_stride)
    : stride_indices_token(row_stride),
      indices(static_cast<size_t>(num_tokens * row_stride), kNoEntry, kNoEntry),
      lens(static_cast<size_t>(num_tokens), 0, 0) {}

HostProblem::HostProblem(const ProblemShape& shape, uint64_t seed)
    : s_(shape),
      rng_(seed),
      args_(layout_of(shape)),
      q_(q_extent(args_), kBf16PoisonBits),  // the padding must never be read
      window_pool_(shape.num_blocks, shape.block_size, args_.stride_kv_block, args_.stride_kv_token, shape.kv_format),
      window_ids_(shape.num_tokens, args_.stride_indices_token),
      out_(static_cast<size_t>(shape.num_tokens * args_.stride_out_token), kBf16PoisonBits),
      lse_(static_cast<size_t>(shape.num_tokens * args_.stride_lse_token), kNaN) {
  args_.extra = extra_layout_of(shape);
  if (s_.extra) {
    const KvSource& x = args_.extra;
    extra_ids_.emplace(s_.num_tokens, x.stride_indices_token);
    if (!s_.extra->shares_window_cache) {
      extra_pool_.emplace(x.num_blocks, x.block_size, x.stride_kv_block, x.stride_kv_token, x.format);
    }
  }
  for (int64_t t = 0; t < s_.num_tokens; ++t) {
    for (int64_t h = 0; h < s_.num_heads; ++h) {
      for (int64_t d = 0; d < s_.head_dim; ++d) set_q(t, h, d, static_cast<float>(rng_.normal()));
    }
  }
}

void HostProblem::fill_slot(int64_t slot, Source source) {
  std::vector<bool>::reference filled = pool(source).filled[slot];
  if (filled) return;
  filled = true;
  uint8_t* codes = row(slot, source);
  const bool model1 = pool(source).format == KvFormat::kModel1;
  const int64_t e4m3_dims = model1 ? kModel1E4m3Dims : s_.head_dim;
  for (int64_t d = 0; d < e4m3_dims; ++d) {
    int64_t code;
    do code = rng_.uniform_int(0, 255); while ((code & 0x78) > 0x48);  // exponent <= 9: |value| <= 7.5
    codes[d] = static_cast<uint8_t>(code);
  }
  if (!model1) {
    set_scale(slot, static_cast<float>(0.5 + 1.5 * rng_.uniform()), source);
    return;
  }
  uint8_t* scale_codes = model1_scales(slot, source);
  for (int64_t i = 0; i < kModel1ScalesPerRow; ++i) scale_codes[i] = static_cast<uint8_t>(rng_.uniform_int(125, 128));
  for (int64_t i = 0; i < kModel1RopeDims; ++i) {
    const uint16_t bits = float_to_bf16_bits(static_cast<float>(rng_.normal()));
    codes[kModel1E4m3Dims + 2 * i] = static_cast<uint8_t>(bits & 0xFF);
    codes[kModel1E4m3Dims + 2 * i + 1] = static_cast<uint8_t>(bits >> 8);
  }
}

void HostProblem::set_model1_row(int64_t slot, const std::vector<uint8_t>& codes,
                                 const std::array<uint8_t, 7>& scale_codes, const std::vector<uint16_t>& rope_bits,
                                 Source source) {
  pool(source).filled[slot] = true;
  uint8_t* bytes = row(slot, source);
  for (int64_t d = 0; d < kModel1E4m3Dims; ++d) bytes[d] = codes[d % codes.size()];
  for (int64_t i = 0; i < kModel1RopeDims; ++i) {
    const uint16_t bits = rope_bits[i % rope_bits.size()];
    bytes[kModel1E4m3Dims + 2 * i] = static_cast<uint8_t>(bits & 0xFF);
    bytes[kModel1E4m3Dims + 2 * i + 1] = static_cast<uint8_t>(bits >> 8);
  }
  std::copy(scale_codes.begin(), scale_codes.end(), model1_scales(slot, source));
}

uint8_t* HostProblem::model1_scales(int64_t slot, Source source) {
  Pool& from = pool(source);
  return &from.cache[(slot / from.block_size) * from.stride_kv_block + from.block_size * kModel1RowBytes +
                     (slot % from.block_size) * kModel1ScaleRowBytes];
}

void HostProblem::set_row(int64_t slot, const std::vector<uint8_t>& codes, float inv_scale, Source source) {
  pool(source).filled[slot] = true;
  for (int64_t d = 0; d < s_.head_dim; ++d) row(slot, source)[d] = codes[d % codes.size()];
  set_scale(slot, inv_scale, source);
}

uint8_t* HostProblem::row(int64_t slot, Source source) {
  Pool& from = pool(source);
  return &from.cache[(slot / from.block_size) * from.stride_kv_block + (slot % from.block_size) * from.stride_kv_token];
}

void HostProblem::set_index(int64_t t, int64_t c, int64_t slot, Source source) {
  if (slot_is_valid(slot, num_slots(source))) fill_slot(slot, source);
  set_index_raw(t, c, slot, source);
}

DecodeArgs HostProblem::args() {
  DecodeArgs a = args_;
  a.q = q_.data();
  a.kv_cache = window_pool_.cache.data();
  // kModel1 keeps its scales in the cache: no inv_scale, so a read of one would crash.
  if (a.kv_format != KvFormat::kModel1) a.inv_scale = window_pool_.scales.data(a.inv_scale_dtype == DType::kFloat32);
  a.indices = window_ids_.indices.data(a.index_dtype == DType::kInt64);
  a.lens = window_ids_.lens.data(a.lens_dtype == DType::kInt64);
  if (s_.extra) {
    const Pool& extra_pool = pool(Source::kExtra);
    a.extra.kv_cache = extra_pool.cache.data();
    if (a.extra.format != KvFormat::kModel1) {
      a.extra.inv_scale = extra_pool.scales.data(a.extra.inv_scale_dtype == DType::kFloat32);
    }
    a.extra.indices = extra_ids_->indices.data(a.extra.index_dtype == DType::kInt64);
    a.extra.lens = extra_ids_->lens.data(a.extra.lens_dtype == DType::kInt64);
  }
  a.attn_sink = sink_.empty() ? nullptr : sink_.data();
  a.lse = lse_.data();
  a.out = out_.data();
  return a;
}

DecodeArgs HostProblem::args_with_lens_per_rows(int64_t window_rows_per_entry, int64_t extra_rows_per_entry) {
  DecodeArgs a = args();
  const int64_t T = s_.num_tokens;
  // One source's group lengths from the per-token ones (the int64 copy holds every value exactly).
  const auto grouped = [T](const void* lens, int64_t n, std::optional<InBothDtypes<int32_t, int64_t>>& groups,
                           const char* source) {
    if (n < 1 || T % n != 0) {
      throw std::invalid_argument(std::string(source) + ": rows per lens entry " + std::to_string(n) +
                                  " must divide num_tokens " + std::to_string(T));
    }
    const auto* per_token = static_cast<const int64_t*>(lens);
    groups.emplace(static_cast<size_t>(T / n), 0, 0);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t len = per_token[t - t % n];
      if (per_token[t] != len) {
        throw std::invalid_argument(std::string(source) + ": token " + std::to_string(t) + " has length " +
                                    std::to_string(per_token[t]) + ", its group of " + std::to_string(n) +
                                    " tokens " + std::to_string(len));
      }
      if (t % n == 0) groups->set(t / n, static_cast<int32_t>(len), len);
    }
  };
  grouped(window_ids_.lens.data(true), window_rows_per_entry, window_group_lens_, "window");
  a.lens = window_group_lens_->data(a.lens_dtype == DType::kInt64);
  a.lens_rows_per_entry = window_rows_per_entry;
  if (s_.extra) {
    grouped(extra_ids_->lens.data(true), extra_rows_per_entry, extra_group_lens_, "extra source");
    a.extra.lens = extra_group_lens_->data(a.extra.lens_dtype == DType::kInt64);
    a.extra.lens_rows_per_entry = extra_rows_per_entry;
  }
  return a;
}

std::vector<double> host_row_values(const DecodeArgs& a, Source source, int64_t slot) {
  const bool extra = source == Source::kExtra;
  const KvFormat format = extra ? a.extra.format : a.kv_format;
  const int64_t block_size = extra ? a.extra.block_size : a.block_size;
  const int64_t head_dim = a.head_dim;
  const uint8_t* block = static_cast<const uint8_t*>(extra ? a.extra.kv_cache : a.kv_cache) +
                         slot / block_size * (extra ? a.extra.stride_kv_block : a.stride_kv_block);
  const uint8_t* row = block + slot % block_size * (extra ? a.extra.stride_kv_token : a.stride_kv_token);
  std::vector<double> k(static_cast<size_t>(head_dim));
  if (format == KvFormat::kModel1) {
    const uint8_t* scales = block + block_size * kModel1RowBytes + slot % block_size * kModel1ScaleRowBytes;
    for (int64_t d = 0; d < kModel1E4m3Dims; ++d) {
      k[d] = reference::decode_e4m3(row[d]) * reference::decode_ue8m0(scales[d / 64]);
    }
    for (int64_t i = 0; i < head_dim - kModel1E4m3Dims; ++i) {
      const uint8_t* bytes = row + kModel1E4m3Dims + 2 * i;  // little-endian bf16
      k[kModel1E4m3Dims + i] = reference::bf16_to_float(static_cast<uint16_t>(bytes[0] | (bytes[1] << 8)));
    }
    return k;
  }
  const void* inv_scale = extra ? a.extra.inv_scale : a.inv_scale;
  const DType dtype = extra ? a.extra.inv_scale_dtype : a.inv_scale_dtype;
  const double scale = dtype == DType::kFloat32 ? static_cast<const float*>(inv_scale)[slot]
                                                : reference::bf16_to_float(static_cast<const uint16_t*>(inv_scale)[slot]);
  for (int64_t d = 0; d < head_dim; ++d) k[d] = reference::decode_e4m3(row[d]) * scale;
  return k;
}

}  // namespace swa_decode::testing
