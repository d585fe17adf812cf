// Few-heads decode kernel (mma.sync m16n8k16 f16, ldmatrix, bulk copies on mbarriers; sm_90): a
// window alone, kE4m3 rows, for the 1-16 heads a GPU holds under tensor parallelism (issue 13).
//
// With few heads a 16-head mma M (the portable kernel) or a 64-row wgmma (sm90) pads most of its
// math, and a CTA that streams the window in tiles behind barriers for 16 heads spends its time
// waiting. Here the keys are the mma's M and the heads its N (8 a tile), and one CTA holds its
// token's whole window (up to 128 rows of raw e4m3, 66 KiB at a 528-byte pitch) in shared memory:
//   1. compact the valid entries; gather every row with one bulk copy (warp w copies keys
//      16w..16w+15 onto its own mbarrier, and loads their inv_scales meanwhile); q goes to shared
//      memory as f16 B fragments (each head scaled by a power of two, q_f16.cuh);
//   2. S^T = K q^T: warp w, its 16 keys x all heads over all 512 dims; the A fragments come straight
//      from the raw tile (ldmatrix of e4m3 pairs, one cvt per pair, no dequantized tile);
//   3. one softmax over the window per head: maxima and sums meet through shared memory across
//      the 8 warps; P * inv_scale / value_norm goes to shared memory as f16 [head][key];
//   4. O^T = V^T P^T: warp w, its 64 dims x all heads over all keys; V^T's A fragments come from
//      the same raw tile through ldmatrix.trans (one byte permute and two cvts per register);
//   5. normalise (sink, LSE) and store.
// The dot product does not care in which order dims are summed, so step 2 reads the dims of each
// 16-dim k-step in the order ldmatrix delivers them and q's fragments are built in that order;
// step 4's rows are dims in ldmatrix.trans's order, which the store follows.
// Two CTAs share an SM (few_heads_plan.h). What bounds it is each CTA's serial chain with two tokens
// in flight per SM: a wave's CTAs gather together and compute together (docs/perf-notes.md,
// few-heads v2 and v3).
#pragma once

#include <cstdint>

#include "src/common/fp8_convert.cuh"
#include "src/common/kernel_launch.h"
#include "src/common/params.h"
#include "src/common/ptx/sm80.cuh"
#include "src/common/ptx/sm90.cuh"
#include "src/common/softmax_finalize.cuh"
#include "src/common/value_norm.cuh"
#include "src/common/window_compaction.cuh"
#include "src/kernels/few_heads/few_heads_plan.h"
#include "src/kernels/few_heads/launch_few_heads.h"
#include "src/kernels/portable/q_f16.cuh"

namespace swa_decode::few_heads {

template <int kHeadTiles>
struct SmemPlan {
  static constexpr int kHeads = kHeadTiles * kHeadsPerTile;
  alignas(128) uint8_t kv[kKeys][kRowStride];  // raw e4m3 rows (few_heads_plan.h: why 528 bytes apart)
  // q as f16 B fragments, [k-step][head tile][lane]: each lane reloads its own 8 bytes per k-step.
  alignas(16) uint2 q_frags[kHeadDim / 16][kHeadTiles][32];
  alignas(16) uint16_t probs[kHeads][kProbRowElems];  // f16 P * inv_scale / value_norm
  float row_max[kWarps][kHeads];  // log2 units, over each warp's 16 keys
  float row_sum[kWarps][kHeads];
  SlotInBlock entries[kKeys];  // the compacted list: each entry's block and offset in it
  float inv_scale[kKeys];
  uint32_t q_max_bits[kHeads];  // largest |q| of each head, as float bits (non-negative floats order as their bits)
  float sinks[kHeads];
  int warp_counts[kWarps];
  uint64_t rows_landed[kWarps];  // warp w's bulk copies complete here
};
static_assert(sizeof(SmemPlan<1>) == smem_bytes(1) && sizeof(SmemPlan<2>) == smem_bytes(2),
              "few_heads_plan.h sizes the shared-memory plan");

// The CTA-local head of accumulator column 2t + j of head tile n (the mma's C columns are the
// heads; lane t of a quad holds columns 2t and 2t + 1).
__device__ __forceinline__ int column_head(int n, int j, int frag_quad) { return n * kHeadsPerTile + 2 * frag_quad + j; }

// Grid: (token, block of kHeadTiles * 8 heads). kHeadTiles = 1 for up to 8 heads, else 2.
template <int kHeadTiles>
__global__ void __launch_bounds__(kThreads, 2) decode_few_heads_kernel(const __grid_constant__ DecodeParams p) {
  using Smem = SmemPlan<kHeadTiles>;
  constexpr int kHeads = Smem::kHeads;
  constexpr uint32_t kFullMask = 0xFFFFFFFFu;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);

