// Consumer warpgroups of the Hopper kernel: q through a TMA ring, S = Q K^T, one-pass softmax,
// O = P V per 256-dim half, 16-byte output stores.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <utility>

#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/common/softmax_finalize.cuh"
#include "src/kernels/sm90/sm90_gmma.cuh"
#include "src/kernels/sm90/sm90_plan.h"

namespace swa_decode::sm90 {

struct ConsumerRole {
  int wg;          // 0 or 1
  int slab;        // which 64 heads
  int first_half;  // PV halves [first_half, last_half]
  int last_half;
  bool writes_lse;
};

__device__ __forceinline__ void issue_q_chunk(const DecodeParams& p, const CUtensorMap& q_map, SmemPlan& smem,
                                              SmemSync& sync, const ConsumerRole& role, int chunk_seq) {
  const int token = blockIdx.x + (chunk_seq / kQChunks) * gridDim.x;
  if (token >= p.num_tokens) return;
  const int stage = chunk_seq % kQStages;
  uint64_t* bar = &sync.q_full[role.wg][stage];
  ptx::mbarrier_arrive_expect_tx(bar, kQChunkBytes);
  ptx::tma_load_3d(smem.q[role.wg][stage], &q_map, bar, (chunk_seq % kQChunks) * kBlockDims, role.slab * kSlabHeads, token);
}

// 4x4 transpose of 32-bit words across the 4 lanes of a quad: lane q's word j becomes lane j's
// word q. An accumulator row holds bf16 pairs 2q, 2q+1 of four consecutive n8 blocks; after the
// transpose lane q holds the 8 contiguous dims of block q, so out is written 16 bytes at a time
// (4 shuffles instead of 4x the store instructions and half-filled 32-byte sectors).
__device__ __forceinline__ void transpose_quad(uint32_t (&w)[4], int quad_lane) {
  const bool high = quad_lane & 2;
#pragma unroll
  for (int m = 0; m < 2; ++m) {  // swap the off-diagonal 2x2 blocks with lane q ^ 2
    const uint32_t sent = high ? w[m] : w[2 + m];
    const uint32_t got = __shfl_xor_sync(0xFFFFFFFFu, sent, 2);
    if (high) w[m] = got; else w[2 + m] = got;
  }
  const bool odd = quad_lane & 1;
#pragma unroll
  for (int m = 0; m < 2; ++m) {  // then the off-diagonal words of each 2x2 block with lane q ^ 1
    const uint32_t sent = odd ? w[2 * m] : w[2 * m + 1];
    const uint32_t got = __shfl_xor_sync(0xFFFFFFFFu, sent, 1);
    if (odd) w[2 * m] = got; else w[2 * m + 1] = got;
  }
}

// Row r (0: the fragment's head_lo, 1: head_hi = `head`) of one 256-dim half of out from O's
// accumulators (o[4 n + 2 r + e]: n8 block n, element e), times out_factor, as bf16: lane q of the
// quad gets dims 32 group + 8q .. + 7 after a quad transpose, so each store is 16 bytes. Heads
// past num_heads are computed and not stored. Both Hopper kernels store out this way.
__device__ __forceinline__ void store_out_row_half(const DecodeParams& p, const float (&o)[128], int r,
                                                   float out_factor, int token, int head, int half, int frag_quad) {
  __nv_bfloat16* out_row = p.out + token * p.stride_out_token + head * p.stride_out_head + half * kHalfDims;
#pragma unroll
  for (int group = 0; group < kHalfDims / 32; ++group) {
    uint32_t pairs[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int block = 4 * group + j;
      pairs[j] = pack_bf16x2(o[4 * block + 2 * r] * out_factor, o[4 * block + 2 * r + 1] * out_factor);
    }
    transpose_quad(pairs, frag_quad);
    if (head < p.num_heads) {
      ptx::st_global_v4(out_row + group * 32 + 8 * frag_quad, make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]));
    }
  }
}

