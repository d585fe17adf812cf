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
#include "testing/parallel_for.h"
#include "testing/strides.h"

namespace swa_decode::testing {
namespace {

constexpr int64_t kNoEntry = -1;
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
// The extra source draws from a stream of its own, so adding one leaves the window's data as it
// was for the same seed.
constexpr uint64_t kExtraStream = 0xE7A5'0C0D'E5EE'D001ull;
// Live rows are drawn in chunks of this many rows, chunk c from its own seed, so that the rows do
// not depend on how many threads drew them.
constexpr int64_t kRowsPerChunk = 4096;
// The largest |log2| of inv_scale_magnitude a batch with a kModel1 source takes: its scale bytes
// (120..122 before the shift) stay within UE8M0's finite 0..254, its RoPE values within bf16's range.
constexpr int kMaxModel1MagnitudeShift = 100;

void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument("make_batch: " + message);
}

// A kModel1 source's rules (docs/semantics.md, "Row formats") on the options that lay out its
// pool; `name` is "" for the window, "extra." for the extra source.
void require_model1_layout(const std::string& name, int64_t head_dim, int64_t kv_row_stride, int64_t kv_block_pad) {
  require(head_dim == kModel1HeadDim, "a kModel1 source needs head_dim " + std::to_string(kModel1HeadDim) + ", got " +
                                          std::to_string(head_dim));
  require(kv_row_stride == 0 || kv_row_stride == kModel1RowBytes,
          name + "kv_row_stride of a kModel1 source must be 0 or " + std::to_string(kModel1RowBytes));
  require(kv_block_pad >= 0 && kv_block_pad % kModel1RowBytes == 0,
          name + "kv_block_pad of a kModel1 source must be a non-negative multiple of " + std::to_string(kModel1RowBytes));
}

// A per-token (or per-head) option is empty or holds one value a token (head).
template <typename T>
void require_count(const std::vector<T>& values, int64_t count, const char* name, const char* what) {
  require(values.empty() || static_cast<int64_t>(values.size()) == count,
          std::string(name) + " must be empty or hold " + what + " values");
}

void resolve_extra(ExtraOptions& x, const BatchOptions& o) {
  require(x.compress_ratio >= 1 && x.top_k >= 0 && x.max_entries >= 0 && x.index_cols >= 0 && x.index_row_pad >= 0,
          "extra: compress_ratio must be >= 1 and top_k, max_entries, index_cols, index_row_pad >= 0");
  require_count(x.positions, o.num_tokens, "extra.positions", "num_tokens");
  require_count(x.lens, o.num_tokens, "extra.lens", "num_tokens");
  for (int64_t p : x.positions) require(p >= 0, "extra.positions must be >= 0");
  if (x.shares_window_cache) {
    require(o.window_pool_covers_context,
            "an extra source sharing the window's cache needs window_pool_covers_context (its entries are context positions)");
    x.block_size = o.block_size;
    x.kv_row_stride = o.kv_row_stride;
    x.kv_block_pad = o.kv_block_pad;
    x.inv_scale_dtype = o.inv_scale_dtype;
    x.format = o.kv_format;
  }
  if (x.format == KvFormat::kModel1) require_model1_layout("extra.", o.head_dim, x.kv_row_stride, x.kv_block_pad);
  if (x.kv_row_stride == 0) x.kv_row_stride = x.format == KvFormat::kModel1 ? kModel1RowBytes : o.head_dim;
  require(x.block_size >= 1, "extra.block_size must be >= 1");
  require(x.kv_row_stride >= o.head_dim, "extra.kv_row_stride must be >= head_dim");
  require(x.kv_block_pad >= 0, "extra.kv_block_pad must be >= 0");
}

BatchOptions resolve(BatchOptions o) {
  require(o.num_tokens >= 0 && o.num_heads >= 1 && o.head_dim >= 1 && o.window_size >= 1 &&
              o.block_size >= 1 && o.max_context >= 1,
          "shapes must be positive (num_tokens may be 0)");
  if (o.index_cols == 0) o.index_cols = o.window_size;
  const bool model1 = o.kv_format == KvFormat::kModel1 || (o.extra && o.extra->format == KvFormat::kModel1);
  if (o.kv_format == KvFormat::kModel1) require_model1_layout("", o.head_dim, o.kv_row_stride, o.kv_block_pad);
  if (o.kv_row_stride == 0) o.kv_row_stride = o.kv_format == KvFormat::kModel1 ? kModel1RowBytes : o.head_dim;
  // kModel1 scales are UE8M0 powers of two: the magnitude shifts them exactly or not at all.
  require(!model1 || (std::ldexp(1.0, std::ilogb(o.inv_scale_magnitude)) == o.inv_scale_magnitude &&
                      std::abs(std::ilogb(o.inv_scale_magnitude)) <= kMaxModel1MagnitudeShift),
          "inv_scale_magnitude of a batch with a kModel1 source must be 2^k with |k| <= " +
              std::to_string(kMaxModel1MagnitudeShift));
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
  require_count(o.context_lens, o.num_tokens, "context_lens", "num_tokens");
  require_count(o.lens, o.num_tokens, "lens", "num_tokens");
  require_count(o.sinks, o.num_heads, "sinks", "num_heads");
  for (int64_t len : o.context_lens) require(len >= 1, "context lengths must be >= 1");
  require(o.padding_row_fraction >= 0.0 && o.padding_row_fraction <= 1.0, "padding_row_fraction must be in [0, 1]");
  for (const auto& [t, h] : o.nan_q_heads) {
    require(t >= 0 && t < o.num_tokens && h >= 0 && h < o.num_heads, "nan_q_heads must name (token, head) pairs of the batch");
  }
  if (o.extra) resolve_extra(*o.extra, o);
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

// Elements of q's storage: the last (t, h) row ends before T * q_token_stride (token-major) or
// H * q_head_stride (head-major), whichever layout the strides describe.
int64_t q_elements(const BatchOptions& o) {
  return o.num_tokens == 0 ? 0 : std::max(o.num_tokens * o.q_token_stride, o.num_heads * o.q_head_stride);
}

// A source's shape, all but its pool's size (the generation decides that). kModel1 blocks are
// FlashMLA's padded ones (strides.h), kE4m3 blocks their rows.
HostSource source_shape(KvFormat format, int64_t head_dim, int64_t max_entries, int64_t index_cols,
                        int64_t index_row_pad, int64_t block_size, int64_t kv_row_stride, int64_t kv_block_pad) {
  HostSource s;
  s.head_dim = head_dim;
  s.format = format;
  s.max_entries = max_entries;
  s.index_cols = index_cols;
  s.index_stride = index_cols + index_row_pad;
  s.block_size = block_size;
  s.kv_row_stride = kv_row_stride;
  s.kv_block_stride = format == KvFormat::kModel1 ? model1_strides(block_size, kv_block_pad).group
                                                  : block_size * kv_row_stride + kv_block_pad;
  return s;
}

void copy_shape(const BatchOptions& o, HostBatch& b) {
  static_cast<HostSource&>(b) = source_shape(o.kv_format, o.head_dim, o.window_size, o.index_cols, o.index_row_pad,
                                             o.block_size, o.kv_row_stride, o.kv_block_pad);
  b.index_dtype = o.index_dtype;
  b.lens_dtype = o.lens_dtype;
  b.inv_scale_dtype = o.inv_scale_dtype;
  b.options = o;
  b.num_tokens = o.num_tokens;
  b.num_heads = o.num_heads;
  b.window_size = o.window_size;
  b.q_head_stride = o.q_head_stride;
  b.q_token_stride = o.q_token_stride;
  b.out_head_stride = o.out_head_stride;
  b.out_token_stride = o.out_token_stride;
  b.lse_token_stride = o.lse_token_stride;
  b.scale = o.scale;
}

// The extra source's shape once its entry counts are known (x.max_entries and x.index_cols resolved).
HostSource extra_shape(const ExtraOptions& x, const HostBatch& b) {
  HostSource s = source_shape(x.format, b.head_dim, x.max_entries, x.index_cols, x.index_row_pad, x.block_size,
                              x.kv_row_stride, x.kv_block_pad);
  s.index_dtype = x.index_dtype;
  s.lens_dtype = x.lens_dtype;
  s.inv_scale_dtype = x.inv_scale_dtype;
  s.shares_window_cache = x.shares_window_cache;
  if (s.shares_window_cache) {
    s.num_blocks = b.num_blocks;
    s.num_slots = b.num_slots;
  }
  return s;
}

// A pool's blocks, each request owning a contiguous run of them, scattered over the pool at
// random; the spare blocks belong to no request (garbage ids point there, always poisoned unless
// a valid entry of a lens override happens to name one).
struct ScatteredPool {
  int64_t block_size = 1;
  std::vector<int64_t> first_block;  // [T + 1]: request t owns logical blocks [first_block[t], first_block[t + 1])
  std::vector<int64_t> block_of;     // logical -> physical block
  int64_t used_blocks = 0, spare = 0;

  ScatteredPool(const std::vector<int64_t>& owned, int64_t bs, int64_t spare_blocks, Rng& rng) : block_size(bs) {
    first_block.assign(owned.size() + 1, 0);
    for (size_t t = 0; t < owned.size(); ++t) first_block[t + 1] = first_block[t] + owned[t];
    used_blocks = first_block.back();
    spare = std::max<int64_t>(1, spare_blocks >= 0 ? spare_blocks : used_blocks / 8 + 4);
    block_of.resize(used_blocks + spare);
    std::iota(block_of.begin(), block_of.end(), int64_t{0});
    for (int64_t i = num_blocks() - 1; i > 0; --i) std::swap(block_of[i], block_of[rng.uniform_int(0, i)]);
  }
  int64_t num_blocks() const { return used_blocks + spare; }
  int64_t slot(int64_t t, int64_t logical_position) const {
    return block_of[first_block[t] + logical_position / block_size] * block_size + logical_position % block_size;
  }
  int64_t spare_slot(Rng& rng) const {
    return block_of[used_blocks + rng.uniform_int(0, spare - 1)] * block_size + rng.uniform_int(0, block_size - 1);
  }
};

// One live row as an amax / 448 per-token quantizer leaves it: codes spread like a normal with
// amax near 448, inv_scale log-uniform in [8e-3, 4e-2] so dequantized k has a standard deviation
// of ~1..5 and the scores q.k * D^-0.5 spread over a few units, as in the model.
void draw_e4m3_row(Rng& rng, double inv_scale_magnitude, DType inv_scale_dtype, int64_t head_dim, uint8_t* codes,
                   float& scale, double& amax) {
  const uint8_t* e4m3_table = normal_e4m3_table();
  const double inv_scale =
      inv_scale_magnitude * std::exp(std::log(8e-3) + rng.uniform() * (std::log(4e-2) - std::log(8e-3)));
  scale = inv_scale_dtype == DType::kBFloat16 ? round_to_bf16(static_cast<float>(inv_scale)) : static_cast<float>(inv_scale);
  for (int64_t d = 0; d < head_dim; d += 4) {
    const uint64_t bits = rng.next_u64();
    for (int64_t k = 0; k < 4 && d + k < head_dim; ++k) codes[d + k] = e4m3_table[(bits >> (16 * k)) & 0xFFFF];
  }
  // |e4m3| grows with the low 7 bits of the code, so the row's largest magnitude is its largest
  // (code & 0x7F); live rows hold no NaN codes.
  uint8_t max_code = 0;
  for (int64_t d = 0; d < head_dim; ++d) max_code = std::max<uint8_t>(max_code, codes[d] & 0x7F);
  amax = e4m3_to_double(max_code) * scale;
}

// One live kModel1 row (576 bytes, then its 8-byte scale row) as the engines' quantizer leaves it
// (FlashMLA's tests/quant.py: a power-of-two scale per 64 dims): in each of the 7 groups of e4m3
// dims, codes spread like a normal with amax near 448 under a UE8M0 scale of 2^-7..2^-5, then 64
// bf16 RoPE values of the same spread, so the row dequantizes to a standard deviation of ~1..4 as
// a kE4m3 row does. inv_scale_magnitude (2^k) adds k to every scale byte and multiplies every RoPE
// value, both exactly. The scale row's pad byte stays poison (0xFF): no reader may use it.
void draw_model1_row(Rng& rng, double inv_scale_magnitude, uint8_t* bytes, double& amax) {
  const uint8_t* e4m3_table = normal_e4m3_table();
  const uint16_t* bf16_table = normal_bf16_table();
  const int shift = std::ilogb(inv_scale_magnitude);
  constexpr int64_t kGroupDims = kModel1E4m3Dims / kModel1ScalesPerRow;  // 64
  uint8_t* scale_row = bytes + kModel1RowBytes;
  amax = 0.0;
  for (int64_t g = 0; g < kModel1ScalesPerRow; ++g) {
    const int64_t scale_code = 127 + rng.uniform_int(-7, -5) + shift;
    scale_row[g] = static_cast<uint8_t>(scale_code);
    uint8_t max_code = 0;  // as in draw_e4m3_row: the largest |e4m3| has the largest (code & 0x7F)
    for (int64_t d = g * kGroupDims; d < (g + 1) * kGroupDims; d += 4) {
      const uint64_t bits = rng.next_u64();
      for (int64_t k = 0; k < 4; ++k) {
        bytes[d + k] = e4m3_table[(bits >> (16 * k)) & 0xFFFF];
        max_code = std::max<uint8_t>(max_code, bytes[d + k] & 0x7F);
      }
    }
    amax = std::max(amax, std::ldexp(e4m3_to_double(max_code), static_cast<int>(scale_code) - 127));
  }
  scale_row[kModel1ScalesPerRow] = kUe8m0NaN;
  const double rope_scale = std::ldexp(1.0, static_cast<int>(rng.uniform_int(0, 2)) + shift);  // 128 * 2^(-7..-5)
  for (int64_t i = 0; i < kModel1RopeDims; i += 4) {
    const uint64_t bits = rng.next_u64();
    for (int64_t k = 0; k < 4; ++k) {
      const double value = reference::bf16_to_float(bf16_table[(bits >> (16 * k)) & 0xFFFF]) * rope_scale;
      const uint16_t value_bits = float_to_bf16_bits(static_cast<float>(value));  // exact: a power-of-two multiple
      std::memcpy(bytes + kModel1E4m3Dims + 2 * (i + k), &value_bits, sizeof(value_bits));
      amax = std::max(amax, std::fabs(value));
    }
  }
}

void draw_row(Rng& rng, double inv_scale_magnitude, HostSource& s, size_t i) {
  uint8_t* bytes = &s.live_rows[i * s.live_row_bytes()];
  if (s.is_model1()) {
    s.live_scales[i] = 1.0f;
    draw_model1_row(rng, inv_scale_magnitude, bytes, s.live_amax[i]);
  } else {
    draw_e4m3_row(rng, inv_scale_magnitude, s.inv_scale_dtype, s.head_dim, bytes, s.live_scales[i], s.live_amax[i]);
  }
}

void size_live_rows(HostSource& s) {
  const size_t n = s.live_slots.size();
  s.live_rows.resize(n * s.live_row_bytes());
  s.live_scales.resize(n);
  s.live_amax.resize(n);
}

// Rows in slot order from one stream (the window's, as it always was for a seed).
void draw_rows_in_order(HostSource& s, Rng& rng, double inv_scale_magnitude) {
  size_live_rows(s);
  for (size_t i = 0; i < s.live_slots.size(); ++i) draw_row(rng, inv_scale_magnitude, s, i);
}

// Rows in chunks from per-chunk streams, on every core: a C128A layer at a 1M context holds
// ~8192 live rows a token, 16 GiB at T = 2048 x 2 input sets.
void draw_rows_in_chunks(HostSource& s, uint64_t seed, double inv_scale_magnitude) {
  size_live_rows(s);
  const int64_t n = static_cast<int64_t>(s.live_slots.size());
  parallel_for(n, kRowsPerChunk, host_threads(), [&](int64_t begin, int64_t end) {
    Rng rng(seed ^ (static_cast<uint64_t>(begin / kRowsPerChunk) * 0xD1B54A32D192ED03ull));
    for (int64_t i = begin; i < end; ++i) draw_row(rng, inv_scale_magnitude, s, static_cast<size_t>(i));
  });
}

// Appends the slots of `source`'s valid entries to `slots`.
void collect_valid_slots(const HostSource& source, int64_t num_tokens, std::vector<int64_t>& slots) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t cols = source.columns(t);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t id = source.indices[t * source.index_stride + c];
      if (slot_is_valid(id, source.num_slots)) slots.push_back(id);
    }
  }
}

