#include "testing/batch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "src/common/window_rule.h"
#include "src/reference/reference.h"
#include "testing/host_numerics.h"

namespace swa_decode::testing {
namespace {

constexpr int64_t kNoEntry = -1;

void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument("make_batch: " + message);
}

BatchOptions resolve(BatchOptions o) {
  require(o.num_tokens >= 0 && o.num_heads >= 1 && o.head_dim >= 1 && o.window_size >= 1 &&
              o.block_size >= 1 && o.max_context >= 1,
          "shapes must be positive (num_tokens may be 0)");
  if (o.index_cols == 0) o.index_cols = o.window_size;
  if (o.kv_row_stride == 0) o.kv_row_stride = o.head_dim;
  if (o.q_head_major) {
    if (o.q_token_stride == 0) o.q_token_stride = o.head_dim;
    if (o.q_head_stride == 0) o.q_head_stride = o.num_tokens * o.q_token_stride;
  } else {
    if (o.q_head_stride == 0) o.q_head_stride = o.head_dim;
    if (o.q_token_stride == 0) o.q_token_stride = o.num_heads * o.q_head_stride;
  }
  if (o.out_head_stride == 0) o.out_head_stride = o.head_dim;
  if (o.out_token_stride == 0) o.out_token_stride = o.num_heads * o.out_head_stride;
  if (o.lse_token_stride == 0) o.lse_token_stride = o.num_heads;
  if (o.scale == 0.0f) o.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(o.head_dim)));
  require(o.index_cols >= o.window_size, "index_cols must be >= window_size");
  require(o.kv_row_stride >= o.head_dim, "kv_row_stride must be >= head_dim");
  require(o.kv_block_pad >= 0, "kv_block_pad must be >= 0");
  if (o.q_head_major) {
    require(o.q_token_stride >= o.head_dim && o.q_head_stride >= o.num_tokens * o.q_token_stride,
            "head-major q strides must cover [T, D]");
  } else {
    require(o.q_head_stride >= o.head_dim && o.q_token_stride >= o.num_heads * o.q_head_stride,
            "q strides must cover [H, D]");
  }
  require(o.out_head_stride >= o.head_dim && o.out_token_stride >= o.num_heads * o.out_head_stride,
          "out strides must cover [H, D]");
  require(o.lse_token_stride >= o.num_heads, "lse_token_stride must be >= num_heads");
  require(o.context_lens.empty() || static_cast<int64_t>(o.context_lens.size()) == o.num_tokens,
          "context_lens must be empty or hold num_tokens values");
  require(o.lens.empty() || static_cast<int64_t>(o.lens.size()) == o.num_tokens,
          "lens must be empty or hold num_tokens values");
  require(o.sinks.empty() || static_cast<int64_t>(o.sinks.size()) == o.num_heads,
          "sinks must be empty or hold num_heads values");
  for (int64_t len : o.context_lens) require(len >= 1, "context lengths must be >= 1");
  return o;
}

// Ids that name no cache row. Some are chosen to catch specific bugs: num_slots (off by one),
// INT32_MAX / INT32_MIN (overflow when scaled to a byte offset), and for int64 indices ids whose
// low 32 bits are a valid slot, 2^32 + slot and 2^40 + slot (a kernel reading int64 as int32, or
// narrowing an id before the range check, would dereference them).
int64_t out_of_range_id(Rng& rng, int64_t num_slots, DType index_dtype) {
  const int64_t i32_max = std::numeric_limits<int32_t>::max();
  const int64_t i32_min = std::numeric_limits<int32_t>::min();
  const int choices = index_dtype == DType::kInt64 ? 10 : 6;
  switch (rng.uniform_int(0, choices - 1)) {
    case 0: return num_slots;
    case 1: return num_slots + rng.uniform_int(1, 1000);
    case 2: return i32_max;
    case 3: return -2;
    case 4: return -2 - rng.uniform_int(0, 1000);
    case 5: return i32_min;
    case 6: return std::numeric_limits<int64_t>::max();
    case 7: return std::numeric_limits<int64_t>::min();
    case 8: return (int64_t{1} << 32) + rng.uniform_int(0, num_slots - 1);
    default: return (int64_t{1} << 40) + rng.uniform_int(0, num_slots - 1);
  }
}

