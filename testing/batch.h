// Realistic DeepSeek-V4 decode batches on the host, with the edge cases the semantics name.
//
// Every token is one request with its own context length; the request's KV blocks are scattered
// over a pool sized for all requests plus spare blocks; its index row holds the slots of its last
// min(len, W) positions, oldest first, padded with -1. Only the cache rows that some VALID entry
// names (docs/semantics.md, "Valid entries") hold data; every other slot is poisoned (e4m3 NaN in
// all D bytes, NaN scale), as are the kv row padding bytes and the q padding elements, so a kernel
// that reads anything it must not turns the output into NaN. A source in kModel1 rows
// (docs/semantics.md, "Row formats": 576-byte rows, scale rows in each block's footer) is poisoned
// with 0xFF in every byte no valid entry names (NaN as e4m3, as bf16 and as UE8M0): unused rows,
// their footer scale rows, the pad byte of every scale row and the padding after each footer.
//
// An optional extra source (docs/semantics.md, "The extra source") holds the request's compressed
// entries in a pool of its own (or in the window's): a C4A layer's top-k of its context / 4
// compressed positions, a C128A layer's all context / 128 of them. Its unused slots are poisoned
// the same way.
//
// The pools themselves are never materialized on the host (at T = 2048 the window's is ~4 GiB, a
// C128A layer's at a 1M context ~16 GiB): a HostBatch keeps only the live rows; materialize_host()
// builds a dense copy for small batches, select_tokens() a compact, semantically identical batch
// for checking a subset of tokens against the reference, and pool_spans() the pieces an upload
// copies.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "swa_decode/swa_decode.h"

