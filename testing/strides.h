// The one formula behind every padded layout the tests and the bench build: q and out [T, H, D],
// head-major q [H, T, D], kv_cache [num_blocks, block_size, D].
#pragma once

#include <cstdint>

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

}  // namespace swa_decode::testing