// encode_ints narrows int32 ids and lengths: a value past int32 would change meaning on upload.
void require_int32_values(const std::vector<int64_t>& values, DType dtype, const char* name) {
  if (dtype != DType::kInt32) return;
  for (int64_t v : values) {
    require(v >= std::numeric_limits<int32_t>::min() && v <= kInt32Max,
            std::string(name) + " are int32 but one is " + std::to_string(v));
  }
}

void sort_unique(std::vector<int64_t>& values) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
}

// Per token and source: its valid entries; per token over both: |J_t| and the largest |k| they
// dequantize to (the output is a weighted mean of those rows, so this bounds |out| and scales the
// error tolerance).
void summarize_valid_entries(HostBatch& b) {
  b.entries.assign(b.num_tokens, 0);
  if (b.extra) b.extra->entries.assign(b.num_tokens, 0);
  b.valid_entries.assign(b.num_tokens, 0);
  b.token_kmax.assign(b.num_tokens, 0.0);
  parallel_for(b.num_tokens, 64, host_threads(), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (HostSource* source : {static_cast<HostSource*>(&b), b.extra ? &*b.extra : nullptr}) {
        if (source == nullptr) continue;
        const HostSource& rows = b.rows_of(*source);
        const int64_t cols = source->columns(t);
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t id = source->indices[t * source->index_stride + c];
          if (!slot_is_valid(id, source->num_slots)) continue;
          source->entries[t] += 1;
          b.token_kmax[t] = std::max(b.token_kmax[t], rows.live_amax[rows.live_index(id)]);
        }
        b.valid_entries[t] += source->entries[t];
      }
    }
  });
}

