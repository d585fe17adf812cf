// wgmma through CuTe's atoms for the two matmuls of the Hopper kernel: S = Q K^T (m64n128k16,
// both operands in shared memory) and O = P V (m64n256k16, P from registers, V MN-major).
#pragma once

#include <cstdint>
#include <utility>

#include <cute/arch/mma_sm90_gmma.hpp>

namespace swa_decode::sm90 {

// The atoms take their 64 / 128 accumulator registers one reference each.
using GmmaQK = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>;
using GmmaPV = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::MN>;

template <size_t... I>
__device__ __forceinline__ void gmma_qk_impl(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate,
                                             std::index_sequence<I...>) {
  GmmaQK::fma(desc_a, desc_b, d[I]..., accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}
template <size_t... I>
__device__ __forceinline__ void gmma_pv_impl(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate,
                                             std::index_sequence<I...>) {
  GmmaPV::fma(a[0], a[1], a[2], a[3], desc_b, d[I]...,
              accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}

template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(d[i]);
}

}  // namespace swa_decode::sm90
