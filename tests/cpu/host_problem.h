// A small decode problem in host memory for the CPU tests: every cache row and scale starts out
// poisoned (e4m3 NaN 0x7F, scale NaN) and only the slots a test names as entries get real data, so
// a read of anything docs/semantics.md calls "no entry" turns the result into NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "swa_decode/swa_decode.h"

namespace swa_decode::test {

inline uint16_t bf16_bits_truncated(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  return static_cast<uint16_t>(word >> 16);
}

struct ProblemShape {
  int64_t num_tokens = 2;
  int64_t num_heads = 3;
  int64_t head_dim = 8;
  int64_t num_blocks = 3;
  int64_t block_size = 4;
  int64_t window_size = 4;
  int64_t index_cols = 4;
  // Padding added to each stride (0 = contiguous); non-zero makes every tensor strided.
  int64_t q_head_pad = 0, q_token_pad = 0;
  int64_t out_head_pad = 0, out_token_pad = 0;
  int64_t kv_token_pad = 0, kv_block_pad = 0;
  int64_t index_pad = 0, lse_pad = 0;
  bool head_major_q = false;  // q laid out as [H, T, D] (stride_q_token < stride_q_head)
  DType inv_scale_dtype = DType::kBFloat16;
  DType index_dtype = DType::kInt32;
  DType lens_dtype = DType::kInt32;
};

inline constexpr uint8_t kPoisonCode = 0x7F;  // e4m3 NaN
inline constexpr uint16_t kOutSentinel = 0xFFFF;  // bf16 NaN, pre-filled into out

class HostProblem {
 public:
  HostProblem(const ProblemShape& shape, uint64_t seed) : s_(shape), rng_(seed) {
    const int64_t T = s_.num_tokens, H = s_.num_heads, D = s_.head_dim;
    if (s_.head_major_q) {
      stride_q_token_ = D + s_.q_head_pad;
      stride_q_head_ = T * stride_q_token_ + s_.q_token_pad;
    } else {
      stride_q_head_ = D + s_.q_head_pad;
      stride_q_token_ = H * stride_q_head_ + s_.q_token_pad;
    }
    const int64_t q_extent = (T > 0 ? T - 1 : 0) * stride_q_token_ + (H - 1) * stride_q_head_ + D;
    q_.assign(static_cast<size_t>(q_extent), 0);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) q_[t * stride_q_token_ + h * stride_q_head_ + d] = bf16_bits_truncated(normal(rng_));

    stride_kv_token_ = D + s_.kv_token_pad;
    stride_kv_block_ = s_.block_size * stride_kv_token_ + s_.kv_block_pad;
    cache_.assign(static_cast<size_t>(s_.num_blocks * stride_kv_block_), kPoisonCode);
    const int64_t S = num_slots();
    scale_bf16_.assign(static_cast<size_t>(S), 0x7FC0);
    scale_f32_.assign(static_cast<size_t>(S), std::numeric_limits<float>::quiet_NaN());
    filled_.assign(static_cast<size_t>(S), false);

    stride_indices_ = s_.index_cols + s_.index_pad;
    idx32_.assign(static_cast<size_t>(T * stride_indices_), -1);
    idx64_.assign(static_cast<size_t>(T * stride_indices_), -1);
    lens32_.assign(static_cast<size_t>(T), 0);
    lens64_.assign(static_cast<size_t>(T), 0);

    stride_out_head_ = D + s_.out_head_pad;
    stride_out_token_ = H * stride_out_head_ + s_.out_token_pad;
    out_.assign(static_cast<size_t>(T * stride_out_token_), kOutSentinel);
    stride_lse_ = H + s_.lse_pad;
    lse_.assign(static_cast<size_t>(T * stride_lse_), std::numeric_limits<float>::quiet_NaN());
  }

  int64_t num_slots() const { return s_.num_blocks * s_.block_size; }
  const ProblemShape& shape() const { return s_; }

  // Gives `slot` a real row (random finite e4m3 codes with |value| <= 7.5) and a scale in [0.5, 2].
  void fill_slot(int64_t slot) {
    if (filled_[slot]) return;
    filled_[slot] = true;
    std::uniform_int_distribution<int> byte(0, 255);
    for (int64_t d = 0; d < s_.head_dim; ++d) {
      int code;
      do code = byte(rng_); while ((code & 0x78) > 0x48);  // exponent <= 9: |value| <= 7.5
      row(slot)[d] = static_cast<uint8_t>(code);
    }
    std::uniform_real_distribution<float> scale(0.5f, 2.0f);
    set_scale(slot, scale(rng_));
  }
  void set_row(int64_t slot, const std::vector<uint8_t>& codes, float inv_scale) {
    filled_[slot] = true;
    for (int64_t d = 0; d < s_.head_dim; ++d) row(slot)[d] = codes[d % codes.size()];
    set_scale(slot, inv_scale);
  }
  // Stores bf16(value) in both scale tensors, so bf16 and fp32 scales give the same result.
  void set_scale(int64_t slot, float value) {
    scale_bf16_[slot] = bf16_bits_truncated(value);
    uint32_t word = static_cast<uint32_t>(scale_bf16_[slot]) << 16;
    std::memcpy(&scale_f32_[slot], &word, sizeof(float));
  }
  uint8_t* row(int64_t slot) {
    return &cache_[(slot / s_.block_size) * stride_kv_block_ + (slot % s_.block_size) * stride_kv_token_];
  }

