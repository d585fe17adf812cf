// The sink and LSE conventions of docs/semantics.md, applied to one head's softmax state at the end:
// running max `max_log2` (scores x log2 e), running sum `sum_exp` = sum_j 2^(x_j - max_log2).
#pragma once

#include <cmath>

namespace swa_decode {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// An mma fragment row's columns are spread over the 4 lanes of a quad (columns 2q, 2q + 1 of each
// n8 block): two butterfly shuffles give every lane of the quad the row's max or sum.
__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xFFFFFFFFu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xFFFFFFFFu, value, 2));
}
__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xFFFFFFFFu, value, 1);
  return value + __shfl_xor_sync(0xFFFFFFFFu, value, 2);
}

struct FinalizedRow {
  float out_factor;  // multiply the unnormalized accumulator by this (0 for an empty token)
  float lse;         // natural log of sum_j exp(s_j), without the sink; empty_lse for an empty token
};

// sink: the head's sink logit (natural units) or -inf for none. empty_lse: DecodeParams's
// empty_token_lse, -inf or +inf.
__device__ __forceinline__ FinalizedRow finalize_row(float max_log2, float sum_exp, float sink, float empty_lse) {
  if (!(sum_exp > 0.0f)) return {0.0f, empty_lse};  // no valid entry: out = 0, never NaN
  const float lse = (max_log2 + log2f(sum_exp)) * kLn2;
  // out = acc / (sum_exp + 2^(sink - max)): a -inf sink adds 0; a sink far above every score makes
  // the power inf and out 0, which is the limit, so no branch is needed.
  const float out_factor = 1.0f / (sum_exp + exp2f(sink * kLog2e - max_log2));
  return {out_factor, lse};
}

}  // namespace swa_decode
