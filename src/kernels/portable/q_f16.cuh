// q in f16 for the portable kernel's tensor cores.
//
// The K/V tile is f16 because e4m3 -> f16 is one exact instruction per pair, against four for
// bf16 (e4m3 -> f16 -> f32 -> bf16): the dequantizer was a third of the kernel's instructions.
// The mma then needs q in f16 too. f16 has 3 more mantissa bits than bf16 but a narrow range, so
// each head's 512 dims are scaled by one power of two 2^k that puts the head's largest magnitude in
// [2^14, 2^15) (or k = 0 for a maximum already in [1, 2^15)): every element down to 2^-17 of that
// maximum converts exactly, and anything smaller moves a score less than its fp32 accumulation
// does. Scores are multiplied by 2^-k afterwards.
#pragma once

#include <cstdint>

#include "src/common/fp8_convert.cuh"

namespace swa_decode::portable {

// The larger of two bf16 magnitudes held in one word (low and high half), as float bits.
__device__ __forceinline__ uint32_t bf16_pair_max_bits(uint32_t pair) { return max(pair & 0xFFFFu, pair >> 16) << 16; }

// Largest |x| of the four bf16 of `words`, as float bits (non-negative floats order as their bits).
__device__ __forceinline__ uint32_t bf16x4_max_bits(uint2 words) {
  return bf16_pair_max_bits(__vmaxu2(words.x & 0x7FFF7FFFu, words.y & 0x7FFF7FFFu));
}

// Largest |x| over the bf16 pairs of `words`, as a float (NaN sorts above inf, as its bits do).
__device__ __forceinline__ float bf16_max_magnitude(const uint4 (&words)[4]) {
  uint32_t pair_max = 0;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    pair_max = __vmaxu2(pair_max, words[c].x & 0x7FFF7FFFu);
    pair_max = __vmaxu2(pair_max, words[c].y & 0x7FFF7FFFu);
    pair_max = __vmaxu2(pair_max, words[c].z & 0x7FFF7FFFu);
    pair_max = __vmaxu2(pair_max, words[c].w & 0x7FFF7FFFu);
  }
  return __uint_as_float(bf16_pair_max_bits(pair_max));
}

// The k of 2^k for a head whose largest magnitude is `amax` (exponent field E: amax in
// [2^(E-127), 2^(E-126))). A maximum in [1, 2^15) keeps k = 0: elements below 2^-17 then lose bits,
// but they are below 2^-17 of the maximum and shift a score by less than its fp32 accumulation
// does, and the common case converts without a multiply. Otherwise k = 141 - E puts the maximum in
// [2^14, 2^15). Zero, subnormal, inf and NaN maxima keep k = 0 (nothing to scale, or a result that
// is NaN anyway); |k| <= 100 keeps 2^k and 2^-k normal floats.
__device__ __forceinline__ int q_scale_exponent(float amax) {
  const int exponent_field = static_cast<int>((__float_as_uint(amax) >> 23) & 0xFFu);
  if (exponent_field == 0 || exponent_field == 0xFF || (amax >= 1.0f && amax < 32768.0f)) return 0;
  return min(max(141 - exponent_field, -100), 100);
}

__device__ __forceinline__ float exp2_int(int k) { return __uint_as_float(static_cast<uint32_t>(k + 127) << 23); }

// Two bf16 (one word, low first) times 2^k -> f16x2; exact for the magnitudes described above.
__device__ __forceinline__ uint32_t bf16x2_to_scaled_f16x2(uint32_t word, float scale) {
  return pack_f16x2(__uint_as_float(word << 16) * scale, __uint_as_float(word & 0xFFFF0000u) * scale);
}

__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t word) {
  return pack_f16x2(__uint_as_float(word << 16), __uint_as_float(word & 0xFFFF0000u));
}

__device__ __forceinline__ uint4 bf16x8_to_f16x8(uint4 words) {
  return make_uint4(bf16x2_to_f16x2(words.x), bf16x2_to_f16x2(words.y), bf16x2_to_f16x2(words.z),
                    bf16x2_to_f16x2(words.w));
}

__device__ __forceinline__ uint4 bf16x8_to_scaled_f16x8(uint4 words, float scale) {
  return make_uint4(bf16x2_to_scaled_f16x2(words.x, scale), bf16x2_to_scaled_f16x2(words.y, scale),
                    bf16x2_to_scaled_f16x2(words.z, scale), bf16x2_to_scaled_f16x2(words.w, scale));
}

}  // namespace swa_decode::portable