  const int token = static_cast<int>(blockIdx.x);
  const int head_base = static_cast<int>(blockIdx.y) * kHeads;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int frag_row = lane / 4;   // g: fragment rows g, g + 8 (B: column g)
  const int frag_quad = lane % 4;  // t: fragment columns 2t, 2t + 1

  if (tid < kHeads) smem.q_max_bits[tid] = 0;
  if (lane == 0) {
    ptx::mbarrier_init(&smem.rows_landed[warp], 1);
    ptx::fence_barrier_init();  // before the bulk copies (the async proxy) complete on it
  }
  // Nothing above reads global memory; q may be what the kernel before this one wrote.
  ptx::wait_for_prior_grid();
  ptx::let_dependent_grid_launch();

  // q: warp w builds k-steps 4w..4w+3 of every head tile. Lane (g, t) of k-step ks, tile n holds
  // head 8n + g at dims 16 ks + 4t .. + 3 (the order step 2's A fragments take, see below).
  constexpr int kQSteps = kHeadDim / 16 / kWarps;  // 4
  uint2 q_words[kQSteps][kHeadTiles];
  {
    const __nv_bfloat16* q_token = p.q + static_cast<int64_t>(token) * p.stride_q_token;
#pragma unroll
    for (int n = 0; n < kHeadTiles; ++n) {
      const int head = head_base + n * kHeadsPerTile + frag_row;
#pragma unroll
      for (int s = 0; s < kQSteps; ++s) {
        const int dim = (warp * kQSteps + s) * 16 + 4 * frag_quad;
        q_words[s][n] = head < p.num_heads ? ptx::ld_global_nc_v2(q_token + head * p.stride_q_head + dim) : make_uint2(0, 0);
      }
    }
  }
  if (tid < kHeads) {
    const int head = head_base + tid;
    smem.sinks[tid] = p.attn_sink != nullptr && head < p.num_heads ? p.attn_sink[head] : -INFINITY;
  }
  __syncthreads();  // q_max_bits cleared and the barriers initialized before anyone uses them

  // The window's index columns into L1 beside the length (prefetch_index_columns_l1). The list
  // holds each entry's block and offset; the inv_scales are loaded below, beside the rows, instead
  // of before them.
  prefetch_index_columns_l1<kThreads, kKeys>(p.window, token, tid);
  const int num_valid = compact_window<kThreads>(p.window, token, tid, [] { __syncthreads(); }, smem.entries,
                                                 static_cast<float*>(nullptr), smem.warp_counts);
  const int key_steps = (num_valid + kKeysPerWarp - 1) / kKeysPerWarp;  // m16 tiles of keys holding entries

  // Gather: warp w's rows, one bulk copy of 512 bytes each from its first 16 lanes. Rows past the
  // list in the warp's last tile are zeroed: their scores are masked, but their bytes must not be
  // NaN codes, which a masked key's P of 0 would still turn into NaN.
  const uint32_t kv_base = ptx::smem_addr(&smem.kv[0][0]);
  if (warp < key_steps) {
    const int first_key = warp * kKeysPerWarp;
    const int listed = min(kKeysPerWarp, num_valid - first_key);
    if (lane == 0) ptx::mbarrier_arrive_expect_tx(&smem.rows_landed[warp], static_cast<uint32_t>(listed * kHeadDim));
    __syncwarp();
    if (lane < listed) {
      const uint8_t* row = p.window.kv_cache + row_offset_in_cache(p.window, smem.entries[first_key + lane]);
      ptx::bulk_copy_to_shared(kv_base + (first_key + lane) * kRowStride, row, kHeadDim, &smem.rows_landed[warp]);
    }
    for (int key = first_key + listed; key < first_key + kKeysPerWarp; ++key) {
      *reinterpret_cast<uint4*>(&smem.kv[key][lane * 16]) = make_uint4(0, 0, 0, 0);
    }
  }
  float listed_scale = 0.0f;
  if (tid < num_valid) listed_scale = load_inv_scale(p.window, slot_of(p.window, smem.entries[tid]));