  // Writes an index without filling its row (use for ids that must never be read).
  void set_index_raw(int64_t t, int64_t c, int64_t id) {
    idx64_[t * stride_indices_ + c] = id;
    idx32_[t * stride_indices_ + c] = static_cast<int32_t>(id);
  }
  // Writes a slot id and fills the slot's row if the id is in range.
  void set_index(int64_t t, int64_t c, int64_t slot) {
    if (slot >= 0 && slot < num_slots()) fill_slot(slot);
    set_index_raw(t, c, slot);
  }
  void set_len(int64_t t, int64_t len) {
    lens64_[t] = len;
    lens32_[t] = static_cast<int32_t>(len);
  }
  void set_q(int64_t t, int64_t h, int64_t d, float value) {
    q_[t * stride_q_token_ + h * stride_q_head_ + d] = bf16_bits_truncated(value);
  }
  void set_sink(std::vector<float> sink) { sink_ = std::move(sink); }

  DecodeArgs args() {
    DecodeArgs a;
    a.num_tokens = s_.num_tokens;
    a.num_heads = s_.num_heads;
    a.head_dim = s_.head_dim;
    a.num_blocks = s_.num_blocks;
    a.block_size = s_.block_size;
    a.window_size = s_.window_size;
    a.scale = 1.0f / std::sqrt(static_cast<float>(s_.head_dim));
    a.q = q_.data();
    a.stride_q_token = stride_q_token_;
    a.stride_q_head = stride_q_head_;
    a.kv_cache = cache_.data();
    a.stride_kv_block = stride_kv_block_;
    a.stride_kv_token = stride_kv_token_;
    a.inv_scale_dtype = s_.inv_scale_dtype;
    a.inv_scale = s_.inv_scale_dtype == DType::kFloat32 ? static_cast<const void*>(scale_f32_.data())
                                                        : static_cast<const void*>(scale_bf16_.data());
    a.num_scales = num_slots();
    a.index_dtype = s_.index_dtype;
    a.indices = s_.index_dtype == DType::kInt64 ? static_cast<const void*>(idx64_.data())
                                                : static_cast<const void*>(idx32_.data());
    a.index_cols = s_.index_cols;
    a.stride_indices_token = stride_indices_;
    a.lens_dtype = s_.lens_dtype;
    a.lens = s_.lens_dtype == DType::kInt64 ? static_cast<const void*>(lens64_.data())
                                            : static_cast<const void*>(lens32_.data());
    a.attn_sink = sink_.empty() ? nullptr : sink_.data();
    a.lse = lse_.data();
    a.stride_lse_token = stride_lse_;
    a.out = out_.data();
    a.stride_out_token = stride_out_token_;
    a.stride_out_head = stride_out_head_;
    a.backend = Backend::kCpu;
    return a;
  }

  uint16_t out_bits(int64_t t, int64_t h, int64_t d) const {
    return out_[t * stride_out_token_ + h * stride_out_head_ + d];
  }
  float lse(int64_t t, int64_t h) const { return lse_[t * stride_lse_ + h]; }
  const std::vector<uint16_t>& out_buffer() const { return out_; }
  const std::vector<float>& lse_buffer() const { return lse_; }
  std::mt19937_64& rng() { return rng_; }

 private:
  ProblemShape s_;
  std::mt19937_64 rng_;
  int64_t stride_q_token_ = 0, stride_q_head_ = 0;
  int64_t stride_kv_token_ = 0, stride_kv_block_ = 0;
  int64_t stride_indices_ = 0, stride_lse_ = 0;
  int64_t stride_out_token_ = 0, stride_out_head_ = 0;
  std::vector<uint16_t> q_;
  std::vector<uint8_t> cache_;
  std::vector<uint16_t> scale_bf16_;
  std::vector<float> scale_f32_;
  std::vector<bool> filled_;
  std::vector<int32_t> idx32_;
  std::vector<int64_t> idx64_;
  std::vector<int32_t> lens32_;
  std::vector<int64_t> lens64_;
  std::vector<float> sink_;
  std::vector<uint16_t> out_;
  std::vector<float> lse_;
};

}  // namespace swa_decode::test