// Columns of token t that may hold entries (src/common/window_rule.h, the kernels' rule).
int64_t window_columns(const HostBatch& b, int64_t t) {
  return columns_in_window(b.lens[t], static_cast<int32_t>(b.window_size));
}

// Elements of q's storage: the last (t, h) row ends before T * q_token_stride (token-major) or
// H * q_head_stride (head-major), whichever layout the strides describe.
int64_t q_elements(const BatchOptions& o) {
  return o.num_tokens == 0 ? 0 : std::max(o.num_tokens * o.q_token_stride, o.num_heads * o.q_head_stride);
}

// Index into live_slots, or -1.
int64_t live_index(const HostBatch& b, int64_t slot) {
  const auto it = std::lower_bound(b.live_slots.begin(), b.live_slots.end(), slot);
  return (it != b.live_slots.end() && *it == slot) ? it - b.live_slots.begin() : -1;
}

void copy_shape(const BatchOptions& o, HostBatch& b) {
  b.options = o;
  b.num_tokens = o.num_tokens;
  b.num_heads = o.num_heads;
  b.head_dim = o.head_dim;
  b.window_size = o.window_size;
  b.index_cols = o.index_cols;
  b.index_stride = o.index_cols + o.index_row_pad;
  b.block_size = o.block_size;
  b.kv_row_stride = o.kv_row_stride;
  b.kv_block_stride = o.block_size * o.kv_row_stride + o.kv_block_pad;
  b.q_head_stride = o.q_head_stride;
  b.q_token_stride = o.q_token_stride;
  b.out_head_stride = o.out_head_stride;
  b.out_token_stride = o.out_token_stride;
  b.lse_token_stride = o.lse_token_stride;
  b.scale = o.scale;
}

// Per token: count of valid entries and the largest |k| they dequantize to (the output is a
// weighted mean of those rows, so this bounds |out| and scales the error tolerance).
void summarize_valid_entries(HostBatch& b) {
  // |e4m3| grows with the low 7 bits of the code, so the row's largest magnitude is its largest
  // (code & 0x7F); the live rows hold no NaN codes.
  std::vector<double> row_amax(b.live_slots.size());
  for (size_t i = 0; i < b.live_slots.size(); ++i) {
    uint8_t max_code = 0;
    for (int64_t d = 0; d < b.head_dim; ++d) {
      max_code = std::max<uint8_t>(max_code, b.live_rows[i * b.head_dim + d] & 0x7F);
    }
    row_amax[i] = e4m3_to_double(max_code) * b.live_scales[i];
  }
  b.valid_entries.assign(b.num_tokens, 0);
  b.token_kmax.assign(b.num_tokens, 0.0);
  for (int64_t t = 0; t < b.num_tokens; ++t) {
    const int64_t cols = window_columns(b, t);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t id = b.indices[t * b.index_stride + c];
      if (!slot_is_valid(id, b.num_slots)) continue;
      b.valid_entries[t] += 1;
      b.token_kmax[t] = std::max(b.token_kmax[t], row_amax[live_index(b, id)]);
    }
  }
}

}  // namespace

int64_t HostBatch::total_valid_entries(int64_t token_begin, int64_t token_count) const {
  return std::accumulate(valid_entries.begin() + token_begin,
                         valid_entries.begin() + token_begin + token_count, int64_t{0});
}

int64_t HostBatch::floor_bytes(int64_t token_begin, int64_t token_count) const {
  const int64_t q_and_out = 2 * token_count * num_heads * head_dim * 2;
  return q_and_out +
         total_valid_entries(token_begin, token_count) * (head_dim + scale_bytes() + index_bytes());
}

