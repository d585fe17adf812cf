#include "testing/host_problem.h"

#include <cmath>
#include <limits>

#include "src/common/window_rule.h"
#include "testing/strides.h"

namespace swa_decode::testing {
namespace {

constexpr int64_t kNoEntry = -1;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The shapes, strides and dtypes of `s`, without tensor pointers.
DecodeArgs layout_of(const ProblemShape& s) {
  const int64_t T = s.num_tokens, H = s.num_heads, D = s.head_dim;
  // Token-major q nests head rows in tokens, head-major q token rows in heads.
  const PaddedStrides q = padded_strides(s.head_major_q ? T : H, D, s.q_head_pad, s.q_token_pad);
  const PaddedStrides kv = padded_strides(s.block_size, D, s.kv_token_pad, s.kv_block_pad);
  const PaddedStrides out = padded_strides(H, D, s.out_head_pad, s.out_token_pad);
  // The shapes, then one line per tensor, in DecodeArgs's order.
  return DecodeArgs{
      .num_tokens = T, .num_heads = H, .head_dim = D, .num_blocks = s.num_blocks, .block_size = s.block_size,
      .window_size = s.window_size, .scale = 1.0f / std::sqrt(static_cast<float>(D)),
      .stride_q_token = s.head_major_q ? q.row : q.group, .stride_q_head = s.head_major_q ? q.group : q.row,
      .stride_kv_block = kv.group, .stride_kv_token = kv.row,
      .inv_scale_dtype = s.inv_scale_dtype, .num_scales = s.num_blocks * s.block_size,
      .index_dtype = s.index_dtype, .index_cols = s.index_cols, .stride_indices_token = s.index_cols + s.index_pad,
      .lens_dtype = s.lens_dtype,
      .stride_lse_token = H + s.lse_pad,
      .stride_out_token = out.group, .stride_out_head = out.row,
      .backend = Backend::kCpu,
  };
}

// Elements from q's first to one past its last element (the padding between rows included).
size_t q_extent(const DecodeArgs& a) {
  const int64_t last_token = a.num_tokens > 0 ? a.num_tokens - 1 : 0;
  return static_cast<size_t>(last_token * a.stride_q_token + (a.num_heads - 1) * a.stride_q_head + a.head_dim);
}

}  // namespace

HostProblem::HostProblem(const ProblemShape& shape, uint64_t seed)
    : s_(shape),
      rng_(seed),
      args_(layout_of(shape)),
      q_(q_extent(args_), kBf16PoisonBits),  // the padding must never be read
      cache_(static_cast<size_t>(shape.num_blocks * args_.stride_kv_block), kE4m3NaN),
      scales_(static_cast<size_t>(num_slots()), float_to_bf16_bits(kNaN), kNaN),
      filled_(static_cast<size_t>(num_slots()), false),
      indices_(static_cast<size_t>(shape.num_tokens * args_.stride_indices_token), kNoEntry, kNoEntry),
      lens_(static_cast<size_t>(shape.num_tokens), 0, 0),
      out_(static_cast<size_t>(shape.num_tokens * args_.stride_out_token), kBf16PoisonBits),
      lse_(static_cast<size_t>(shape.num_tokens * args_.stride_lse_token), kNaN) {
  for (int64_t t = 0; t < s_.num_tokens; ++t) {
    for (int64_t h = 0; h < s_.num_heads; ++h) {
      for (int64_t d = 0; d < s_.head_dim; ++d) set_q(t, h, d, static_cast<float>(rng_.normal()));
    }
  }
}

void HostProblem::fill_slot(int64_t slot) {
  if (filled_[slot]) return;
  filled_[slot] = true;
  uint8_t* codes = row(slot);
  for (int64_t d = 0; d < s_.head_dim; ++d) {
    int64_t code;
    do code = rng_.uniform_int(0, 255); while ((code & 0x78) > 0x48);  // exponent <= 9: |value| <= 7.5
    codes[d] = static_cast<uint8_t>(code);
  }
  set_scale(slot, static_cast<float>(0.5 + 1.5 * rng_.uniform()));
}

void HostProblem::set_row(int64_t slot, const std::vector<uint8_t>& codes, float inv_scale) {
  filled_[slot] = true;
  for (int64_t d = 0; d < s_.head_dim; ++d) row(slot)[d] = codes[d % codes.size()];
  set_scale(slot, inv_scale);
}

uint8_t* HostProblem::row(int64_t slot) {
  return &cache_[(slot / s_.block_size) * args_.stride_kv_block + (slot % s_.block_size) * args_.stride_kv_token];
}

void HostProblem::set_index(int64_t t, int64_t c, int64_t slot) {
  if (slot_is_valid(slot, num_slots())) fill_slot(slot);
  set_index_raw(t, c, slot);
}

DecodeArgs HostProblem::args() {
  DecodeArgs a = args_;
  a.q = q_.data();
  a.kv_cache = cache_.data();
  a.inv_scale = scales_.data(s_.inv_scale_dtype == DType::kFloat32);
  a.indices = indices_.data(s_.index_dtype == DType::kInt64);
  a.lens = lens_.data(s_.lens_dtype == DType::kInt64);
  a.attn_sink = sink_.empty() ? nullptr : sink_.data();
  a.lse = lse_.data();
  a.out = out_.data();
  return a;
}

}  // namespace swa_decode::testing