// The factor of entry `key` of a token's compacted list: its inverse scale. kModel1 (the window
// kernel's kModel1 instantiation; the layer kernel reads the compaction's 1 instead): 1, since the
// rows carry their scales, which the producer applied; inv_scale then holds scale bytes.
template <bool kModel1>
__device__ __forceinline__ float entry_factor(const float* inv_scale, int key) {
  if constexpr (kModel1) {
    return 1.0f;
  } else {
    return inv_scale[key];
  }
}

// The softmax of one S fragment (m64nN: kAccumulators = N / 2 scores per lane, keys 8 i + 2 q + e
// of rows head_lo (s[4 i + e]) and head_hi (s[4 i + 2 + e])), in two steps around the row max.
// First the scores in the log2 domain: x = s * scale * log2(e) * inv_scale[key], -inf for keys past
// num_valid; row_max gains this lane's largest x of each row (not yet reduced over the quad).
template <bool kModel1 = false, int kAccumulators>
__device__ __forceinline__ void scale_scores(float (&s)[kAccumulators], const float* inv_scale, int num_valid,
                                             float logit_scale, int frag_quad, float (&row_max)[2]) {
#pragma unroll
  for (int i = 0; i < kAccumulators / 4; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = 8 * i + 2 * frag_quad + e;
      const bool valid = key < num_valid;
      const float factor = valid ? logit_scale * entry_factor<kModel1>(inv_scale, key) : 0.0f;
      s[4 * i + e] = valid ? s[4 * i + e] * factor : -INFINITY;
      s[4 * i + 2 + e] = valid ? s[4 * i + 2 + e] * factor : -INFINITY;
      row_max[0] = fmaxf(row_max[0], s[4 * i + e]);
      row_max[1] = fmaxf(row_max[1], s[4 * i + 2 + e]);
    }
}

// Then the probabilities p = 2^(x - base) of each row: row_sum gains them unscaled, and P = p *
// inv_scale[key] (the scale of V's rows, folded into P) goes to the bf16 A fragments of O = P V.
template <bool kModel1 = false, int kAccumulators>
__device__ __forceinline__ void scores_to_p(const float (&s)[kAccumulators], const float* inv_scale, int num_valid,
                                            int frag_quad, const float (&base)[2], float (&row_sum)[2],
                                            uint32_t (&p_frag)[kAccumulators / 8][4]) {
#pragma unroll
  for (int i = 0; i < kAccumulators / 4; ++i) {
    float prob[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      prob[r] = exp2f(s[4 * i + r] - base[r / 2]);
      row_sum[r / 2] += prob[r];
    }
    const int key = 8 * i + 2 * frag_quad;
    const float v0 = key < num_valid ? entry_factor<kModel1>(inv_scale, key) : 0.0f;
    const float v1 = key + 1 < num_valid ? entry_factor<kModel1>(inv_scale, key + 1) : 0.0f;
    p_frag[i / 2][(i & 1) * 2 + 0] = pack_bf16x2(prob[0] * v0, prob[1] * v1);
    p_frag[i / 2][(i & 1) * 2 + 1] = pack_bf16x2(prob[2] * v0, prob[3] * v1);
  }
}

