// Realistic DeepSeek-V4 decode batches on the host, with the edge cases the semantics name.
//
// Every token is one request with its own context length; the request's KV blocks are scattered
// over a pool sized for all requests plus spare blocks; its index row holds the slots of its last
// min(len, W) positions, oldest first, padded with -1. Only the cache rows that some VALID entry
// names (docs/semantics.md, "Valid entries") hold data; every other slot is poisoned (e4m3 NaN in
// all D bytes, NaN scale), as are the kv row padding bytes and the q padding elements, so a kernel
// that reads anything it must not turns the output into NaN.
//
// The pool itself is never materialized on the host (at T = 2048 it is ~4 GiB): a HostBatch keeps
// only the live rows; materialize_host() builds a dense copy for small batches and select_tokens()
// a compact, semantically identical batch for checking a subset of tokens against the reference.
#pragma once

#include <cstdint>
#include <vector>

#include "swa_decode/swa_decode.h"

namespace swa_decode::testing {

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
  int64_t kv_row_stride = 0;       // bytes; 0 = head_dim (e.g. 576 for a padded row format)
  int64_t kv_block_pad = 0;        // bytes after each block's rows: stride_kv_block = block_size * kv_row_stride + pad
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
  bool with_sink = false;          // random finite sinks in [-2, 6] unless `sinks` is given
  std::vector<float> sinks;        // [num_heads] explicit sink logits (may hold +-inf)
  // Multipliers of q (cycled over heads) and of every inv_scale: powers of two keep the bf16 values
  // exact and push q and the scales across the range the f16 tensor-core path has to rescale.
  std::vector<double> q_magnitudes;  // empty = 1
  double inv_scale_magnitude = 1.0;

  std::vector<int64_t> context_lens;  // per-token context length (>= 1); empty = random
  std::vector<int64_t> lens;          // per-token value written to lens; empty = min(context, W)

  double hole_fraction = 0.0;          // in-window columns set to -1
  double duplicate_fraction = 0.0;     // in-window columns repeating another column's slot
  double out_of_range_fraction = 0.0;  // in-window columns set to ids >= num_slots or < -1
  double all_invalid_fraction = 0.0;   // tokens whose whole index row is -1
  // Columns past each token's window hold in-range ids of poisoned slots instead of -1 padding.
  bool garbage_past_window = false;

  uint64_t seed = 1;
};

// A generated batch. Tensors with strides are stored with their padding (filled with poison or
// garbage); index and lens values are kept as int64 and narrowed to the chosen dtype on upload.
struct HostBatch {
  BatchOptions options;  // with every 0 / -1 default resolved
  int64_t num_tokens = 0, num_heads = 0, head_dim = 0, window_size = 0, index_cols = 0;
  int64_t index_stride = 0, block_size = 0, num_blocks = 0, num_slots = 0, kv_row_stride = 0;
  int64_t kv_block_stride = 0;
  int64_t q_head_stride = 0, q_token_stride = 0, out_head_stride = 0, out_token_stride = 0;
  int64_t lse_token_stride = 0;
  float scale = 0.0f;

  // bf16 bits, element (t, h, d) at t * q_token_stride + h * q_head_stride + d; padding = NaN.
  std::vector<uint16_t> q;       // [max(num_tokens * q_token_stride, num_heads * q_head_stride)]
  std::vector<int64_t> indices;  // [num_tokens * index_stride]
  std::vector<int64_t> lens;     // [num_tokens]
  std::vector<float> sinks;      // [num_heads] or empty

  // The live cache rows: slots named by at least one valid entry, sorted ascending.
  std::vector<int64_t> live_slots;
  std::vector<uint8_t> live_rows;    // [live_slots.size() * head_dim] e4m3 codes, all finite
  std::vector<float> live_scales;    // [live_slots.size()] (bf16-representable if bf16 dtype)

  std::vector<int64_t> valid_entries;  // per token: how many valid entries it has
  std::vector<double> token_kmax;      // per token: max |dequantized k| over its valid entries

  int64_t total_valid_entries(int64_t token_begin, int64_t token_count) const;
  int64_t kv_row_offset(int64_t slot) const {  // bytes from the start of the pool to slot's row
    return slot / block_size * kv_block_stride + slot % block_size * kv_row_stride;
  }
  int64_t kv_cache_bytes() const { return num_blocks * kv_block_stride; }
  int64_t index_bytes() const { return options.index_dtype == DType::kInt32 ? 4 : 8; }
  int64_t scale_bytes() const { return options.inv_scale_dtype == DType::kFloat32 ? 4 : 2; }
  // Bytes a decode of tokens [begin, begin + count) must move at least (ANCHORS.md, "The floor"):
  // q + out + per valid entry (D-byte row + scale + index).
  int64_t floor_bytes(int64_t token_begin, int64_t token_count) const;
};

HostBatch make_batch(const BatchOptions& options);

// A smaller batch holding only `tokens` (in that order) whose results equal those tokens' results
// in `batch`: the rows their index rows name are copied (live or poisoned) into a compact pool and
// the ids renumbered; out-of-range ids stay out of range.
HostBatch select_tokens(const HostBatch& batch, const std::vector<int64_t>& tokens);

// Dense host tensors of a batch, in the dtypes the options ask for, and DecodeArgs over them.
struct HostTensors {
  std::vector<uint8_t> kv_cache;    // [kv_cache_bytes()], poisoned
  std::vector<uint8_t> inv_scale;   // [num_slots] bf16 or fp32 bytes, NaN where not live
  std::vector<uint8_t> indices;     // int32 or int64 bytes
  std::vector<uint8_t> lens;        // int32 or int64 bytes
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
};
// DecodeArgs for `num_tokens` tokens of `batch` at `at`: the shapes, strides and dtypes come from
// the batch in one place for the host and the device paths.
DecodeArgs batch_args(const HostBatch& batch, const TensorPointers& at, int64_t num_tokens, Backend backend,
                      CUstream_st* stream);

// Typed copies (the dtype the options ask for) of values kept as int64 / float in HostBatch.
std::vector<uint8_t> encode_ints(const std::vector<int64_t>& values, DType dtype);
std::vector<uint8_t> dense_inv_scale(const HostBatch& batch);  // [num_slots], NaN where not live

}  // namespace swa_decode::testing