HostBatch make_batch(const BatchOptions& raw_options) {
  const BatchOptions o = resolve(raw_options);
  HostBatch b;
  copy_shape(o, b);
  Rng rng(o.seed);
  const int64_t T = o.num_tokens, W = o.window_size, bs = o.block_size;

  // Context lengths and the pool: every request owns ceil(len / 256) blocks, scattered at random.
  std::vector<int64_t> context(T);
  for (int64_t t = 0; t < T; ++t) {
    context[t] = o.context_lens.empty() ? rng.uniform_int(1, o.max_context) : o.context_lens[t];
  }
  std::vector<int64_t> first_block(T + 1, 0);
  for (int64_t t = 0; t < T; ++t) first_block[t + 1] = first_block[t] + (context[t] + bs - 1) / bs;
  const int64_t used_blocks = first_block[T];
  const int64_t spare = std::max<int64_t>(1, o.spare_blocks >= 0 ? o.spare_blocks : used_blocks / 8 + 4);
  b.num_blocks = used_blocks + spare;
  b.num_slots = b.num_blocks * bs;
  std::vector<int64_t> block_of(b.num_blocks);
  std::iota(block_of.begin(), block_of.end(), int64_t{0});
  for (int64_t i = b.num_blocks - 1; i > 0; --i) std::swap(block_of[i], block_of[rng.uniform_int(0, i)]);
  // Slots of the spare blocks belong to no request: garbage ids point there, always poisoned
  // unless a valid entry (a lens override past the window) happens to name one.
  auto spare_slot = [&] {
    return block_of[used_blocks + rng.uniform_int(0, spare - 1)] * bs + rng.uniform_int(0, bs - 1);
  };

  // Index rows: the last min(context, W) positions, oldest first, then padding.
  b.indices.assign(T * b.index_stride, kNoEntry);
  b.lens.assign(T, 0);
  for (int64_t t = 0; t < T; ++t) {
    int64_t* row = &b.indices[t * b.index_stride];
    const int64_t n_window = std::min(context[t], W);
    for (int64_t c = 0; c < n_window; ++c) {
      const int64_t pos = context[t] - n_window + c;
      row[c] = block_of[first_block[t] + pos / bs] * bs + pos % bs;
    }
    for (int64_t c = n_window; c < b.index_cols; ++c) row[c] = o.garbage_past_window ? spare_slot() : kNoEntry;
    for (int64_t c = b.index_cols; c < b.index_stride; ++c) row[c] = spare_slot();
    const std::vector<int64_t> original(row, row + n_window);
    for (int64_t c = 0; c < n_window; ++c) {
      const double r = rng.uniform();
      if (r < o.hole_fraction) {
        row[c] = kNoEntry;
      } else if (r < o.hole_fraction + o.duplicate_fraction) {
        row[c] = original[rng.uniform_int(0, n_window - 1)];
      } else if (r < o.hole_fraction + o.duplicate_fraction + o.out_of_range_fraction) {
        row[c] = out_of_range_id(rng, b.num_slots, o.index_dtype);
      }
    }
    if (rng.uniform() < o.all_invalid_fraction) std::fill(row, row + b.index_cols, kNoEntry);
    b.lens[t] = o.lens.empty() ? n_window : o.lens[t];
  }

  // Live slots: exactly those a valid entry names. Everything else stays poison.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t cols = window_columns(b, t);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t id = b.indices[t * b.index_stride + c];
      if (slot_is_valid(id, b.num_slots)) b.live_slots.push_back(id);
    }
  }
  std::sort(b.live_slots.begin(), b.live_slots.end());
  b.live_slots.erase(std::unique(b.live_slots.begin(), b.live_slots.end()), b.live_slots.end());
  // A broken window rule would name rows outside the pool; writing them would corrupt memory.
  require(b.live_slots.empty() || (b.live_slots.front() >= 0 && b.live_slots.back() < b.num_slots),
          "the window rule named a slot outside the pool [0, " + std::to_string(b.num_slots) + ")");

  // Live rows as an amax / 448 per-token quantizer leaves them: codes spread like a normal with
  // amax near 448, inv_scale log-uniform in [8e-3, 4e-2] so dequantized k has a standard
  // deviation of ~1..5 and the scores q.k * D^-0.5 spread over a few units, as in the model.
  const uint8_t* e4m3_table = normal_e4m3_table();
  const int64_t n_live = static_cast<int64_t>(b.live_slots.size());
  b.live_rows.resize(n_live * o.head_dim);
  b.live_scales.resize(n_live);
  for (int64_t i = 0; i < n_live; ++i) {
    const double inv_scale = o.inv_scale_magnitude *
                             std::exp(std::log(8e-3) + rng.uniform() * (std::log(4e-2) - std::log(8e-3)));
    b.live_scales[i] = o.inv_scale_dtype == DType::kBFloat16 ? round_to_bf16(static_cast<float>(inv_scale))
                                                              : static_cast<float>(inv_scale);
    uint8_t* codes = &b.live_rows[i * o.head_dim];
    for (int64_t d = 0; d < o.head_dim; d += 4) {
      const uint64_t bits = rng.next_u64();
      for (int64_t k = 0; k < 4 && d + k < o.head_dim; ++k) codes[d + k] = e4m3_table[(bits >> (16 * k)) & 0xFFFF];
    }
  }

  // q ~ N(0, 1) in bf16; the padding between heads and tokens is NaN and must never be read.
  const uint16_t* bf16_table = normal_bf16_table();
  b.q.assign(q_elements(o), kBf16PoisonBits);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < o.num_heads; ++h) {
      uint16_t* q_row = &b.q[t * o.q_token_stride + h * o.q_head_stride];
      const double magnitude = o.q_magnitudes.empty() ? 1.0 : o.q_magnitudes[h % o.q_magnitudes.size()];
      for (int64_t d = 0; d < o.head_dim; d += 4) {
        const uint64_t bits = rng.next_u64();
        for (int64_t k = 0; k < 4 && d + k < o.head_dim; ++k) {
          const uint16_t code = bf16_table[(bits >> (16 * k)) & 0xFFFF];
          q_row[d + k] = magnitude == 1.0 ? code
                                          : float_to_bf16_bits(static_cast<float>(reference::bf16_to_float(code) * magnitude));
        }
      }
    }
  }

  if (!o.sinks.empty()) {
    b.sinks = o.sinks;
  } else if (o.with_sink) {
    b.sinks.resize(o.num_heads);
    for (auto& sink : b.sinks) sink = static_cast<float>(-2.0 + 8.0 * rng.uniform());
  }
  summarize_valid_entries(b);
  return b;
}

