// Hopper fast path: persistent, warp-specialized, wgmma (sm_90a). Window <= 128, head_dim 512.
//
// One CTA per SM walks tokens blockIdx.x, blockIdx.x + gridDim.x, ... Three warpgroups:
//  * producer (WG 0): one warp compacts each token's valid entries a token ahead
//    (src/common/window_compaction.cuh); three warps gather the e4m3 rows with cp.async into a
//    staging buffer (32 KiB = half a window) and dequantize them into the bf16 K/V tile, one
//    256-dim half at a time;
//  * two consumers (WG 1, 2), 64 heads each (the wgmma M): S = Q K^T with Q streamed by TMA in
//    64-dim chunks through a private 3-stage ring, one-pass softmax in registers (the whole
//    window fits: no rescaling), then O = P V for each 256-dim half (m64n256k16, P from registers).
// The K/V tile is split in halves so the producer refills half 0 for the next token while the
// consumers still multiply with half 1: the tensor cores never wait for a full-window refill.
// For H <= 64 both consumers hold the same 64 heads, each computes S (duplicated) and one half of O.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <utility>

#include <cute/arch/mma_sm90_gmma.hpp>

#include "src/common/device_ptx.cuh"
#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/softmax_finalize.cuh"
#include "src/common/window_compaction.cuh"
#include "src/kernels/sm90/sm90_ptx.cuh"

namespace swa_decode::sm90 {

inline constexpr int kHeadDim = 512;
inline constexpr int kKeys = 128;              // whole window in shared memory (window_size <= 128)
inline constexpr int kSlabHeads = 64;          // wgmma M: heads per consumer warpgroup
inline constexpr int kRowBytes = 128;          // one 128-byte swizzle atom row = 64 bf16
inline constexpr int kBlockDims = kRowBytes / 2;  // 64 dims per K/V dim block and per q chunk
inline constexpr int kQChunks = kHeadDim / kBlockDims;  // 8
inline constexpr int kQStages = 3;
inline constexpr int kHalves = 2;
inline constexpr int kHalfDims = kHeadDim / kHalves;      // 256 = the N of one PV wgmma
inline constexpr int kBlocksPerHalf = kHalfDims / kBlockDims;  // 4
inline constexpr int kThreads = 384;
inline constexpr int kProducerThreads = 128;
inline constexpr int kConsumerThreads = 256;
// __launch_bounds__(384, 1) gives every thread 168 registers at launch (64,512 per CTA), and
// setmaxnreg only redistributes those: an increase the CTA's pool cannot cover blocks forever.
// 2 x 200 + 104 = 504 = 3 x 168.
inline constexpr uint32_t kLaunchRegisters = 168;
inline constexpr uint32_t kProducerRegisters = 104;
inline constexpr uint32_t kConsumerRegisters = 200;
static_assert(2 * kConsumerRegisters + kProducerRegisters <= 3 * kLaunchRegisters,
              "setmaxnreg.inc would wait for registers the CTA does not own");
inline constexpr uint32_t kQChunkBytes = kSlabHeads * kRowBytes;  // 8 KiB per TMA
inline constexpr uint32_t kProducerBarrier = 1;  // named barrier id for the producer warpgroup

struct SmemPlan {
  // bf16 K/V rows: [half][64-dim block][key][128 B], 16-byte chunks XOR-swizzled by key % 8.
  // K-major for S = Q K^T, MN-major for O = P V: the same bytes serve both (canonical SW128).
  alignas(1024) uint8_t kv[kHalves][kBlocksPerHalf][kKeys][kRowBytes];
  alignas(1024) uint8_t q[2][kQStages][kSlabHeads][kRowBytes];  // per consumer: TMA SW128 ring
  alignas(128) uint8_t staging[kKeys][kHalfDims];  // e4m3, 16-byte chunks XOR-swizzled by key % 16
  int64_t row_offset[2][kKeys];                    // compacted entries, double buffered by token
  float inv_scale[2][kKeys];
  int num_valid[2];
  int warp_counts[1];                              // the compaction runs on one warp
  uint64_t q_full[2][kQStages];
  uint64_t kv_full[kHalves];
  uint64_t kv_empty[kHalves];
  uint64_t meta_full[2];
  uint64_t meta_empty[2];
};
inline constexpr int kSmemBytes = static_cast<int>(sizeof(SmemPlan)) + 1024;  // + base alignment slack
static_assert(kSmemBytes <= 222 * 1024, "sm_90 plan exceeds the 222 KiB select_kernel checks for");

// ---- wgmma through CuTe's atoms (64 / 128 accumulator registers passed by reference) ----
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

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// ---- producer: warps 0-2 gather and dequantize, warp 3 compacts the next token's window ----
// The compaction is three dependent global round trips (length, indices, scales); on its own warp
// it runs a token ahead instead of sitting between two half refills.
inline constexpr int kGatherThreads = 96;
inline constexpr int kCompactThreads = 32;
inline constexpr int kChunksPerHalfRow = kHalfDims / 16;  // 16-byte pieces of a half row

__device__ __forceinline__ void issue_half_gather(const DecodeParams& p, SmemPlan& smem, int meta, int half,
                                                  int tid) {
  const int num_valid = smem.num_valid[meta];
#pragma unroll 4
  for (int piece = tid; piece < kKeys * kChunksPerHalfRow; piece += kGatherThreads) {
    const int key = piece / kChunksPerHalfRow;
    const int chunk = piece % kChunksPerHalfRow;
    const bool valid = key < num_valid;
    const uint8_t* src = valid ? p.kv_cache + smem.row_offset[meta][key] + half * kHalfDims + chunk * 16 : p.kv_cache;
    ptx::cp_async_16(smem_u32(&smem.staging[key][(chunk ^ (key & 15)) * 16]), src, valid ? 16u : 0u);
  }
  ptx::cp_async_commit();
}

// Units of (key, 32-dim group), keys fastest: the 8 threads of a quarter-warp take 8 consecutive
// keys of one group, so both the staging reads and the swizzled tile writes hit 8 different banks.
__device__ __forceinline__ void dequantize_half(SmemPlan& smem, int half, int tid) {
  constexpr int kGroups = kHalfDims / 32;
#pragma unroll 2
  for (int unit = tid; unit < kKeys * kGroups; unit += kGatherThreads) {
    const int key = unit % kKeys;
    const int group = unit / kKeys;
    const uint4 lo = *reinterpret_cast<const uint4*>(&smem.staging[key][((2 * group) ^ (key & 15)) * 16]);
    const uint4 hi = *reinterpret_cast<const uint4*>(&smem.staging[key][((2 * group + 1) ^ (key & 15)) * 16]);
    const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    uint8_t* row = smem.kv[half][group / 2][key];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint4 chunk;
      e4m3x4_to_bf16x4(words[2 * k], chunk.x, chunk.y);
      e4m3x4_to_bf16x4(words[2 * k + 1], chunk.z, chunk.w);
      const int position = ((group % 2) * 4 + k) ^ (key & 7);
      *reinterpret_cast<uint4*>(row + position * 16) = chunk;
    }
  }
}