// Per token: the extra source's compressed positions and entries (ExtraOptions).
struct ExtraDraw {
  std::vector<int64_t> positions, entries;  // per token
};

ExtraDraw draw_extra_counts(const ExtraOptions& x, const std::vector<int64_t>& context) {
  ExtraDraw d;
  const int64_t T = static_cast<int64_t>(context.size());
  for (int64_t t = 0; t < T; ++t) {
    const int64_t positions = x.positions.empty() ? context[t] / x.compress_ratio : x.positions[t];
    if (x.shares_window_cache) {
      require(positions == 0 || (positions - 1) * x.compress_ratio < context[t],
              "extra.positions of a source sharing the window's cache must lie in the context");
    }
    d.positions.push_back(positions);
    d.entries.push_back(x.top_k > 0 ? std::min(x.top_k, positions) : positions);
  }
  return d;
}

// The window's pool as the extra source sees it: the slot of request t's context position pos.
struct WindowPool {
  const ScatteredPool& pool;
  const std::vector<int64_t>& base_block;  // per request: its first context block the pool holds
  int64_t slot(int64_t t, int64_t pos) const { return pool.slot(t, pos - base_block[t] * pool.block_size); }
};

// The extra source of `b` (ExtraOptions; x.max_entries and x.index_cols resolved here), drawn
// from a stream of its own; its padding rows are the window's.
HostSource draw_extra_source(ExtraOptions& x, const HostBatch& b, const WindowPool& window,
                             const std::vector<bool>& padding_row, uint64_t seed) {
  Rng xrng(seed ^ kExtraStream);
  const int64_t T = b.num_tokens, W = b.window_size;
  const std::vector<int64_t>& context = b.context;
  const ExtraDraw counts = draw_extra_counts(x, context);
  const int64_t most_entries = T == 0 ? 0 : *std::max_element(counts.entries.begin(), counts.entries.end());
  if (x.max_entries == 0) x.max_entries = std::max<int64_t>(1, most_entries);
  if (x.index_cols == 0) x.index_cols = std::max(x.max_entries, most_entries);
  require(x.index_cols >= x.max_entries && x.index_cols >= most_entries,
          "extra.index_cols must be >= extra.max_entries and >= the most entries a token has (" +
              std::to_string(most_entries) + ")");
  HostSource s = extra_shape(x, b);

  std::optional<ScatteredPool> own_pool;
  if (!x.shares_window_cache) {
    std::vector<int64_t> owned_x(T);
    for (int64_t t = 0; t < T; ++t) owned_x[t] = (counts.positions[t] + x.block_size - 1) / x.block_size;
    own_pool.emplace(owned_x, x.block_size, x.spare_blocks, xrng);
    s.num_blocks = own_pool->num_blocks();
    s.num_slots = s.num_blocks * x.block_size;
  }
  require(s.index_dtype == DType::kInt64 || s.num_slots <= kInt32Max, "extra: int32 ids need at most INT32_MAX slots");
  auto slot_of = [&](int64_t t, int64_t p) {
    return own_pool ? own_pool->slot(t, p) : window.slot(t, p * x.compress_ratio);
  };
  auto spare_slot = [&] { return own_pool ? own_pool->spare_slot(xrng) : window.pool.spare_slot(xrng); };
  // A third of the out-of-range ids are window slots past the extra pool: a kernel checking an
  // extra id against the window's slot count would read them.
  auto out_of_range = [&] {
    if (b.num_slots > s.num_slots && xrng.uniform() < 1.0 / 3.0) return xrng.uniform_int(s.num_slots, b.num_slots - 1);
    return out_of_range_id(xrng, s.num_slots, s.index_dtype);
  };

  s.indices.assign(T * s.index_stride, kNoEntry);
  s.lens.assign(T, 0);
  std::vector<int64_t> picks;
  for (int64_t t = 0; t < T; ++t) {
    int64_t* row = &s.indices[t * s.index_stride];
    const int64_t m = counts.entries[t];
    picks.resize(counts.positions[t]);
    std::iota(picks.begin(), picks.end(), int64_t{0});
    if (x.top_k > 0) {  // the first m of a partial Fisher-Yates shuffle: m distinct positions, in random order
      for (int64_t i = 0; i < m; ++i) std::swap(picks[i], picks[xrng.uniform_int(i, counts.positions[t] - 1)]);
    }
    for (int64_t c = 0; c < m; ++c) row[c] = slot_of(t, picks[c]);
    for (int64_t c = m; c < s.index_cols; ++c) row[c] = x.garbage_past_entries ? spare_slot() : kNoEntry;
    for (int64_t c = s.index_cols; c < s.index_stride; ++c) row[c] = spare_slot();
    const std::vector<int64_t> original(row, row + m);
    const int64_t n_window = std::min(context[t], W);
    for (int64_t c = 0; c < m; ++c) {
      const double r = xrng.uniform();
      double edge = x.hole_fraction;
      if (r < edge) {
        row[c] = kNoEntry;
      } else if (r < (edge += x.duplicate_fraction)) {
        row[c] = original[xrng.uniform_int(0, m - 1)];
      } else if (r < (edge += x.out_of_range_fraction)) {
        row[c] = out_of_range();
      } else if (x.shares_window_cache && n_window > 0 && r < edge + x.cross_duplicate_fraction) {
        // a slot of the token's window positions (not of its index row, whose ids may have been
        // replaced by out-of-range ones of the window's dtype)
        row[c] = window.slot(t, context[t] - xrng.uniform_int(1, n_window));
      }
    }
    if (xrng.uniform() < x.all_invalid_fraction) std::fill(row, row + s.index_cols, kNoEntry);
    s.lens[t] = padding_row[t] ? 0 : x.lens.empty() ? m : x.lens[t];
  }
  return s;
}

}  // namespace