namespace swa_decode::testing {

// The extra source of a batch. Every request has `positions` compressed positions (context /
// compress_ratio unless given per token); its entries are all of them in order (top_k = 0, a
// C128A layer) or min(top_k, positions) of them drawn without replacement in random order (a C4A
// layer's indexer), in columns [0, entries), followed by -1 (or garbage) up to index_cols.
struct ExtraOptions {
  int64_t compress_ratio = 4;       // context positions per compressed position: 4 (C4A) or 128 (C128A)
  std::vector<int64_t> positions = {};  // per token compressed positions; empty = context / compress_ratio
  int64_t top_k = 512;              // 0 = every position
  int64_t max_entries = 0;          // X = extra.max_entries; 0 = the most entries any token has (>= 1)
  int64_t index_cols = 0;           // 0 = max(X, the most entries any token has)
  int64_t index_row_pad = 0;        // extra index elements per row (stride > index_cols), garbage
  int64_t block_size = 64;          // FlashMLA's C4A layers use 64, its C128A layers 2
  int64_t spare_blocks = -1;        // -1 = an eighth of the used blocks + 4 (never fewer than 1)
  int64_t kv_row_stride = 0;        // bytes; 0 = head_dim
  int64_t kv_block_pad = 0;         // bytes after each block's rows
  DType index_dtype = DType::kInt32;
  DType lens_dtype = DType::kInt32;
  DType inv_scale_dtype = DType::kBFloat16;
  // Row layout, as BatchOptions::kv_format (kModel1: kv_row_stride 0 or 576, kv_block_pad a
  // multiple of 576 after FlashMLA's padded block, inv_scale_dtype ignored).
  KvFormat format = KvFormat::kE4m3;
  std::vector<int64_t> lens = {};   // per-token value written to extra.lens; empty = the entries
  double hole_fraction = 0.0;          // entry columns set to -1
  double duplicate_fraction = 0.0;     // entry columns repeating another entry column's slot
  double out_of_range_fraction = 0.0;  // entry columns set to ids >= S_x or < -1 (a third of them
                                       // in [S_x, S), valid window slots, when the window has more)
  double all_invalid_fraction = 0.0;   // tokens whose whole extra row is -1
  bool garbage_past_entries = false;   // columns past the entries hold in-range ids of poisoned slots
  // The extra source reads the window's cache and scales: compressed position p of a request is
  // its context position p * compress_ratio in the window's pool, which must then cover the whole
  // context. block_size, spare_blocks, the kv strides, inv_scale_dtype and format above are ignored.
  bool shares_window_cache = false;
  double cross_duplicate_fraction = 0.0;  // with a shared cache: entry columns naming a slot of the token's window
};

struct BatchOptions {
  int64_t num_tokens = 1;
  int64_t num_heads = 128;
  int64_t head_dim = 512;
  int64_t window_size = 128;
  int64_t index_cols = 0;          // 0 = window_size; columns past window_size must never be read
  int64_t index_row_pad = 0;       // extra index elements per row (stride > index_cols), garbage
  int64_t block_size = 256;
  int64_t max_context = 8192;      // context lengths are drawn uniformly from [1, max_context]
  int64_t spare_blocks = -1;       // -1 = an eighth of the used blocks + 4 (never fewer than 1)
  // true: every request owns the blocks of its whole context (as a cache without eviction);
  // false: only the blocks its window touches (engines free sliding-window blocks that fell out of
  // the window), so a 64k or 1M context costs the window's pool no more than an 8k one.
  bool window_pool_covers_context = true;
  int64_t kv_row_stride = 0;       // bytes; 0 = head_dim (e.g. 576 for a padded row format)
  int64_t kv_block_pad = 0;        // bytes after each block's rows: stride_kv_block = block_size * kv_row_stride + pad
  // Row layout of the window's cache (docs/semantics.md, "Row formats"). kModel1 needs head_dim 512
  // and takes kv_row_stride 0 or 576 and a kv_block_pad in multiples of 576, added after the block
  // FlashMLA lays out (strides.h, model1_strides); its scales are in the cache, so inv_scale_dtype
  // and inv_scale_magnitude's dtype rounding do not apply (the magnitude must be a power of two).
  KvFormat kv_format = KvFormat::kE4m3;
  // q token-major [T, H, D] (the default) or head-major [H, T, D]; the defaults of the strides follow.
  bool q_head_major = false;
  int64_t q_head_stride = 0;       // elements; 0 = head_dim (head-major: num_tokens * q_token_stride)
  int64_t q_token_stride = 0;      // elements; 0 = num_heads * q_head_stride (head-major: head_dim)
  int64_t out_head_stride = 0;     // elements; 0 = head_dim
  int64_t out_token_stride = 0;    // elements; 0 = num_heads * out_head_stride
  int64_t lse_token_stride = 0;    // elements; 0 = num_heads
  DType index_dtype = DType::kInt64;
  DType lens_dtype = DType::kInt64;
  DType inv_scale_dtype = DType::kBFloat16;
  float scale = 0.0f;              // 0 = head_dim^-0.5
  bool with_lse = true;
  EmptyTokenLse empty_token_lse = EmptyTokenLse::kNegativeInfinity;  // lse of a token without entries
  bool with_sink = false;          // random finite sinks in [-2, 6] unless `sinks` is given
  std::vector<float> sinks = {};   // [num_heads] explicit sink logits (may hold +-inf)
  // Multipliers of q (cycled over heads) and of every inv_scale: powers of two keep the bf16 values
  // exact and push q and the scales across the range the f16 tensor-core path has to rescale.
  std::vector<double> q_magnitudes = {};  // empty = 1
  double inv_scale_magnitude = 1.0;

  std::vector<int64_t> context_lens = {};  // per-token context length (>= 1); empty = random
  std::vector<int64_t> lens = {};     // per-token value written to lens; empty = min(context, W)

  double hole_fraction = 0.0;          // in-window columns set to -1
  double duplicate_fraction = 0.0;     // in-window columns repeating another column's slot
  double out_of_range_fraction = 0.0;  // in-window columns set to ids >= num_slots or < -1
  double all_invalid_fraction = 0.0;   // tokens whose whole index row is -1
  // Columns past each token's window hold in-range ids of poisoned slots instead of -1 padding.
  bool garbage_past_window = false;
  // CUDA-graph padding rows: tokens whose lens (and extra.lens) are 0 with their ids left in place.
  double padding_row_fraction = 0.0;
  // (token, head) pairs whose q row is all NaN, as the uninitialized heads some engines pass: the
  // other heads' outputs must not change (check.h skips the pairs named here).
  std::vector<std::pair<int64_t, int64_t>> nan_q_heads = {};

  std::optional<ExtraOptions> extra;  // none: the window alone

  uint64_t seed = 1;
};

// One KV source of a generated batch: its pool's shape, its ids and lengths (int64, narrowed to
// the source's dtypes on upload) and its live rows.
struct HostSource {
  int64_t head_dim = 0;       // D: elements of a row (its e4m3 bytes in kE4m3)
  KvFormat format = KvFormat::kE4m3;
  int64_t max_entries = 0;    // index columns a token may use: window_size, or the extra source's X
  int64_t index_cols = 0, index_stride = 0;
  int64_t block_size = 0, num_blocks = 0, num_slots = 0, kv_row_stride = 0, kv_block_stride = 0;
  DType index_dtype = DType::kInt64;
  DType lens_dtype = DType::kInt64;
  DType inv_scale_dtype = DType::kBFloat16;
  // The extra source of ExtraOptions::shares_window_cache: its ids name the window's slots, its
  // pool fields are the window's, and the rows its valid entries name are the window's live rows.
  bool shares_window_cache = false;