__device__ __forceinline__ void run_compaction_warp(const DecodeParams& p, SmemPlan& smem) {
  const int lane = threadIdx.x % 32;
  int it = 0;
  for (int token = blockIdx.x; token < p.num_tokens; token += gridDim.x, ++it) {
    const int meta = it & 1;
    mbarrier_wait(&smem.meta_empty[meta], ((it >> 1) & 1) ^ 1);  // consumers are done with token it-2
    const int n = compact_window<kCompactThreads>(
        p, token, lane, [] { __syncwarp(); }, smem.row_offset[meta], smem.inv_scale[meta], smem.warp_counts);
    if (lane == 0) smem.num_valid[meta] = n;
    // The rows are gathered a half at a time once the previous token's tile is free: pulling them
    // into L2 now takes the HBM latency off that later gather.
    for (int key = lane; key < n; key += kCompactThreads) bulk_prefetch_l2(p.kv_cache + smem.row_offset[meta][key], kHeadDim);
    __syncwarp();
    mbarrier_arrive(&smem.meta_full[meta]);
  }
}

__device__ __forceinline__ void run_gather_warps(const DecodeParams& p, SmemPlan& smem) {
  const int tid = threadIdx.x;  // 0..95
  const int first = blockIdx.x;
  if (first >= p.num_tokens) return;
  mbarrier_wait(&smem.meta_full[0], 0);
  issue_half_gather(p, smem, 0, 0, tid);
  int it = 0;
  for (int token = first; token < p.num_tokens; token += gridDim.x, ++it) {
    const int meta = it & 1;
    const int next = token + gridDim.x;
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      ptx::cp_async_wait<0>();
      named_barrier_sync(kProducerBarrier, kGatherThreads);  // the whole half landed
      mbarrier_wait(&smem.kv_empty[half], (it & 1) ^ 1);     // consumers are done with it
      dequantize_half(smem, half, tid);
      fence_proxy_async_shared();
      named_barrier_sync(kProducerBarrier, kGatherThreads);  // staging free again
      mbarrier_arrive(&smem.kv_full[half]);
      if (half == 0) {
        issue_half_gather(p, smem, meta, 1, tid);
      } else if (next < p.num_tokens) {
        mbarrier_wait(&smem.meta_full[meta ^ 1], ((it + 1) >> 1) & 1);
        issue_half_gather(p, smem, meta ^ 1, 0, tid);
      }
    }
  }
}