uint8_t HostSource::poison_byte() const { return is_model1() ? kUe8m0NaN : kE4m3NaN; }

int64_t HostSource::scale_bytes() const {
  if (is_model1()) return 0;
  return inv_scale_dtype == DType::kFloat32 ? 4 : 2;
}

int64_t entry_cache_bytes(KvFormat format, int64_t head_dim, DType inv_scale_dtype) {
  if (format == KvFormat::kModel1) return kModel1RowBytes + kModel1ScaleRowBytes;
  return head_dim + (inv_scale_dtype == DType::kFloat32 ? 4 : 2);
}

int64_t HostSource::columns(int64_t t) const {
  return columns_in_window(lens[t], static_cast<int32_t>(std::min<int64_t>(max_entries, kInt32Max)));
}

int64_t HostSource::live_index(int64_t slot) const {
  const auto it = std::lower_bound(live_slots.begin(), live_slots.end(), slot);
  return (it != live_slots.end() && *it == slot) ? it - live_slots.begin() : -1;
}

int64_t HostBatch::total_valid_entries(int64_t token_begin, int64_t token_count) const {
  return std::accumulate(valid_entries.begin() + token_begin,
                         valid_entries.begin() + token_begin + token_count, int64_t{0});
}

int64_t HostBatch::total_extra_entries(int64_t token_begin, int64_t token_count) const {
  if (!extra) return 0;
  return std::accumulate(extra->entries.begin() + token_begin, extra->entries.begin() + token_begin + token_count,
                         int64_t{0});
}

