// The one formula behind every padded layout the tests and the bench build: q and out [T, H, D],
// head-major q [H, T, D], kv_cache [num_blocks, block_size, D], and the kModel1 cache's blocks.
#pragma once

#include <cstdint>

#include "swa_decode/swa_decode.h"

namespace swa_decode::testing {

// Strides (elements) of a tensor [groups][rows_per_group][row_elems], unit stride along a row,
// with `row_pad` unused elements after every row and `group_pad` after every group of rows;
// (0, 0) is contiguous. E.g. kv_cache with 512-byte rows padded to 584: padded_strides(256, 512, 72)
// gives stride_kv_token = 584 and stride_kv_block = 256 * 584 = 149504.
struct PaddedStrides {
  int64_t group;  // between groups: stride_q_token, stride_kv_block
  int64_t row;    // between rows:   stride_q_head,  stride_kv_token
};

constexpr PaddedStrides padded_strides(int64_t rows_per_group, int64_t row_elems, int64_t row_pad = 0,
                                       int64_t group_pad = 0) {
  const int64_t row = row_elems + row_pad;
  return {.group = rows_per_group * row + group_pad, .row = row};
}

// A kModel1 row's parts after its 448 e4m3 bytes and in its scale row.
inline constexpr int64_t kModel1RopeDims = kModel1HeadDim - kModel1E4m3Dims;  // 64 bf16 values, dims 448..511
inline constexpr int64_t kModel1ScalesPerRow = 7;  // UE8M0 bytes of a scale row, one per 64 e4m3 dims (+ 1 pad)

// A kModel1 cache of `block_size` tokens a block as FlashMLA lays it out (docs/semantics.md, "Row
// formats"): rows of 576 bytes; a block of B rows, then B scale rows of 8 bytes, rounded up to a
// multiple of 576 bytes (1,728 at B = 2, 37,440 at B = 64, 149,760 at B = 256), then `block_pad`
// more bytes (keep it a multiple of 576: the format's rule).
constexpr PaddedStrides model1_strides(int64_t block_size, int64_t block_pad = 0) {
  const int64_t used = block_size * (kModel1RowBytes + kModel1ScaleRowBytes);
  return {.group = (used + kModel1RowBytes - 1) / kModel1RowBytes * kModel1RowBytes + block_pad,
          .row = kModel1RowBytes};
}

}  // namespace swa_decode::testing