// ---- consumers ----
struct ConsumerRole {
  int wg;          // 0 or 1
  int slab;        // which 64 heads
  int first_half;  // PV halves [first_half, last_half]
  int last_half;
  bool writes_lse;
};

__device__ __forceinline__ void issue_q_chunk(const DecodeParams& p, const CUtensorMap& q_map, SmemPlan& smem,
                                              const ConsumerRole& role, int chunk_seq) {
  const int token = blockIdx.x + (chunk_seq / kQChunks) * gridDim.x;
  if (token >= p.num_tokens) return;
  const int stage = chunk_seq % kQStages;
  uint64_t* bar = &smem.q_full[role.wg][stage];
  mbarrier_arrive_expect_tx(bar, kQChunkBytes);
  tma_load_3d(smem.q[role.wg][stage], &q_map, bar, (chunk_seq % kQChunks) * kBlockDims, role.slab * kSlabHeads, token);
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

__device__ __forceinline__ void run_consumer(const DecodeParams& p, const CUtensorMap& q_map, SmemPlan& smem,
                                             const ConsumerRole& role) {
  const int wtid = threadIdx.x % 128;
  const int warp = wtid / 32;
  const int lane = wtid % 32;
  const int frag_row = lane / 4;
  const int frag_quad = lane % 4;
  const int head_lo = role.slab * kSlabHeads + warp * 16 + frag_row;
  const int head_hi = head_lo + 8;
  const float logit_scale = p.scale * kLog2e;

  if (wtid == 0) {
    for (int c = 0; c < kQStages; ++c) issue_q_chunk(p, q_map, smem, role, c);
  }
  int it = 0;
  for (int token = blockIdx.x; token < p.num_tokens; token += gridDim.x, ++it) {
    const int meta = it & 1;
    mbarrier_wait(&smem.meta_full[meta], (it >> 1) & 1);
    const int num_valid = smem.num_valid[meta];
    // ---- S = Q K^T over 8 chunks of 64 dims ----
    float s[64];
    fence_accumulators(s);
#pragma unroll
    for (int c = 0; c < kQChunks; ++c) {
      const int seq = it * kQChunks + c;
      if (c % kBlocksPerHalf == 0) mbarrier_wait(&smem.kv_full[c / kBlocksPerHalf], it & 1);
      mbarrier_wait(&smem.q_full[role.wg][seq % kQStages], (seq / kQStages) & 1);
      cute::warpgroup_arrive();
      const uint32_t q_base = smem_u32(smem.q[role.wg][seq % kQStages]);
      const uint32_t k_base = smem_u32(smem.kv[c / kBlocksPerHalf][c % kBlocksPerHalf]);
#pragma unroll
      for (int k = 0; k < kBlockDims / 16; ++k) {
        const uint64_t desc_q = make_smem_desc_sw128(q_base + k * 32, 16, 1024);
        const uint64_t desc_k = make_smem_desc_sw128(k_base + k * 32, 16, 1024);
        gmma_qk_impl(s, desc_q, desc_k, (c | k) != 0, std::make_index_sequence<64>{});
      }
      cute::warpgroup_commit_batch();
      if (c >= 1) {
        cute::warpgroup_wait<1>();
        if (wtid == 0) issue_q_chunk(p, q_map, smem, role, seq - 1 + kQStages);  // its stage is free
      }
    }
    cute::warpgroup_wait<0>();
    fence_accumulators(s);
    if (wtid == 0) issue_q_chunk(p, q_map, smem, role, it * kQChunks + kQChunks - 1 + kQStages);
    for (int half = 0; half < kHalves; ++half) {
      if (half < role.first_half || half > role.last_half) mbarrier_arrive(&smem.kv_empty[half]);
    }

    // ---- softmax over the whole window in one pass (log2 domain) ----
    const float* inv_scale = smem.inv_scale[meta];
    float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kKeys / 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = 8 * i + 2 * frag_quad + e;
        const bool valid = key < num_valid;
        const float factor = valid ? logit_scale * inv_scale[key] : 0.0f;
        s[4 * i + e] = valid ? s[4 * i + e] * factor : -INFINITY;
        s[4 * i + 2 + e] = valid ? s[4 * i + 2 + e] * factor : -INFINITY;
        row_max[0] = fmaxf(row_max[0], s[4 * i + e]);
        row_max[1] = fmaxf(row_max[1], s[4 * i + 2 + e]);
      }
    float row_sum[2] = {0.0f, 0.0f};
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(0xFFFFFFFFu, row_max[h], 1));
      row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(0xFFFFFFFFu, row_max[h], 2));
      base[h] = row_max[h] == -INFINITY ? 0.0f : row_max[h];  // empty token: every p is 0, not NaN
    }
    uint32_t p_frag[kKeys / 16][4];