int64_t HostBatch::floor_bytes(int64_t token_begin, int64_t token_count) const {
  const int64_t q_and_out = 2 * token_count * num_heads * head_dim * 2;
  const int64_t extra_entries = total_extra_entries(token_begin, token_count);
  const int64_t window_entries = total_valid_entries(token_begin, token_count) - extra_entries;
  int64_t bytes = q_and_out + window_entries * (entry_cache_bytes(format, head_dim, inv_scale_dtype) + index_bytes());
  if (extra) {
    bytes += extra_entries * (entry_cache_bytes(extra->format, head_dim, extra->inv_scale_dtype) + extra->index_bytes());
  }
  return bytes;
}

double HostBatch::floor_flops(int64_t token_begin, int64_t token_count) const {
  return 4.0 * static_cast<double>(num_heads) * static_cast<double>(head_dim) *
         static_cast<double>(total_valid_entries(token_begin, token_count));
}

HostBatch make_batch(const BatchOptions& raw_options) {
  BatchOptions o = resolve(raw_options);
  HostBatch b;
  copy_shape(o, b);
  Rng rng(o.seed);
  const int64_t T = o.num_tokens, W = o.window_size, bs = o.block_size;

  // Context lengths and the pool: every request owns the blocks of its context (or of its window
  // alone), scattered at random.
  std::vector<int64_t> context(T), base_block(T, 0), owned(T);
  for (int64_t t = 0; t < T; ++t) {
    context[t] = o.context_lens.empty() ? rng.uniform_int(1, o.max_context) : o.context_lens[t];
    if (!o.window_pool_covers_context) base_block[t] = (context[t] - std::min(context[t], W)) / bs;
    owned[t] = (context[t] + bs - 1) / bs - base_block[t];
  }
  const ScatteredPool pool(owned, bs, o.spare_blocks, rng);
  b.num_blocks = pool.num_blocks();
  b.num_slots = b.num_blocks * bs;
  b.context = context;
  const WindowPool window{.pool = pool, .base_block = base_block};

  // Index rows: the last min(context, W) positions, oldest first, then padding.
  b.indices.assign(T * b.index_stride, kNoEntry);
  b.lens.assign(T, 0);
  std::vector<bool> padding_row(T, false);
  for (int64_t t = 0; t < T; ++t) {
    int64_t* row = &b.indices[t * b.index_stride];
    const int64_t n_window = std::min(context[t], W);
    for (int64_t c = 0; c < n_window; ++c) row[c] = window.slot(t, context[t] - n_window + c);
    for (int64_t c = n_window; c < b.index_cols; ++c) row[c] = o.garbage_past_window ? pool.spare_slot(rng) : kNoEntry;
    for (int64_t c = b.index_cols; c < b.index_stride; ++c) row[c] = pool.spare_slot(rng);
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
    if (o.padding_row_fraction > 0.0 && rng.uniform() < o.padding_row_fraction) {
      padding_row[t] = true;
      b.lens[t] = 0;
    }
  }

  if (o.extra) {
    b.extra = draw_extra_source(*o.extra, b, window, padding_row, o.seed);
    b.options.extra = o.extra;
  }

  require_int32_values(b.indices, b.index_dtype, "indices");
  require_int32_values(b.lens, b.lens_dtype, "lens");
  if (b.extra) {
    require_int32_values(b.extra->indices, b.extra->index_dtype, "extra indices");
    require_int32_values(b.extra->lens, b.extra->lens_dtype, "extra lens");
  }

  // Live slots: exactly those a valid entry names (in its own pool). Everything else stays poison.
  collect_valid_slots(b, T, b.live_slots);
  if (b.extra && b.extra->shares_window_cache) collect_valid_slots(*b.extra, T, b.live_slots);
  sort_unique(b.live_slots);
  // A broken window rule would name rows outside the pool; writing them would corrupt memory.
  require(b.live_slots.empty() || (b.live_slots.front() >= 0 && b.live_slots.back() < b.num_slots),
          "the window rule named a slot outside the pool [0, " + std::to_string(b.num_slots) + ")");
  draw_rows_in_order(b, rng, o.inv_scale_magnitude);
  if (b.extra && !b.extra->shares_window_cache) {
    collect_valid_slots(*b.extra, T, b.extra->live_slots);
    sort_unique(b.extra->live_slots);
    draw_rows_in_chunks(*b.extra, o.seed ^ kExtraStream ^ 0x5A5A5A5A5A5A5A5Aull, o.inv_scale_magnitude);
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
  constexpr uint16_t kBf16QuietNaN = 0x7FC0;  // not the output poison pattern, so a copied q row is told apart
  for (const auto& [t, h] : o.nan_q_heads) {
    std::fill_n(b.q.begin() + t * o.q_token_stride + h * o.q_head_stride, o.head_dim, kBf16QuietNaN);
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

namespace {

// Ids of one pool renumbered into a compact pool: the in-range ids some selected row holds,
// in increasing order, then the old out-of-range ids shifted so that they stay out of range.
struct Renumbering {
  std::vector<int64_t> ids;  // old in-range ids, sorted: new id = position
  int64_t old_slots = 0, new_slots = 0;
  int64_t operator()(int64_t id) const {
    if (slot_is_valid(id, old_slots)) return std::lower_bound(ids.begin(), ids.end(), id) - ids.begin();
    if (id >= old_slots) return id - old_slots + new_slots;  // stays out of range
    return id;  // negative ids are no entry either way
  }
};

void copy_source_shape(const HostSource& from, HostSource& to) {
  to.head_dim = from.head_dim;
  to.format = from.format;
  to.max_entries = from.max_entries;
  to.index_cols = from.index_cols;
  to.index_stride = from.index_stride;
  to.block_size = from.block_size;
  to.kv_row_stride = from.kv_row_stride;
  to.kv_block_stride = from.kv_block_stride;
  to.index_dtype = from.index_dtype;
  to.lens_dtype = from.lens_dtype;
  to.inv_scale_dtype = from.inv_scale_dtype;
  to.shares_window_cache = from.shares_window_cache;
}

// `into` becomes the compact copy of `pool` holding every row that the selected tokens' index
// rows (window, padding and stride gaps alike) of the sources in `readers` name, live or poisoned,
// in increasing slot order so that live_slots stays sorted.
Renumbering compact_pool(const HostSource& pool, const std::vector<const HostSource*>& readers,
                         const std::vector<int64_t>& tokens, HostSource& into) {
  Renumbering r;
  r.old_slots = pool.num_slots;
  for (const HostSource* reader : readers) {
    for (int64_t t : tokens) {
      for (int64_t c = 0; c < reader->index_stride; ++c) {
        const int64_t id = reader->indices[t * reader->index_stride + c];
        if (slot_is_valid(id, pool.num_slots)) r.ids.push_back(id);
      }
    }
  }
  sort_unique(r.ids);
  into.num_blocks = std::max<int64_t>(1, (static_cast<int64_t>(r.ids.size()) + into.block_size - 1) / into.block_size);
  into.num_slots = into.num_blocks * into.block_size;
  r.new_slots = into.num_slots;
  for (size_t new_id = 0; new_id < r.ids.size(); ++new_id) {
    const int64_t i = pool.live_index(r.ids[new_id]);
    if (i < 0) continue;
    into.live_slots.push_back(static_cast<int64_t>(new_id));
    into.live_rows.insert(into.live_rows.end(), pool.live_rows.begin() + i * pool.live_row_bytes(),
                          pool.live_rows.begin() + (i + 1) * pool.live_row_bytes());
    into.live_scales.push_back(pool.live_scales[i]);
    into.live_amax.push_back(pool.live_amax[i]);
  }
  return r;
}

void copy_rows(const HostSource& from, const std::vector<int64_t>& tokens, const Renumbering& renumber, HostSource& to) {
  for (int64_t t : tokens) {
    for (int64_t c = 0; c < from.index_stride; ++c) to.indices.push_back(renumber(from.indices[t * from.index_stride + c]));
    to.lens.push_back(from.lens[t]);
    to.entries.push_back(from.entries[t]);
  }
}

}  // namespace

HostBatch select_tokens(const HostBatch& batch, const std::vector<int64_t>& tokens) {
  HostBatch s;
  BatchOptions o = batch.options;
  o.num_tokens = static_cast<int64_t>(tokens.size());
  o.context_lens.clear();
  o.lens.clear();
  o.nan_q_heads.clear();
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (const auto& [t, h] : batch.options.nan_q_heads) {
      if (t == tokens[i]) o.nan_q_heads.emplace_back(static_cast<int64_t>(i), h);
    }
  }
  if (o.extra) {
    o.extra->positions.clear();
    o.extra->lens.clear();
  }
  if (o.q_head_major) {  // the head stride spans the tokens: keep its padding, drop the tokens left out
    o.q_head_stride = o.num_tokens * o.q_token_stride + (batch.q_head_stride - batch.num_tokens * batch.q_token_stride);
  }
  copy_shape(o, s);

  const bool shared = batch.extra && batch.extra->shares_window_cache;
  std::vector<const HostSource*> window_readers = {&batch.window()};
  if (shared) window_readers.push_back(&*batch.extra);
  const Renumbering window_ids = compact_pool(batch, window_readers, tokens, s);
  copy_rows(batch, tokens, window_ids, s);
  if (batch.extra) {
    HostSource x;
    copy_source_shape(*batch.extra, x);
    if (shared) {
      x.num_blocks = s.num_blocks;
      x.num_slots = s.num_slots;
      copy_rows(*batch.extra, tokens, window_ids, x);
    } else {
      const Renumbering extra_ids = compact_pool(*batch.extra, {&*batch.extra}, tokens, x);
      copy_rows(*batch.extra, tokens, extra_ids, x);
    }
    s.extra = std::move(x);
  }

  s.q.assign(q_elements(o), kBf16PoisonBits);
  for (int64_t i = 0; i < s.num_tokens; ++i) {
    for (int64_t h = 0; h < s.num_heads; ++h) {
      const auto from = batch.q.begin() + tokens[i] * batch.q_token_stride + h * batch.q_head_stride;
      std::copy(from, from + s.head_dim, s.q.begin() + i * s.q_token_stride + h * s.q_head_stride);
    }
  }
  for (int64_t t : tokens) {
    s.valid_entries.push_back(batch.valid_entries[t]);
    s.token_kmax.push_back(batch.token_kmax[t]);
    s.context.push_back(batch.context[t]);
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

std::vector<uint8_t> dense_inv_scale(const HostSource& pool) {
  if (pool.is_model1()) return {};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<uint8_t> bytes(pool.num_slots * pool.scale_bytes());
  for (int64_t slot = 0, i = 0; slot < pool.num_slots; ++slot) {
    float value = nan;
    if (i < static_cast<int64_t>(pool.live_slots.size()) && pool.live_slots[i] == slot) {
      value = pool.live_scales[i++];
    }
    if (pool.scale_bytes() == 4) {
      std::memcpy(&bytes[slot * 4], &value, 4);
    } else {
      const uint16_t bits = float_to_bf16_bits(value);
      std::memcpy(&bytes[slot * 2], &bits, 2);
    }
  }
  return bytes;
}

namespace {

// Writes live row i of `pool` into `bytes`, which hold the pool's bytes from offset `begin` on.
void write_live_row(const HostSource& pool, int64_t i, uint8_t* bytes, int64_t begin) {
  const int64_t slot = pool.live_slots[i];
  const uint8_t* row = &pool.live_rows[i * pool.live_row_bytes()];
  if (!pool.is_model1()) {
    std::memcpy(bytes + pool.kv_row_offset(slot) - begin, row, pool.head_dim);
    return;
  }
  std::memcpy(bytes + pool.kv_row_offset(slot) - begin, row, kModel1RowBytes);
  std::memcpy(bytes + pool.kv_scale_row_offset(slot) - begin, row + kModel1RowBytes, kModel1ScaleRowBytes);
}

// The pool bytes live slot `slot`'s data lies in: its row, or in kModel1 its whole block (the row
// and the scale row in the footer; a span that ended inside a block would overlap the next).
std::pair<int64_t, int64_t> live_extent(const HostSource& pool, int64_t slot) {
  if (!pool.is_model1()) return {pool.kv_row_offset(slot), pool.kv_row_offset(slot) + pool.head_dim};
  const int64_t block_begin = slot / pool.block_size * pool.kv_block_stride;
  return {block_begin, block_begin + pool.kv_block_stride};
}

}  // namespace

std::vector<uint8_t> dense_kv_cache(const HostSource& pool) {
  std::vector<uint8_t> bytes(pool.kv_cache_bytes(), pool.poison_byte());
  for (int64_t i = 0; i < static_cast<int64_t>(pool.live_slots.size()); ++i) write_live_row(pool, i, bytes.data(), 0);
  return bytes;
}

std::vector<PoolSpan> pool_spans(const HostSource& pool, int64_t max_gap, int64_t max_bytes) {
  std::vector<PoolSpan> spans;
  const int64_t n = static_cast<int64_t>(pool.live_slots.size());
  for (int64_t i = 0; i < n;) {
    const auto [begin, end] = live_extent(pool, pool.live_slots[i]);
    PoolSpan span{.begin = begin, .end = end, .first_live = i, .end_live = i + 1};
    for (; span.end_live < n; ++span.end_live) {
      const auto [next_begin, next_end] = live_extent(pool, pool.live_slots[span.end_live]);
      // A slot inside the span (the same kModel1 block) always joins it: spans must not overlap.
      const bool inside = next_begin < span.end;
      if (!inside && (next_begin - span.end > max_gap || next_end - span.begin > max_bytes)) break;
      span.end = std::max(span.end, next_end);
    }
    spans.push_back(span);
    i = span.end_live;
  }
  return spans;
}

void fill_span(const HostSource& pool, const PoolSpan& span, uint8_t* bytes) {
  std::memset(bytes, pool.poison_byte(), static_cast<size_t>(span.end - span.begin));
  for (int64_t i = span.first_live; i < span.end_live; ++i) write_live_row(pool, i, bytes, span.begin);
}

HostTensors materialize_host(const HostBatch& batch) {
  HostTensors h;
  h.kv_cache = dense_kv_cache(batch);
  h.inv_scale = dense_inv_scale(batch);
  h.indices = encode_ints(batch.indices, batch.index_dtype);
  h.lens = encode_ints(batch.lens, batch.lens_dtype);
  if (batch.extra) {
    const HostSource& x = *batch.extra;
    if (!x.shares_window_cache) {
      h.extra_kv_cache = dense_kv_cache(x);
      h.extra_inv_scale = dense_inv_scale(x);
    }
    h.extra_indices = encode_ints(x.indices, x.index_dtype);
    h.extra_lens = encode_ints(x.lens, x.lens_dtype);
  }
  h.out.assign(batch.num_tokens * batch.out_token_stride, kBf16PoisonBits);
  if (batch.options.with_lse) {
    h.lse.assign(batch.num_tokens * batch.lse_token_stride, std::numeric_limits<float>::quiet_NaN());
  }
  return h;
}

namespace {

KvSource extra_args(const HostBatch& batch, const TensorPointers& at) {
  if (!batch.extra) return {};
  const HostSource& x = *batch.extra;
  return KvSource{
      .kv_cache = at.extra_kv_cache,
      .num_blocks = x.num_blocks,
      .block_size = x.block_size,
      .stride_kv_block = x.kv_block_stride,
      .stride_kv_token = x.kv_row_stride,
      .inv_scale = x.is_model1() ? nullptr : at.extra_inv_scale,  // kModel1's scales are in its cache
      .inv_scale_dtype = x.inv_scale_dtype,
      .num_scales = x.is_model1() ? 0 : x.num_slots,
      .indices = at.extra_indices,
      .index_dtype = x.index_dtype,
      .index_cols = x.index_cols,
      .stride_indices_token = x.index_stride,
      .lens = at.extra_lens,
      .lens_dtype = x.lens_dtype,
      .max_entries = x.max_entries,
      .format = x.format,
  };
}

}  // namespace

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
      .kv_format = batch.format,
      .inv_scale = batch.is_model1() ? nullptr : at.inv_scale,  // kModel1's scales are in its cache
      .inv_scale_dtype = batch.inv_scale_dtype,
      .num_scales = batch.is_model1() ? 0 : batch.num_slots,
      .indices = at.indices,
      .index_dtype = batch.index_dtype,
      .index_cols = batch.index_cols,
      .stride_indices_token = batch.index_stride,
      .lens = at.lens,
      .lens_dtype = batch.lens_dtype,
      .extra = extra_args(batch, at),
      .attn_sink = at.attn_sink,
      .lse = at.lse,
      .stride_lse_token = batch.lse_token_stride,
      .empty_token_lse = batch.options.empty_token_lse,
      .out = at.out,
      .stride_out_token = batch.out_token_stride,
      .stride_out_head = batch.out_head_stride,
      .backend = backend,
      .stream = stream,
  };
}

DecodeArgs host_args(const HostBatch& batch, HostTensors& tensors) {
  const bool shared = batch.extra && batch.extra->shares_window_cache;
  const TensorPointers at{
      .q = batch.q.data(),
      .kv_cache = tensors.kv_cache.data(),
      .inv_scale = tensors.inv_scale.data(),
      .indices = tensors.indices.data(),
      .lens = tensors.lens.data(),
      .attn_sink = batch.sinks.empty() ? nullptr : batch.sinks.data(),
      .lse = tensors.lse.empty() ? nullptr : tensors.lse.data(),
      .out = tensors.out.data(),
      .extra_kv_cache = shared ? tensors.kv_cache.data() : tensors.extra_kv_cache.data(),
      .extra_inv_scale = shared ? tensors.inv_scale.data() : tensors.extra_inv_scale.data(),
      .extra_indices = tensors.extra_indices.data(),
      .extra_lens = tensors.extra_lens.data(),
  };
  return batch_args(batch, at, batch.num_tokens, Backend::kCpu, nullptr);
}

}  // namespace swa_decode::testing