  std::vector<int64_t> indices;  // [num_tokens * index_stride]
  std::vector<int64_t> lens;     // [num_tokens]

  // The live cache rows: slots named by at least one valid entry, sorted ascending.
  std::vector<int64_t> live_slots;
  // [live_slots.size() * live_row_bytes()], all finite: kE4m3: the D e4m3 codes; kModel1: the
  // 576-byte row (448 e4m3 codes, 64 bf16 values) then its 8-byte scale row (7 UE8M0 bytes, the
  // pad byte 0xFF).
  std::vector<uint8_t> live_rows;
  std::vector<float> live_scales;    // [live_slots.size()] (bf16-representable if bf16 dtype); 1 in kModel1
  std::vector<double> live_amax;     // [live_slots.size()] max |dequantized value| of the row

  std::vector<int64_t> entries;      // per token: valid entries of this source

  // Columns of token t that may hold entries: min(max(lens[t], 0), max_entries).
  int64_t columns(int64_t t) const;
  int64_t live_index(int64_t slot) const;  // index into live_slots, or -1
  int64_t kv_row_offset(int64_t slot) const {  // bytes from the start of the pool to slot's row
    return slot / block_size * kv_block_stride + slot % block_size * kv_row_stride;
  }
  // kModel1: bytes from the start of the pool to slot's scale row in its block's footer.
  int64_t kv_scale_row_offset(int64_t slot) const {
    return slot / block_size * kv_block_stride + block_size * kModel1RowBytes + slot % block_size * kModel1ScaleRowBytes;
  }
  bool is_model1() const { return format == KvFormat::kModel1; }
  int64_t live_row_bytes() const { return is_model1() ? kModel1RowBytes + kModel1ScaleRowBytes : head_dim; }
  // What every byte of the pool that holds no live data is filled with.
  uint8_t poison_byte() const;
  int64_t kv_cache_bytes() const { return num_blocks * kv_block_stride; }
  int64_t index_bytes() const { return index_dtype == DType::kInt32 ? 4 : 8; }
  int64_t lens_bytes() const { return lens_dtype == DType::kInt32 ? 4 : 8; }
  // Bytes of one inv_scale element; 0 in kModel1, which passes none.
  int64_t scale_bytes() const;
};

// Cache bytes one valid entry of a source in `format` makes a decode read (its id aside): the D
// e4m3 bytes and the inv_scale element of kE4m3, the 576-byte row and its 8-byte scale row of
// kModel1. The floor's bytes (HostBatch::floor_bytes) and the bench's input-set sizing use it.
int64_t entry_cache_bytes(KvFormat format, int64_t head_dim, DType inv_scale_dtype);

// A generated batch. Tensors with strides are stored with their padding (filled with poison or
// garbage). The window's source fields are the batch's own (HostBatch derives from HostSource),
// so code written for the window alone reads batch.indices, batch.num_slots, ... unchanged; the
// extra source is a second HostSource.
struct HostBatch : HostSource {
  BatchOptions options;  // with every 0 / -1 default resolved
  int64_t num_tokens = 0, num_heads = 0, window_size = 0;
  int64_t q_head_stride = 0, q_token_stride = 0, out_head_stride = 0, out_token_stride = 0;
  int64_t lse_token_stride = 0;
  float scale = 0.0f;

  // bf16 bits, element (t, h, d) at t * q_token_stride + h * q_head_stride + d; padding = NaN.
  std::vector<uint16_t> q;       // [max(num_tokens * q_token_stride, num_heads * q_head_stride)]
  std::vector<float> sinks;      // [num_heads] or empty

  std::optional<HostSource> extra;

  std::vector<int64_t> valid_entries;  // per token: |J_t|, its valid entries in both sources
  std::vector<double> token_kmax;      // per token: max |dequantized k| over J_t
  std::vector<int64_t> context;        // per token: the request's context length

