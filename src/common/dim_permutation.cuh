// The head-dim permutation that lets q be loaded and out be stored with 16-byte accesses straight
// from and to mma fragments, with no shared-memory staging.
//
// A dot product does not care in which order its dims are summed, and the PV output columns can be
// written anywhere we like, so the K/V tile in shared memory holds the dims of each 32-dim group in
// a permuted ("logical") order. Within a group, logical column l = 8a + 2b + e holds physical dim
// p = 8b + 2a + e (a, b in 0..3, e in 0..1): a transpose of a 4x4 grid of bf16 pairs, its own
// inverse. With it:
//  * an m16n8k16 A fragment pair of k-steps (32 logical columns) for quad lane q is exactly the 8
//    physical dims 8q..8q+7 of that group: one 16-byte load of q per row;
//  * the accumulators of four n8 blocks (32 logical columns) for lane q are again physical dims
//    8q..8q+7: one 16-byte store of out per row.
// The same fragment layouts hold for wgmma (per warp of a warpgroup), so both kernels use this.
#pragma once

#include <cstdint>

namespace swa_decode {

inline constexpr int kDimGroup = 32;  // dims permuted together

// Physical 16-byte load of 8 q dims -> A-fragment registers for k-steps 2c and 2c+1.
// `row_lo` holds row g of the fragment, `row_hi` row g + 8 (each: 4 words = 8 bf16, dims 8q..8q+7).
// Fragment order per k-step: {a(g, 2q), a(g+8, 2q), a(g, 2q+8), a(g+8, 2q+8)}.
struct QFragmentPair {
  uint32_t kstep0[4];
  uint32_t kstep1[4];
};
__device__ __forceinline__ QFragmentPair q_words_to_fragments(uint4 row_lo, uint4 row_hi) {
  return QFragmentPair{{row_lo.x, row_hi.x, row_lo.y, row_hi.y}, {row_lo.z, row_hi.z, row_lo.w, row_hi.w}};
}

// Logical 16-byte chunk a (logical columns 8a..8a+7) of a 32-dim group, assembled from the group's
// 32 physical e4m3 bytes `w[0..7]` (w[k] = bytes 4k..4k+3). Logical pair b of the chunk is physical
// bytes 8b + 2a, 8b + 2a + 1, i.e. half (a & 1) of word 2b + (a >> 1).
// Returns the four e4m3 pairs as the low 16 bits of each output word's source (packed 2 per u32).
__device__ __forceinline__ void gather_logical_chunk_e4m3(const uint32_t (&w)[8], int a, uint32_t& pairs01,
                                                          uint32_t& pairs23) {
  const int word = a >> 1;
  // prmt selector: bytes 0-3 from the first operand, 4-7 from the second.
  const uint32_t selector = (a & 1) ? 0x7632u : 0x5410u;
  pairs01 = __byte_perm(w[word], w[2 + word], selector);
  pairs23 = __byte_perm(w[4 + word], w[6 + word], selector);
}

}  // namespace swa_decode
