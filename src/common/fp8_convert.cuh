// e4m3 -> bf16, exactly. Every e4m3 value (subnormals, +-0, NaN) is representable in bf16, so the
// kernels keep the cache's exact values in the tensor-core operands and apply the per-token inverse
// scale to the fp32 scores and probabilities instead (docs/perf-notes.md, "scale factoring").
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace swa_decode {

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Two e4m3 codes (low byte first) -> packed bf16x2 (low half first). Goes through f16, which also
// holds every e4m3 value exactly; on sm_89+ the first step is one cvt instruction.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint16_t codes) {
  const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(codes, __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Four e4m3 codes packed in a u32 -> two bf16x2 words.
__device__ __forceinline__ void e4m3x4_to_bf16x4(uint32_t codes, uint32_t& lo, uint32_t& hi) {
  lo = e4m3x2_to_bf16x2(static_cast<uint16_t>(codes & 0xFFFFu));
  hi = e4m3x2_to_bf16x2(static_cast<uint16_t>(codes >> 16));
}

// Four e4m3 codes packed in a u32 -> two f16x2 words: one cvt per pair on sm_89+, against four
// for bf16 (the f16 -> bf16 step has no single instruction).
// On sm_89+ the two cvts read the word's halves in place: through the intrinsic's 16-bit values and
// __half2_raw, ptxas added a shift and a multiply-add a pair to split and repack them (ncu on the
// few-heads kernel: 4.3 of 42 million instructions).
__device__ __forceinline__ void e4m3x4_to_f16x4(uint32_t codes, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n"
      ".reg .b16 low, high;\n"
      "mov.b32 {low, high}, %2;\n"
      "cvt.rn.f16x2.e4m3x2 %0, low;\n"
      "cvt.rn.f16x2.e4m3x2 %1, high;\n"
      "}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(codes));
#else
  const __half2_raw l = __nv_cvt_fp8x2_to_halfraw2(static_cast<uint16_t>(codes & 0xFFFFu), __NV_E4M3);
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<uint16_t>(codes >> 16), __NV_E4M3);
  lo = static_cast<uint32_t>(l.x) | (static_cast<uint32_t>(l.y) << 16);
  hi = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
#endif
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

// A UE8M0 scale code (kModel1's scales, docs/semantics.md "Row formats") as the bits of
// 2^(code - 127) in a bf16 (kShift 0) or a float (kShift 16, its low 16 bits zero): exact for every
// code, since bf16 has fp32's 8 exponent bits; code 0 is 2^-127, a subnormal at both widths; 255 is
// NaN (OCP). One select a width: the bf16 from the float by a shift cost the sm90 layer producer's
// group loop 5 instructions (~6% on kModel1 rows, perf-notes "Session 25").
template <int kShift>
__device__ __forceinline__ uint32_t ue8m0_bits(uint32_t code) {
  static_assert(kShift == 0 || kShift == 16, "a bf16 or a float");
  return code == 0 ? 0x0040u << kShift : code == 0xFF ? 0x7FC0u << kShift : code << (7 + kShift);
}

__device__ __forceinline__ float ue8m0_to_float(uint32_t code) {
  // A select among floats: a select among their bits (ue8m0_bits<16> alone), or the float from the
  // bf16 by a shift, spills the portable g2_extra_model1_both kernel 8 B (ptxas, CUDA 13.0).
  return code == 0 ? __uint_as_float(ue8m0_bits<16>(0))
         : code == 0xFF ? __uint_as_float(ue8m0_bits<16>(0xFF))
                        : __uint_as_float(ue8m0_bits<16>(code));
}

// Four e4m3 codes packed in a u32, each times `scale` (a power of two, ue8m0_to_float) -> two
// bf16x2 words, through fp32. The product is exact in fp32 (e4m3 * 2^-127 >= 2^-136, above fp32's
// smallest subnormal) and so in bf16 wherever bf16 holds it: e4m3 has 3 mantissa bits and bf16 7
// with fp32's exponent range. Past bf16's largest finite value it is +-inf (the fp32 product itself
// overflows: e4m3 * 2^(scale - 127) is below 2^128 exactly when it is a finite bf16); below 2^-126
// it is rounded to bf16's subnormals, as a bf16 out holding it would be. The portable kernel keeps
// this form: the packed one below spilled its two-group kModel1 variant 8 bytes (ptxas, CUDA 13.0).
__device__ __forceinline__ void e4m3x4_to_scaled_bf16x4(uint32_t codes, float scale, uint32_t& lo, uint32_t& hi) {
  const __half2_raw l = __nv_cvt_fp8x2_to_halfraw2(static_cast<uint16_t>(codes & 0xFFFFu), __NV_E4M3);
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<uint16_t>(codes >> 16), __NV_E4M3);
  const float2 fl = __half22float2(*reinterpret_cast<const __half2*>(&l));
  const float2 fh = __half22float2(*reinterpret_cast<const __half2*>(&h));
  lo = pack_bf16x2(fl.x * scale, fl.y * scale);
  hi = pack_bf16x2(fh.x * scale, fh.y * scale);
}

// A UE8M0 scale code as the bf16 2^(code - 127) in both halves of a bf16x2.
__device__ __forceinline__ __nv_bfloat162 ue8m0_to_bf16x2(uint32_t code) {
  const uint32_t bits = ue8m0_bits<0>(code);
  const uint32_t both = bits | (bits << 16);
  return *reinterpret_cast<const __nv_bfloat162*>(&both);
}

// Four e4m3 codes packed in a u32, each times `scale` (a power of two in both halves,
// ue8m0_to_bf16x2) -> two bf16x2 words: the exact bf16 conversion, then one packed bf16 multiply a
// pair (against two fp32 multiplies before the pack above), with the same results. The product is
// exact wherever bf16 holds it (a power of two only moves the exponent); past bf16's largest finite
// value it is +-inf, below 2^-126 it is rounded to bf16's subnormals (mul.rn.bf16x2 keeps
// subnormals), as a bf16 out holding it would be.
__device__ __forceinline__ void e4m3x4_to_scaled_bf16x4(uint32_t codes, __nv_bfloat162 scale, uint32_t& lo,
                                                        uint32_t& hi) {
  uint32_t raw_lo, raw_hi;
  e4m3x4_to_bf16x4(codes, raw_lo, raw_hi);
  const __nv_bfloat162 scaled_lo = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&raw_lo), scale);
  const __nv_bfloat162 scaled_hi = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&raw_hi), scale);
  lo = *reinterpret_cast<const uint32_t*>(&scaled_lo);
  hi = *reinterpret_cast<const uint32_t*>(&scaled_hi);
}

}  // namespace swa_decode