#pragma unroll
    for (int i = 0; i < kKeys / 8; ++i) {
      float prob[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        prob[r] = exp2f(s[4 * i + r] - base[r / 2]);
        row_sum[r / 2] += prob[r];
      }
      const int key = 8 * i + 2 * frag_quad;
      const float v0 = key < num_valid ? inv_scale[key] : 0.0f;
      const float v1 = key + 1 < num_valid ? inv_scale[key + 1] : 0.0f;
      p_frag[i / 2][(i & 1) * 2 + 0] = pack_bf16x2(prob[0] * v0, prob[1] * v1);
      p_frag[i / 2][(i & 1) * 2 + 1] = pack_bf16x2(prob[2] * v0, prob[3] * v1);
    }
    mbarrier_arrive(&smem.meta_empty[meta]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_sum[h] += __shfl_xor_sync(0xFFFFFFFFu, row_sum[h], 1);
      row_sum[h] += __shfl_xor_sync(0xFFFFFFFFu, row_sum[h], 2);
    }
    FinalizedRow fin[2];
    fin[0] = finalize_row(row_max[0], row_sum[0], p.attn_sink != nullptr && head_lo < p.num_heads ? p.attn_sink[head_lo] : -INFINITY);
    fin[1] = finalize_row(row_max[1], row_sum[1], p.attn_sink != nullptr && head_hi < p.num_heads ? p.attn_sink[head_hi] : -INFINITY);
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
      const uint32_t v_base = smem_u32(smem.kv[half][0][0]);
#pragma unroll
      for (int ks = 0; ks < kKeys / 16; ++ks) {
        // 16 keys = two 8-row groups (SBO 1 KiB); 256 dims = four 64-dim blocks (LBO 16 KiB).
        const uint64_t desc_v = make_smem_desc_sw128(v_base + ks * 16 * kRowBytes, kKeys * kRowBytes, 8 * kRowBytes);
        gmma_pv_impl(o, p_frag[ks], desc_v, ks != 0, std::make_index_sequence<128>{});
      }
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      fence_accumulators(o);
      mbarrier_arrive(&smem.kv_empty[half]);

#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int head = r == 0 ? head_lo : head_hi;
        __nv_bfloat16* out_row = p.out + token * p.stride_out_token + head * p.stride_out_head + half * kHalfDims;
#pragma unroll
        for (int group = 0; group < kHalfDims / 32; ++group) {
          uint32_t pairs[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int block = 4 * group + j;
            pairs[j] = pack_bf16x2(o[4 * block + 2 * r] * fin[r].out_factor, o[4 * block + 2 * r + 1] * fin[r].out_factor);
          }
          transpose_quad(pairs, frag_quad);
          // Lane q now holds dims 32 group + 8q .. + 7 of this row: one 16-byte store.
          if (head < p.num_heads) {
            ptx::st_global_v4(out_row + group * 32 + 8 * frag_quad, make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]));
          }
        }
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    decode_sm90_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap q_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  SmemPlan& smem = *reinterpret_cast<SmemPlan*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&q_map);
    for (int s = 0; s < kQStages; ++s) {
      mbarrier_init(&smem.q_full[0][s], 1);
      mbarrier_init(&smem.q_full[1][s], 1);
    }
    for (int h = 0; h < kHalves; ++h) {
      mbarrier_init(&smem.kv_full[h], kGatherThreads);
      mbarrier_init(&smem.kv_empty[h], kConsumerThreads);
    }
    for (int m = 0; m < 2; ++m) {
      mbarrier_init(&smem.meta_full[m], kCompactThreads);
      mbarrier_init(&smem.meta_empty[m], kConsumerThreads);
    }
    fence_barrier_init();
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x < kGatherThreads) {
      run_gather_warps(p, smem);
    } else {
      run_compaction_warp(p, smem);
    }
  } else {
    setmaxnreg_inc<kConsumerRegisters>();
    const bool two_slabs = p.num_heads > kSlabHeads;
    ConsumerRole role;
    role.wg = wg - 1;
    role.slab = two_slabs ? role.wg : 0;
    role.first_half = two_slabs ? 0 : role.wg;
    role.last_half = two_slabs ? kHalves - 1 : role.wg;
    role.writes_lse = two_slabs || role.wg == 0;
    run_consumer(p, q_map, smem, role);
  }
#endif
}

}  // namespace swa_decode::sm90