  // Each head's power of two into f16 (q_f16.cuh), from its largest |q| over all warps.
#pragma unroll
  for (int n = 0; n < kHeadTiles; ++n) {
    uint32_t bits = 0;
#pragma unroll
    for (int s = 0; s < kQSteps; ++s) bits = max(bits, portable::bf16x4_max_bits(q_words[s][n]));
    bits = max(bits, __shfl_xor_sync(kFullMask, bits, 1));
    bits = max(bits, __shfl_xor_sync(kFullMask, bits, 2));
    if (frag_quad == 0) atomicMax(&smem.q_max_bits[n * kHeadsPerTile + frag_row], bits);
  }
  __syncthreads();
  // Scores are in log2 units: S * inv_scale * scale * log2 e * 2^-k of the score's head (2t, 2t + 1),
  // whose k lane 4 (2t + j) computed for its own head.
  float score_factor[kHeadTiles][2];
#pragma unroll
  for (int n = 0; n < kHeadTiles; ++n) {
    const int k = portable::q_scale_exponent(__uint_as_float(smem.q_max_bits[n * kHeadsPerTile + frag_row]));
    const float q_scale = portable::exp2_int(k);
#pragma unroll
    for (int s = 0; s < kQSteps; ++s) {
      smem.q_frags[warp * kQSteps + s][n][lane] = make_uint2(portable::bf16x2_to_scaled_f16x2(q_words[s][n].x, q_scale),
                                                            portable::bf16x2_to_scaled_f16x2(q_words[s][n].y, q_scale));
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      score_factor[n][j] = p.scale * kLog2e * portable::exp2_int(-__shfl_sync(kFullMask, k, 4 * column_head(0, j, frag_quad)));
    }
  }
  if (tid < num_valid) smem.inv_scale[tid] = listed_scale;
  __syncthreads();  // q's fragments, the inv_scales and the zeroed rows are in shared memory
  const float value_norm = value_norm_of(list_max_magnitude(smem.inv_scale, num_valid, lane));
  const float inv_value_norm = 1.0f / value_norm;

  // ldmatrix.x4 lanes: matrix m = lane / 8 covers keys 8 (m & 1) .. + 7 of a 16-key step and
  // 16-byte chunk (m >> 1) of a 32-byte (32-dim) piece.
  const int matrix = lane / 8;
  const int matrix_key = 8 * (matrix & 1) + (lane & 7);
  const uint32_t lane_row = kv_base + matrix_key * kRowStride + (matrix >> 1) * 16;

  // 2. S^T[16 keys][heads] of this warp. Per 32-dim piece i, register r_m holds key g (m even) or
  // g + 8 (m odd), dims 32 i + 16 (m >> 1) + 4t .. + 3: k-step 2i's A fragment is
  // {r0.lo, r1.lo, r0.hi, r1.hi}, i.e. its k-columns 2t + e and 2t + 8 + e are dims 4t + e and
  // 4t + 2 + e, which is how q's fragments were laid out.
  float scores[kHeadTiles][4];  // rows g, g + 8 (keys), columns 2t, 2t + 1 (heads)
#pragma unroll
  for (int n = 0; n < kHeadTiles; ++n) scores[n][0] = scores[n][1] = scores[n][2] = scores[n][3] = -INFINITY;
  const int key_lo = warp * kKeysPerWarp + frag_row;
  const int key_hi = key_lo + 8;
  if (warp < key_steps) {
    ptx::mbarrier_wait(&smem.rows_landed[warp], 0);
    // Two accumulators a head tile (even and odd k-steps) halve the chain of dependent HMMAs.
    float acc[kHeadTiles][4], acc_odd[kHeadTiles][4];
#pragma unroll
    for (int n = 0; n < kHeadTiles; ++n) {
      acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
      acc_odd[n][0] = acc_odd[n][1] = acc_odd[n][2] = acc_odd[n][3] = 0.0f;
    }
    const uint32_t s_row = lane_row + warp * kKeysPerWarp * kRowStride;
#pragma unroll
    for (int i = 0; i < kHeadDim / 32; ++i) {
      uint32_t r[4];
      ptx::ldmatrix_x4(s_row + 32 * i, r[0], r[1], r[2], r[3]);
      uint32_t f[4][2];
#pragma unroll
      for (int m = 0; m < 4; ++m) e4m3x4_to_f16x4(r[m], f[m][0], f[m][1]);
      const uint32_t a0[4] = {f[0][0], f[1][0], f[0][1], f[1][1]};
      const uint32_t a1[4] = {f[2][0], f[3][0], f[2][1], f[3][1]};
#pragma unroll
      for (int n = 0; n < kHeadTiles; ++n) {
        const uint2 b0 = smem.q_frags[2 * i][n][lane];
        const uint2 b1 = smem.q_frags[2 * i + 1][n][lane];
        ptx::mma_16816<false>(acc[n], a0, b0.x, b0.y);
        ptx::mma_16816<false>(acc_odd[n], a1, b1.x, b1.y);
      }
    }
#pragma unroll
    for (int n = 0; n < kHeadTiles; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[n][r] += acc_odd[n][r];
    }
    const float scale_lo = key_lo < num_valid ? smem.inv_scale[key_lo] : 0.0f;
    const float scale_hi = key_hi < num_valid ? smem.inv_scale[key_hi] : 0.0f;
#pragma unroll
    for (int n = 0; n < kHeadTiles; ++n) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (key_lo < num_valid) scores[n][j] = acc[n][j] * scale_lo * score_factor[n][j];
        if (key_hi < num_valid) scores[n][2 + j] = acc[n][2 + j] * scale_hi * score_factor[n][j];
      }
    }
  }

  // 3. The softmax over the window: each warp's maxima over its keys (the 8 lanes of a column);
  // lane h of every warp then takes head h's maximum over all warps, and the lanes holding head
  // h's scores read it from lane h.
