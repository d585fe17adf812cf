// The one parameter struct every GPU kernel takes (as `const __grid_constant__ DecodeParams`).
// Built once by src/api/ from a validated DecodeArgs; kernels never re-derive or re-check it.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

namespace swa_decode {

// One KV source as the kernels read it (docs/semantics.md, "Valid entries"): a paged cache of e4m3
// rows, one inverse scale per slot, and per token a row of slot ids and a length. The sliding
// window is one source; DeepSeek-V4's compressed entries (the "extra" source) are another.
struct KvSourceParams {
  const uint8_t* kv_cache;       // [num_blocks, block_size, D] e4m3 bytes, unit stride in D; nullptr = no source
  const void* inv_scale;         // [num_slots] bf16 (inv_scale_is_f32 == 0) or fp32
  const void* indices;           // [T, >= max_entries] int32 (index_is_i64 == 0) or int64
  const void* lens;              // [T / lens_rows_per_entry] int32 (lens_is_i64 == 0) or int64; nullptr = all columns
  int64_t stride_kv_block;       // bytes (= elements of e4m3)
  int64_t stride_kv_token;
  int64_t stride_indices_token;  // elements
  int64_t num_slots;             // num_blocks * block_size: ids outside [0, num_slots) are no entry
  int32_t block_size;
  int32_t max_entries;           // index columns a token may use: window_size for the window
  int32_t lens_rows_per_entry;   // consecutive tokens one lens entry covers: token t reads lens[t / n]
  int32_t inv_scale_is_f32;
  int32_t index_is_i64;
  int32_t lens_is_i64;
  // Row layout (docs/semantics.md, "Row formats"): 0 = kE4m3, 1 = kModel1 (576-byte rows, scales in
  // each block's footer, inv_scale unused). A kernel family that does not read kModel1 says so in
  // its record's why_not (src/dispatch/).
  int32_t is_model1;
};

struct DecodeParams {
  const __nv_bfloat16* q;      // [T, H, D], stride_q_token / stride_q_head, unit stride in D
  const float* attn_sink;      // [H] or nullptr
  float* lse;                  // [T, H] natural log, stride_lse_token, or nullptr
  __nv_bfloat16* out;          // [T, H, D], stride_out_token / stride_out_head, unit stride in D

  int64_t stride_q_token;      // elements
  int64_t stride_q_head;
  int64_t stride_lse_token;
  int64_t stride_out_token;
  int64_t stride_out_head;

  KvSourceParams window;       // the sliding window (always present)
  KvSourceParams extra;        // the compressed entries; extra.kv_cache == nullptr when absent

  int32_t num_tokens;
  int32_t num_heads;
  int32_t head_dim;
  float scale;                 // softmax scale applied to q . k
  float empty_token_lse;       // lse of a token without a valid entry: -inf or +inf (EmptyTokenLse)
};

}  // namespace swa_decode