HostBatch select_tokens(const HostBatch& batch, const std::vector<int64_t>& tokens) {
  HostBatch s;
  BatchOptions o = batch.options;
  o.num_tokens = static_cast<int64_t>(tokens.size());
  o.context_lens.clear();
  o.lens.clear();
  if (o.q_head_major) {  // the head stride spans the tokens: keep its padding, drop the tokens left out
    o.q_head_stride = o.num_tokens * o.q_token_stride + (batch.q_head_stride - batch.num_tokens * batch.q_token_stride);
  }
  copy_shape(o, s);

  // Every in-range id the selected rows hold (window, padding and stride gaps alike), renumbered
  // in increasing order so live_slots stays sorted.
  std::vector<int64_t> ids;
  for (int64_t t : tokens) {
    for (int64_t c = 0; c < batch.index_stride; ++c) {
      const int64_t id = batch.indices[t * batch.index_stride + c];
      if (slot_is_valid(id, batch.num_slots)) ids.push_back(id);
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  s.num_blocks = std::max<int64_t>(1, (static_cast<int64_t>(ids.size()) + s.block_size - 1) / s.block_size);
  s.num_slots = s.num_blocks * s.block_size;
  auto renumber = [&](int64_t id) -> int64_t {
    if (slot_is_valid(id, batch.num_slots)) return std::lower_bound(ids.begin(), ids.end(), id) - ids.begin();
    if (id >= batch.num_slots) return id - batch.num_slots + s.num_slots;  // stays out of range
    return id;  // negative ids are no entry either way
  };

  for (size_t new_id = 0; new_id < ids.size(); ++new_id) {
    const int64_t i = live_index(batch, ids[new_id]);
    if (i < 0) continue;
    s.live_slots.push_back(static_cast<int64_t>(new_id));
    s.live_rows.insert(s.live_rows.end(), batch.live_rows.begin() + i * batch.head_dim,
                       batch.live_rows.begin() + (i + 1) * batch.head_dim);
    s.live_scales.push_back(batch.live_scales[i]);
  }
  s.q.assign(q_elements(o), kBf16PoisonBits);
  for (int64_t i = 0; i < s.num_tokens; ++i) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      const auto from = batch.q.begin() + tokens[i] * batch.q_token_stride + h * batch.q_head_stride;
      std::copy(from, from + s.head_dim, s.q.begin() + i * s.q_token_stride + h * s.q_head_stride);
    }
  }
  for (int64_t t : tokens) {
    for (int64_t c = 0; c < batch.index_stride; ++c) {
      s.indices.push_back(renumber(batch.indices[t * batch.index_stride + c]));
    }
    s.lens.push_back(batch.lens[t]);
    s.valid_entries.push_back(batch.valid_entries[t]);
    s.token_kmax.push_back(batch.token_kmax[t]);
  }
  s.sinks = batch.sinks;
  return s;
}