#pragma unroll
  for (int n = 0; n < kHeadTiles; ++n) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float m = fmaxf(scores[n][j], scores[n][2 + j]);
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, offset));
      if (frag_row == 0) smem.row_max[warp][column_head(n, j, frag_quad)] = m;
    }
  }
  __syncthreads();
  float head_max = -INFINITY;  // lane h < kHeads: head h's
  if (lane < kHeads) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) head_max = fmaxf(head_max, smem.row_max[w][lane]);
  }
#pragma unroll
  for (int n = 0; n < kHeadTiles; ++n) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int head = column_head(n, j, frag_quad);
      const float m = __shfl_sync(kFullMask, head_max, head);
      // A head with no finite score (an empty window) exponentiates against 0: its P is 0.
      const float shift = m == -INFINITY ? 0.0f : m;
      const float p_lo = ptx::exp2_approx(scores[n][j] - shift);
      const float p_hi = ptx::exp2_approx(scores[n][2 + j] - shift);
      float sum = p_lo + p_hi;
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
      if (frag_row == 0) smem.row_sum[warp][head] = sum;
      if (warp < key_steps) {
        // Masked keys have P = 0 and a zeroed row; inv_scale / value_norm <= 1.
        const float v_lo = key_lo < num_valid ? smem.inv_scale[key_lo] * inv_value_norm : 0.0f;
        const float v_hi = key_hi < num_valid ? smem.inv_scale[key_hi] * inv_value_norm : 0.0f;
        smem.probs[head][key_lo] = __half_as_ushort(__float2half_rn(p_lo * v_lo));
        smem.probs[head][key_hi] = __half_as_ushort(__float2half_rn(p_hi * v_hi));
      }
    }
  }
  __syncthreads();

  // 4. O^T[this warp's 64 dims][heads] += V^T P^T over the keys that hold entries. ldmatrix.trans
  // of matrix m gives lane (g, t) keys 2t, 2t + 1 (of 8 (m & 1) ..) at the e4m3 pair of dims
  // 2g, 2g + 1 of its 16-dim chunk: bytes {k0 d0, k0 d1, k1 d0, k1 d1}. One permute makes them
  // {k0 d0, k1 d0, k0 d1, k1 d1}, and one cvt per half the A-fragment registers of rows "dim 2g"
  // and "dim 2g + 1": an m16 tile's row g is dim 2g of its 16 dims, row g + 8 dim 2g + 1.
  constexpr int kDimTiles = kDimsPerWarp / 16;  // 4
  float o_acc[kDimTiles][kHeadTiles][4];