  const HostSource& window() const { return *this; }
  bool has_model1_source() const { return is_model1() || (extra && extra->is_model1()); }
  // The source whose live rows hold `source`'s rows: the window for an extra source sharing its cache.
  const HostSource& rows_of(const HostSource& source) const {
    return source.shares_window_cache ? window() : source;
  }

  int64_t total_valid_entries(int64_t token_begin, int64_t token_count) const;
  int64_t total_extra_entries(int64_t token_begin, int64_t token_count) const;
  // Bytes a decode of tokens [begin, begin + count) must move at least (ANCHORS.md, "The floor"):
  // q + out + per valid entry of each source (entry_cache_bytes of its format + its index).
  int64_t floor_bytes(int64_t token_begin, int64_t token_count) const;
  // Its FLOPs: q.k and p.v over every valid entry, 4 * H * D per entry.
  double floor_flops(int64_t token_begin, int64_t token_count) const;
};

HostBatch make_batch(const BatchOptions& options);

// A smaller batch holding only `tokens` (in that order) whose results equal those tokens' results
// in `batch`: the rows their index rows name are copied (live or poisoned) into a compact pool per
// source and the ids renumbered; out-of-range ids stay out of range.
HostBatch select_tokens(const HostBatch& batch, const std::vector<int64_t>& tokens);

// Dense host tensors of a batch, in the dtypes the options ask for, and DecodeArgs over them.
struct HostTensors {
  std::vector<uint8_t> kv_cache;    // [kv_cache_bytes()], poisoned
  std::vector<uint8_t> inv_scale;   // [num_slots] bf16 or fp32 bytes, NaN where not live
  std::vector<uint8_t> indices;     // int32 or int64 bytes
  std::vector<uint8_t> lens;        // int32 or int64 bytes
  // The extra source's, when the batch has one (its cache and scales stay empty when it shares the window's).
  std::vector<uint8_t> extra_kv_cache, extra_inv_scale, extra_indices, extra_lens;
  std::vector<uint16_t> out;        // [num_tokens * out_token_stride] bf16 bits, pre-poisoned
  std::vector<float> lse;           // [num_tokens * lse_token_stride], pre-poisoned, or empty
};
HostTensors materialize_host(const HostBatch& batch);
DecodeArgs host_args(const HostBatch& batch, HostTensors& tensors);  // Backend::kCpu

// Where a batch's tensors live (host or device), each pointing at the first token run.
struct TensorPointers {
  const void* q;
  const void* kv_cache;
  const void* inv_scale;
  const void* indices;
  const void* lens;
  const float* attn_sink;  // nullptr: no sink
  float* lse;              // nullptr: no LSE
  void* out;
  // The extra source's (ignored without one); a source sharing the window's cache names its tensors.
  const void* extra_kv_cache = nullptr;
  const void* extra_inv_scale = nullptr;
  const void* extra_indices = nullptr;
  const void* extra_lens = nullptr;
};
// DecodeArgs for `num_tokens` tokens of `batch` at `at`: the shapes, strides and dtypes come from
// the batch in one place for the host and the device paths.
DecodeArgs batch_args(const HostBatch& batch, const TensorPointers& at, int64_t num_tokens, Backend backend,
                      CUstream_st* stream);

// Typed copies (the dtype asked for) of values kept as int64 / float in a HostSource.
std::vector<uint8_t> encode_ints(const std::vector<int64_t>& values, DType dtype);
std::vector<uint8_t> dense_inv_scale(const HostSource& pool);  // [num_slots], NaN where not live; empty in kModel1
std::vector<uint8_t> dense_kv_cache(const HostSource& pool);   // [kv_cache_bytes()], poisoned but the live rows

// The pieces of a pool an upload writes over a poisoned copy: byte ranges [begin, end) holding
// live rows [first_live, end_live), merged where the poison between two live rows is at most
// `max_gap` bytes and cut at `max_bytes` (a larger span is one row, or one kModel1 block: a
// kModel1 slot's bytes are its block's, its row and its scale row in the footer, and spans never
// share a byte). fill_span writes a span's bytes, poison but the live rows, to `bytes`
// ([end - begin]). A C4A pool (every 16th row live) is then a few large copies instead of one per
// row, a window pool one copy per window.
struct PoolSpan {
  int64_t begin = 0, end = 0;
  int64_t first_live = 0, end_live = 0;
};
std::vector<PoolSpan> pool_spans(const HostSource& pool, int64_t max_gap, int64_t max_bytes);
void fill_span(const HostSource& pool, const PoolSpan& span, uint8_t* bytes);

}  // namespace swa_decode::testing
