// value_norm: the power of two a kernel divides the e4m3 sources' inv_scales by before it puts
// P_j * inv_scale_j into an f16 (or bf16) matmul operand, so that the operand stays <= 1 for the
// largest scale whatever the cache's scales are; the epilogue multiplies by value_norm again.
// Shared by the portable kernel (group_softmax.cuh) and the few-heads kernel.
#pragma once

#include <cstdint>

namespace swa_decode {

// Largest |inv_scale| of the compacted list's n entries, the same in every lane: each warp reduces
// the list on its own, so no barrier is needed.
__device__ __forceinline__ float list_max_magnitude(const float* inv_scale, int n, int lane) {
  float magnitude = 0.0f;
  for (int i = lane; i < n; i += 32) magnitude = fmaxf(magnitude, fabsf(inv_scale[i]));
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) magnitude = fmaxf(magnitude, __shfl_xor_sync(0xFFFFFFFFu, magnitude, offset));
  return magnitude;
}

// value_norm for the largest |inv_scale| of the entries seen so far (0 for none): the smallest power
// of two >= that maximum, within [2^-126, 2^126]. A power of two makes 1 / value_norm exact both
// ways (the extra-source kernel keeps only the inverse, and gets value_norm back from it), the
// rescale by old / new value_norm exact, and the ratios stay in (1/2, 1] for the largest scale, so
// f16 keeps the same precision. The bounds keep both normal floats: a maximum below 2^-128 made the
// inverse inf and a masked key's 0 * inf a NaN in P; above 2^126 a ratio reaches 4 at most (fp32's
// largest scale), and the operand 1024, still far inside f16. An infinite or NaN maximum (a valid
// entry's scale: the result is unspecified) gets 2^126.
__device__ __forceinline__ float value_norm_of(float max_magnitude) {
  const uint32_t ceil_exponent = (__float_as_uint(max_magnitude) + 0x007FFFFFu) >> 23;  // biased; 0x7F800000 + ... stays 255
  return __uint_as_float(min(max(ceil_exponent, 1u), 253u) << 23);
}

}  // namespace swa_decode