#pragma unroll
  for (int d = 0; d < kDimTiles; ++d) {
#pragma unroll
    for (int n = 0; n < kHeadTiles; ++n) o_acc[d][n][0] = o_acc[d][n][1] = o_acc[d][n][2] = o_acc[d][n][3] = 0.0f;
  }
  // P^T's B fragments: matrices (tile n, keys 16 ks + 8 (m & 1)): lane addresses head 8n + (lane & 7).
  const int prob_head = (kHeadTiles == 2 ? 8 * (matrix >> 1) : 0) + (lane & 7);
  const uint32_t prob_row = ptx::smem_addr(&smem.probs[prob_head][8 * (matrix & 1)]);
  const uint32_t pv_row = lane_row + warp * kDimsPerWarp;
  for (int ks = 0; ks < key_steps; ++ks) {
    uint32_t pb[kHeadTiles][2];
    if constexpr (kHeadTiles == 2) {
      ptx::ldmatrix_x4(prob_row + 32 * ks, pb[0][0], pb[0][1], pb[1][0], pb[1][1]);
    } else {
      ptx::ldmatrix_x2(prob_row + 32 * ks, pb[0][0], pb[0][1]);
    }
#pragma unroll
    for (int half = 0; half < kDimTiles / 2; ++half) {
      uint32_t r[4];
      ptx::ldmatrix_x4_trans(pv_row + ks * kKeysPerWarp * kRowStride + 32 * half, r[0], r[1], r[2], r[3]);
      uint32_t f[4][2];
#pragma unroll
      for (int m = 0; m < 4; ++m) e4m3x4_to_f16x4(__byte_perm(r[m], 0, 0x3120), f[m][0], f[m][1]);
      const uint32_t a_lo[4] = {f[0][0], f[0][1], f[1][0], f[1][1]};  // dims 32 half + 0..15
      const uint32_t a_hi[4] = {f[2][0], f[2][1], f[3][0], f[3][1]};  // dims 32 half + 16..31
#pragma unroll
      for (int n = 0; n < kHeadTiles; ++n) {
        ptx::mma_16816<false>(o_acc[2 * half][n], a_lo, pb[n][0], pb[n][1]);
        ptx::mma_16816<false>(o_acc[2 * half + 1][n], a_hi, pb[n][0], pb[n][1]);
      }
    }
  }

  // 5. Normalise (sink, LSE) and store. Lane h < kHeads finalizes head h; lane (g, t) holds dims
  // 2g, 2g + 1 of each 16-dim tile for heads 2t, 2t + 1 of each head tile and takes their factors
  // from those lanes: one 4-byte store per head and tile.
  float head_factor = 0.0f;
  if (lane < kHeads && head_base + lane < p.num_heads) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += smem.row_sum[w][lane];
    const FinalizedRow fin = finalize_row(head_max, sum, smem.sinks[lane], p.empty_token_lse);
    head_factor = fin.out_factor * value_norm;
    if (p.lse != nullptr && warp == 0) p.lse[static_cast<int64_t>(token) * p.stride_lse_token + head_base + lane] = fin.lse;
  }
#pragma unroll
  for (int n = 0; n < kHeadTiles; ++n) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int local_head = column_head(n, j, frag_quad);
      const float out_factor = __shfl_sync(kFullMask, head_factor, local_head);
      const int head = head_base + local_head;
      if (head >= p.num_heads) continue;
      __nv_bfloat16* out_row = p.out + static_cast<int64_t>(token) * p.stride_out_token + head * p.stride_out_head +
                               warp * kDimsPerWarp + 2 * frag_row;
#pragma unroll
      for (int d = 0; d < kDimTiles; ++d) {
        const uint32_t pair = pack_bf16x2(o_acc[d][n][j] * out_factor, o_acc[d][n][2 + j] * out_factor);
        *reinterpret_cast<uint32_t*>(out_row + 16 * d) = pair;
      }
    }
  }
}

}  // namespace swa_decode::few_heads

namespace swa_decode {

template <int kHeadTiles>
cudaError_t launch_few_heads_variant(const DecodeParams& params, bool dependent_launch, cudaStream_t stream) {
  constexpr int kHeads = kHeadTiles * few_heads::kHeadsPerTile;
  const KernelLaunch launch{
      .grid = dim3(static_cast<unsigned>(params.num_tokens), static_cast<unsigned>((params.num_heads + kHeads - 1) / kHeads)),
      .block = dim3(few_heads::kThreads),
      .smem_bytes = few_heads::smem_bytes(kHeadTiles),
      .cluster_ctas = 1u,
      .dependent_launch = dependent_launch,
      .stream = stream,
  };
  return launch_kernel<few_heads::decode_few_heads_kernel<kHeadTiles>>(launch, params);
}

}  // namespace swa_decode
