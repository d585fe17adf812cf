// wgmma through CuTe's atoms for the two matmuls of the Hopper kernels: S = Q K^T (m64n128k16 in
// the window kernel, m64n64k16 on the layer kernel's half tiles; both operands in shared memory)
// and O = P V (m64n256k16, P from registers or shared memory, V MN-major).
#pragma once

#include <cstdint>
#include <utility>

#include <cute/arch/mma_sm90_gmma.hpp>

#include "src/common/ptx/sm90.cuh"
#include "src/kernels/sm90/sm90_plan.h"

namespace swa_decode::sm90 {

// The atoms take their accumulator registers one reference each: N / 2 for S over N keys, 128 for O.
template <int kAccumulators>
struct GmmaQKAtom;
template <>
struct GmmaQKAtom<64> {  // 128 keys
  using type = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>;
};
template <>
struct GmmaQKAtom<32> {  // 64 keys
  using type = cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>;
};
using GmmaPV = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::MN>;
// P from shared memory instead (the layer kernel's consumer 1, ConsumerExchange).
using GmmaPVShared =
    cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::MN>;

template <int kAccumulators, size_t... I>
__device__ __forceinline__ void gmma_qk_impl(float (&d)[kAccumulators], uint64_t desc_a, uint64_t desc_b,
                                             bool accumulate, std::index_sequence<I...>) {
  GmmaQKAtom<kAccumulators>::type::fma(desc_a, desc_b, d[I]...,
                                       accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}
template <size_t... I>
__device__ __forceinline__ void gmma_pv_impl(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate,
                                             std::index_sequence<I...>) {
  GmmaPV::fma(a[0], a[1], a[2], a[3], desc_b, d[I]...,
              accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}

template <size_t... I>
__device__ __forceinline__ void gmma_pv_shared_impl(float (&d)[128], uint64_t desc_a, uint64_t desc_b, bool accumulate,
                                                    std::index_sequence<I...>) {
  GmmaPVShared::fma(desc_a, desc_b, d[I]...,
                    accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}

// The K-major, 128-byte-swizzled operand descriptor both S operands (and a shared P) use: rows of
// 128 B, 8-row groups 1 KiB apart.
__device__ __forceinline__ uint64_t k_major_desc(uint32_t base) { return ptx::make_smem_desc_sw128(base, 16, 1024); }

// How a loop of wgmmas finds each one's descriptors: rebuilt from its operand's address, or one
// base descriptor advanced by a constant (ptx::advance_smem_desc). The layer kernel advances (its
// consumer 0 spent ~410 of 1,186 instructions a subtile on the rebuilds; 1-4% faster, v9); the
// window kernel rebuilds, as it measured 2% slower at T = 2048 advancing (perf-notes, v9).
enum class DescriptorSteps { kRebuild, kAdvance };

// S (+)= one 64-dim chunk of Q x the same 64 dims of 2 * kAccumulators keys: four k-steps, both
// operands K-major in 128-byte-swizzled shared memory. accumulate == false starts S afresh.
// From the chunks' descriptors (the layer kernel, advancing) ...
template <int kAccumulators>
__device__ __forceinline__ void gmma_qk_chunk_desc(float (&s)[kAccumulators], uint64_t desc_q, uint64_t desc_k,
                                                   bool accumulate) {
#pragma unroll
  for (int k = 0; k < kBlockDims / 16; ++k) {
    gmma_qk_impl(s, ptx::advance_smem_desc(desc_q, k * 32), ptx::advance_smem_desc(desc_k, k * 32),
                 accumulate || k != 0, std::make_index_sequence<kAccumulators>{});
  }
}
// ... or from their addresses (the window kernel, rebuilding).
template <int kAccumulators>
__device__ __forceinline__ void gmma_qk_chunk(float (&s)[kAccumulators], uint32_t q_base, uint32_t k_base,
                                              bool accumulate) {
#pragma unroll
  for (int k = 0; k < kBlockDims / 16; ++k) {
    gmma_qk_impl(s, k_major_desc(q_base + k * 32), k_major_desc(k_base + k * 32), accumulate || k != 0,
                 std::make_index_sequence<kAccumulators>{});
  }
}

// V's MN-major descriptor at v_base: 16 keys = two 8-row groups (SBO 1 KiB); 256 dims = four
// 64-dim blocks (LBO kBlockBytes).
template <uint32_t kBlockBytes>
__device__ __forceinline__ uint64_t v_desc(uint32_t v_base) {
  return ptx::make_smem_desc_sw128(v_base, kBlockBytes, 8 * kRowBytes);
}
// V's descriptor for k-step ks (16 keys) from v_base.
template <uint32_t kBlockBytes, DescriptorSteps kSteps>
__device__ __forceinline__ uint64_t v_desc_at(uint64_t desc_v0, uint32_t v_base, int ks) {
  if constexpr (kSteps == DescriptorSteps::kAdvance) {
    return ptx::advance_smem_desc(desc_v0, ks * 16 * kRowBytes);
  } else {
    return v_desc<kBlockBytes>(v_base + ks * 16 * kRowBytes);
  }
}

// O (+)= P V for one 256-dim half over 16 * kKSteps keys: kKSteps k-steps of 16 keys, P from
// registers, V MN-major from the K/V tile's half, its first key at v_base. accumulate == false
// starts O afresh.
// kBlockBytes: from one 64-dim block of V to the next (16 KiB in the window kernel's tile of 128
// keys, 8 KiB in the layer kernel's stages of 64).
template <int kKSteps, uint32_t kBlockBytes = kKeys * kRowBytes, DescriptorSteps kSteps = DescriptorSteps::kRebuild>
__device__ __forceinline__ void gmma_pv_keys(float (&o)[128], const uint32_t (&p_frag)[kKSteps][4], uint32_t v_base,
                                             bool accumulate) {
  const uint64_t desc_v0 = v_desc<kBlockBytes>(v_base);
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    gmma_pv_impl(o, p_frag[ks], v_desc_at<kBlockBytes, kSteps>(desc_v0, v_base, ks), accumulate || ks != 0,
                 std::make_index_sequence<128>{});
  }
}

// The same with P in shared memory, K-major under the 128-byte swizzle (rows of 128 B = 64 keys,
// the layout of a q chunk; p_base on a 1024-byte boundary): k-step ks reads its 16 keys 32 bytes
// in. The layer kernel's consumer 1 alone uses it, advancing.
template <int kKSteps, uint32_t kBlockBytes>
__device__ __forceinline__ void gmma_pv_keys_shared_p(float (&o)[128], uint32_t p_base, uint32_t v_base,
                                                      bool accumulate) {
  const uint64_t desc_p = k_major_desc(p_base);
  const uint64_t desc_v0 = v_desc<kBlockBytes>(v_base);
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    gmma_pv_shared_impl(o, ptx::advance_smem_desc(desc_p, ks * 32),
                        v_desc_at<kBlockBytes, DescriptorSteps::kAdvance>(desc_v0, v_base, ks), accumulate || ks != 0,
                        std::make_index_sequence<128>{});
  }
}

template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(d[i]);
}

}  // namespace swa_decode::sm90