template <bool kModel1>
__device__ __forceinline__ void run_consumer(const DecodeParams& p, const CUtensorMap& q_map, SmemPlan& smem,
                                             SmemSync& sync, const ConsumerRole& role) {
  const int wtid = threadIdx.x % kWarpgroupThreads;
  const int warp = wtid / 32;
  const int lane = wtid % 32;
  const int frag_row = lane / 4;
  const int frag_quad = lane % 4;
  const int head_lo = role.slab * kSlabHeads + warp * 16 + frag_row;
  const int head_hi = head_lo + 8;
  const float logit_scale = p.scale * kLog2e;
  // Loaded once, not per token (ncu, v4: 1.3% of consumer time waited on this load).
  const float sink_lo = p.attn_sink != nullptr && head_lo < p.num_heads ? p.attn_sink[head_lo] : -INFINITY;
  const float sink_hi = p.attn_sink != nullptr && head_hi < p.num_heads ? p.attn_sink[head_hi] : -INFINITY;

  if (wtid == 0) {
    for (int c = 0; c < kQStages; ++c) issue_q_chunk(p, q_map, smem, sync, role, c);
  }
  int it = 0;
  for (int token = blockIdx.x; token < p.num_tokens; token += gridDim.x, ++it) {
    const int meta = it & 1;
    ptx::mbarrier_wait(&sync.meta_full[meta], (it >> 1) & 1);
    const int num_valid = sync.num_valid[meta];
    // ---- S = Q K^T over 8 chunks of 64 dims ----
    float s[64];
    fence_accumulators(s);
#pragma unroll
    for (int c = 0; c < kQChunks; ++c) {
      const int seq = it * kQChunks + c;
      if (c % kBlocksPerHalf == 0) ptx::mbarrier_wait(&sync.kv_full[c / kBlocksPerHalf], it & 1);
      ptx::mbarrier_wait(&sync.q_full[role.wg][seq % kQStages], (seq / kQStages) & 1);
      cute::warpgroup_arrive();
      const uint32_t q_base = ptx::smem_addr(smem.q[role.wg][seq % kQStages]);
      const uint32_t k_base = ptx::smem_addr(smem.kv[c / kBlocksPerHalf][c % kBlocksPerHalf]);
      gmma_qk_chunk(s, q_base, k_base, c != 0);
      cute::warpgroup_commit_batch();
      if (c >= 1) {
        cute::warpgroup_wait<1>();
        if (wtid == 0) issue_q_chunk(p, q_map, smem, sync, role, seq - 1 + kQStages);  // its stage is free
      }
    }
    cute::warpgroup_wait<0>();
    fence_accumulators(s);
    if (wtid == 0) issue_q_chunk(p, q_map, smem, sync, role, it * kQChunks + kQChunks - 1 + kQStages);
    for (int half = 0; half < kHalves; ++half) {
      if (half < role.first_half || half > role.last_half) ptx::mbarrier_arrive(&sync.kv_empty[half]);
    }

    // ---- softmax over the whole window in one pass (log2 domain) ----
    const float* inv_scale = smem.inv_scale[meta];
    float row_max[2] = {-INFINITY, -INFINITY};
    scale_scores<kModel1>(s, inv_scale, num_valid, logit_scale, frag_quad, row_max);
    float row_sum[2] = {0.0f, 0.0f};
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[h] = quad_max(row_max[h]);
      base[h] = row_max[h] == -INFINITY ? 0.0f : row_max[h];  // empty token: every p is 0, not NaN
    }
    uint32_t p_frag[kKeys / 16][4];
    scores_to_p<kModel1>(s, inv_scale, num_valid, frag_quad, base, row_sum, p_frag);
    ptx::mbarrier_arrive(&sync.meta_empty[meta]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_sum[h] = quad_sum(row_sum[h]);
    }
    FinalizedRow fin[2];
    fin[0] = finalize_row(row_max[0], row_sum[0], sink_lo, p.empty_token_lse);
    fin[1] = finalize_row(row_max[1], row_sum[1], sink_hi, p.empty_token_lse);
    if (role.writes_lse && p.lse != nullptr && frag_quad == 0) {
      if (head_lo < p.num_heads) p.lse[token * p.stride_lse_token + head_lo] = fin[0].lse;
      if (head_hi < p.num_heads) p.lse[token * p.stride_lse_token + head_hi] = fin[1].lse;
    }

    // ---- O = P V, one 256-dim half at a time (128 accumulator registers) ----
    for (int half = role.first_half; half <= role.last_half; ++half) {
      float o[128];
      fence_accumulators(o);
#pragma unroll
      for (int ks = 0; ks < kKeys / 16; ++ks)
#pragma unroll
        for (int r = 0; r < 4; ++r) cute::warpgroup_fence_operand(p_frag[ks][r]);
      cute::warpgroup_arrive();
      const uint32_t v_base = ptx::smem_addr(smem.kv[half][0][0]);
      gmma_pv_keys(o, p_frag, v_base, false);
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      fence_accumulators(o);
      ptx::mbarrier_arrive(&sync.kv_empty[half]);

#pragma unroll
      for (int r = 0; r < 2; ++r) {
        store_out_row_half(p, o, r, fin[r].out_factor, token, r == 0 ? head_lo : head_hi, half, frag_quad);
      }
    }
  }
}

}  // namespace swa_decode::sm90