std::vector<uint8_t> encode_ints(const std::vector<int64_t>& values, DType dtype) {
  std::vector<uint8_t> bytes;
  if (dtype == DType::kInt32) {
    bytes.resize(values.size() * 4);
    for (size_t i = 0; i < values.size(); ++i) {
      const int32_t v = static_cast<int32_t>(values[i]);  // generated ids fit int32 for int32 batches
      std::memcpy(&bytes[i * 4], &v, 4);
    }
  } else {
    bytes.resize(values.size() * 8);
    std::memcpy(bytes.data(), values.data(), bytes.size());
  }
  return bytes;
}

std::vector<uint8_t> dense_inv_scale(const HostBatch& batch) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> bytes(batch.num_slots * batch.scale_bytes());
  for (int64_t slot = 0, i = 0; slot < batch.num_slots; ++slot) {
    float value = nan;
    if (i < static_cast<int64_t>(batch.live_slots.size()) && batch.live_slots[i] == slot) {
      value = batch.live_scales[i++];
    }
    if (batch.scale_bytes() == 4) {
      std::memcpy(&bytes[slot * 4], &value, 4);
    } else {
      const uint16_t bits = float_to_bf16_bits(value);
      std::memcpy(&bytes[slot * 2], &bits, 2);
    }
  }
  return bytes;
}

HostTensors materialize_host(const HostBatch& batch) {
  HostTensors h;
  h.kv_cache.assign(batch.kv_cache_bytes(), kE4m3NaN);
  for (size_t i = 0; i < batch.live_slots.size(); ++i) {
    std::memcpy(&h.kv_cache[batch.kv_row_offset(batch.live_slots[i])], &batch.live_rows[i * batch.head_dim],
                batch.head_dim);
  }
  h.inv_scale = dense_inv_scale(batch);
  h.indices = encode_ints(batch.indices, batch.options.index_dtype);
  h.lens = encode_ints(batch.lens, batch.options.lens_dtype);
  h.out.assign(batch.num_tokens * batch.out_token_stride, kBf16PoisonBits);
  if (batch.options.with_lse) {
    h.lse.assign(batch.num_tokens * batch.lse_token_stride, std::numeric_limits<float>::quiet_NaN());
  }
  return h;
}

DecodeArgs batch_args(const HostBatch& batch, const TensorPointers& at, int64_t num_tokens, Backend backend,
                      CUstream_st* stream) {
  return DecodeArgs{
      .num_tokens = num_tokens,
      .num_heads = batch.num_heads,
      .head_dim = batch.head_dim,
      .num_blocks = batch.num_blocks,
      .block_size = batch.block_size,
      .window_size = batch.window_size,
      .scale = batch.scale,
      .q = at.q,
      .stride_q_token = batch.q_token_stride,
      .stride_q_head = batch.q_head_stride,
      .kv_cache = at.kv_cache,
      .stride_kv_block = batch.kv_block_stride,
      .stride_kv_token = batch.kv_row_stride,
      .inv_scale = at.inv_scale,
      .inv_scale_dtype = batch.options.inv_scale_dtype,
      .num_scales = batch.num_slots,
      .indices = at.indices,
      .index_dtype = batch.options.index_dtype,
      .index_cols = batch.index_cols,
      .stride_indices_token = batch.index_stride,
      .lens = at.lens,
      .lens_dtype = batch.options.lens_dtype,
      .attn_sink = at.attn_sink,
      .lse = at.lse,
      .stride_lse_token = batch.lse_token_stride,
      .out = at.out,
      .stride_out_token = batch.out_token_stride,
      .stride_out_head = batch.out_head_stride,
      .backend = backend,
      .stream = stream,
  };
}

DecodeArgs host_args(const HostBatch& batch, HostTensors& tensors) {
  const TensorPointers at{
      .q = batch.q.data(),
      .kv_cache = tensors.kv_cache.data(),
      .inv_scale = tensors.inv_scale.data(),
      .indices = tensors.indices.data(),
      .lens = tensors.lens.data(),
      .attn_sink = batch.sinks.empty() ? nullptr : batch.sinks.data(),
      .lse = tensors.lse.empty() ? nullptr : tensors.lse.data(),
      .out = tensors.out.data(),
  };
  return batch_args(batch, at, batch.num_tokens, Backend::kCpu, nullptr);
}

}  // namespace swa_decode::testing
