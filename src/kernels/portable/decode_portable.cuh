// Portable tensor-core decode kernel: mma.sync m16n8k16 bf16, cp.async, ldmatrix (sm_80 and newer).
//
// Grid: (token, block of 16 * kHeadGroups heads). One CTA gathers and dequantizes each valid KV row
// of its token once for all the heads it holds. Each 16-head group is split over 4 warps by head-dim
// quarters (128 dims each) so that a warp's output accumulator is 16 x 128 fp32 = 64 registers
// instead of 256; the 4 partial score tiles are summed through shared memory (2 KiB per warp).
// Keys stream in tiles of 32 with an online softmax through a ring of 2-4 staging buffers (as many
// as the device's shared memory allows): with 4, a 128-entry window is requested all at once, so a
// CTA pays the gather latency once instead of once per tile.
#pragma once

#include <cstdint>

#include "src/common/device_ptx.cuh"
#include "src/common/dim_permutation.cuh"
#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/softmax_finalize.cuh"
#include "src/common/window_compaction.cuh"
#include "src/kernels/portable/launch_portable.h"
#include "src/kernels/portable/portable_plan.h"

namespace swa_decode::portable {

inline constexpr int kDimsPerWarp = kHeadDim / kWarpsPerGroup;  // 128
inline constexpr int kChunkBytes = 16;        // one cp.async / ldmatrix row / bf16x8

// Fixed part of the shared-memory plan; the staging ring and the compacted window follow it
// (ring_plan in portable_plan.h), sized at launch by the number of stages and window_size.
template <int kHeadGroups>
struct SmemPlan {
  static constexpr int kWarps = kHeadGroups * kWarpsPerGroup;
  alignas(128) __nv_bfloat16 kv[kKeysPerTile][kHeadDim];         // swizzled, dim-permuted
  alignas(16) float partial_scores[kWarps][16][32];              // [warp][fragment reg][lane]
  int warp_counts[kWarps];
};

static_assert(sizeof(SmemPlan<1>) <= fixed_smem_bytes(1) && sizeof(SmemPlan<2>) <= fixed_smem_bytes(2),
              "portable_plan.h must cover the fixed shared-memory plan");

// Byte offset of 16-byte chunk `chunk` of key row `key` in SmemPlan::kv. XOR-ing the chunk's low 3
// bits with the row makes the 8 rows an ldmatrix reads land in 8 different bank groups.
__device__ __forceinline__ uint32_t kv_chunk_offset(int key, int chunk) {
  return static_cast<uint32_t>(key * (kHeadDim * 2) + ((chunk ^ (key & 7)) * kChunkBytes));
}

// Largest power of two <= 16 that divides every cache-row address: the cp.async width.
__device__ __forceinline__ int kv_copy_width(const DecodeParams& p) {
  const uint64_t bits = reinterpret_cast<uint64_t>(p.kv_cache) | static_cast<uint64_t>(p.stride_kv_block) |
                        static_cast<uint64_t>(p.stride_kv_token);
  return (bits & 15) == 0 ? 16 : (bits & 7) == 0 ? 8 : 4;
}

template <int kThreads, int kWidth>
__device__ __forceinline__ void issue_tile_copy_width(const DecodeParams& p, const int64_t* s_row_offset,
                                                      int num_valid, int tile, uint8_t (*staging)[kHeadDim]) {
  constexpr int kThreadsPerRow = kThreads / kKeysPerTile;
  constexpr int kPiecesPerThread = kHeadDim / kWidth / kThreadsPerRow;
  const int row = static_cast<int>(threadIdx.x) / kThreadsPerRow;
  const int key = tile * kKeysPerTile + row;
  const bool valid = key < num_valid;
  // A masked row copies nothing (src-size 0 zero-fills) from an address that stays in bounds.
  const uint8_t* src_row = valid ? p.kv_cache + s_row_offset[key] : p.kv_cache;
  const uint32_t src_bytes = valid ? kWidth : 0;
  const uint32_t dst_row = ptx::smem_addr(&staging[row][0]);
#pragma unroll 8
  for (int i = 0; i < kPiecesPerThread; ++i) {
    const int col = (static_cast<int>(threadIdx.x) % kThreadsPerRow + i * kThreadsPerRow) * kWidth;
    if constexpr (kWidth == 16) {
      ptx::cp_async_16(dst_row + col, src_row + col, src_bytes);
    } else {
      asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst_row + col), "l"(src_row + col),
                   "n"(kWidth), "r"(src_bytes));
    }
  }
}

// Starts the copy of tile `tile`'s raw rows into `staging`; rows past num_valid are zero-filled.
// Always commits a group (possibly empty) so the ring's wait counts stay uniform.
template <int kThreads>
__device__ __forceinline__ void issue_tile_copy(const DecodeParams& p, const int64_t* s_row_offset, int num_valid,
                                                int tile, uint8_t (*staging)[kHeadDim], int width) {
  if (tile * kKeysPerTile >= num_valid) {
    ptx::cp_async_commit();
    return;
  }
  if (width == 16) {
    issue_tile_copy_width<kThreads, 16>(p, s_row_offset, num_valid, tile, staging);
  } else if (width == 8) {
    issue_tile_copy_width<kThreads, 8>(p, s_row_offset, num_valid, tile, staging);
  } else {
    issue_tile_copy_width<kThreads, 4>(p, s_row_offset, num_valid, tile, staging);
  }
  ptx::cp_async_commit();
}

// e4m3 staging rows -> bf16 tile, dims permuted per 32-dim group (src/common/dim_permutation.cuh).
template <int kThreads>
__device__ __forceinline__ void dequantize_tile(const uint8_t (*staging)[kHeadDim], __nv_bfloat16 (*kv)[kHeadDim]) {
  constexpr int kGroupsPerRow = kHeadDim / kDimGroup;  // 16
  constexpr int kUnits = kKeysPerTile * kGroupsPerRow;
  uint8_t* kv_bytes = reinterpret_cast<uint8_t*>(kv);
#pragma unroll
  for (int i = 0; i < kUnits / kThreads; ++i) {
    const int unit = static_cast<int>(threadIdx.x) + i * kThreads;
    const int row = unit / kGroupsPerRow;
    const int group = unit % kGroupsPerRow;
    const uint4 lo = *reinterpret_cast<const uint4*>(&staging[row][group * kDimGroup]);
    const uint4 hi = *reinterpret_cast<const uint4*>(&staging[row][group * kDimGroup + 16]);
    const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      uint32_t pairs01, pairs23;
      gather_logical_chunk_e4m3(words, a, pairs01, pairs23);
      uint4 chunk;
      e4m3x4_to_bf16x4(pairs01, chunk.x, chunk.y);
      e4m3x4_to_bf16x4(pairs23, chunk.z, chunk.w);
      *reinterpret_cast<uint4*>(kv_bytes + kv_chunk_offset(row, group * 4 + a)) = chunk;
    }
  }
}

// Waits until at most `pending` of the most recent cp.async groups are still in flight.
__device__ __forceinline__ void cp_async_wait_pending(int pending) {
  switch (pending) {
    case 0: ptx::cp_async_wait<0>(); break;
    case 1: ptx::cp_async_wait<1>(); break;
    case 2: ptx::cp_async_wait<2>(); break;
    default: ptx::cp_async_wait<3>(); break;
  }
}

template <int kHeadGroups>
__global__ void __launch_bounds__(kHeadGroups * kWarpsPerGroup * 32, kHeadGroups == 1 ? 2 : 1)
    decode_portable_kernel(const __grid_constant__ DecodeParams p, int num_stages) {
  constexpr int kThreads = kHeadGroups * kWarpsPerGroup * 32;
  using Smem = SmemPlan<kHeadGroups>;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);
  const RingPlan ring = ring_plan(kHeadGroups, num_stages, p.window_size);
  auto stage = [&](int tile) {
    return reinterpret_cast<uint8_t (*)[kHeadDim]>(smem_raw + ring.staging_offset + (tile % num_stages) * kStageBytes);
  };
  int64_t* s_row_offset = reinterpret_cast<int64_t*>(smem_raw + ring.row_offset_offset);
  float* s_inv_scale = reinterpret_cast<float*>(smem_raw + ring.inv_scale_offset);

  const int token = blockIdx.x;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int quarter = warp % kWarpsPerGroup;
  const int head_base = (blockIdx.y * kHeadGroups + warp / kWarpsPerGroup) * kHeadsPerGroup;
  const int frag_row = lane / 4;   // g: fragment rows g and g + 8
  const int frag_quad = lane % 4;  // q: fragment columns 2q, 2q + 1
  const int head_lo = head_base + frag_row;
  const int head_hi = head_lo + 8;
  const int dim_base = quarter * kDimsPerWarp;

  // q fragments first: their latency hides under the index compaction below.
  uint32_t q_frag[kDimsPerWarp / 16][4];
  {
    const __nv_bfloat16* q_token = p.q + token * p.stride_q_token + dim_base + 8 * frag_quad;
#pragma unroll
    for (int c = 0; c < kDimsPerWarp / kDimGroup; ++c) {
      const uint4 zero = make_uint4(0, 0, 0, 0);
      const uint4 lo = head_lo < p.num_heads ? ptx::ld_global_nc_v4(q_token + head_lo * p.stride_q_head + c * kDimGroup) : zero;
      const uint4 hi = head_hi < p.num_heads ? ptx::ld_global_nc_v4(q_token + head_hi * p.stride_q_head + c * kDimGroup) : zero;
      const QFragmentPair pair = q_words_to_fragments(lo, hi);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        q_frag[2 * c][r] = pair.kstep0[r];
        q_frag[2 * c + 1][r] = pair.kstep1[r];
      }
    }
  }

  const int num_valid = compact_window<kThreads>(
      p, token, static_cast<int>(threadIdx.x), [] { __syncthreads(); }, s_row_offset, s_inv_scale, smem.warp_counts);
  const int num_tiles = (num_valid + kKeysPerTile - 1) / kKeysPerTile;
  const int copy_width = kv_copy_width(p);
  const float logit_scale = p.scale * kLog2e;

  float o_acc[kDimsPerWarp / 8][4];
#pragma unroll
  for (int n = 0; n < kDimsPerWarp / 8; ++n) o_acc[n][0] = o_acc[n][1] = o_acc[n][2] = o_acc[n][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};  // log2 domain, quad-uniform
  float row_sum[2] = {0.0f, 0.0f};            // this lane's columns only; quad-reduced at the end

  const uint32_t kv_base = ptx::smem_addr(&smem.kv[0][0]);
  for (int tile = 0; tile < num_stages - 1; ++tile) {
    issue_tile_copy<kThreads>(p, s_row_offset, num_valid, tile, stage(tile), copy_width);
  }
  for (int tile = 0; tile < num_tiles; ++tile) {
    // The stage refilled here was dequantized in the previous iteration, before its barrier.
    issue_tile_copy<kThreads>(p, s_row_offset, num_valid, tile + num_stages - 1, stage(tile + num_stages - 1),
                              copy_width);
    cp_async_wait_pending(num_stages - 1);
    __syncthreads();  // this tile's rows landed for all threads; the previous PV is done with smem.kv
    dequantize_tile<kThreads>(stage(tile), smem.kv);
    __syncthreads();

    // Partial scores over this warp's 128 dims: S[16 heads][32 keys].
    float s_acc[kKeysPerTile / 8][4];
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n) s_acc[n][0] = s_acc[n][1] = s_acc[n][2] = s_acc[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kDimsPerWarp / 16; ++ks) {
#pragma unroll
      for (int n = 0; n < kKeysPerTile / 8; n += 2) {
        const int matrix = lane / 8;
        const int key = 8 * (n + (matrix >> 1)) + (lane & 7);
        const int chunk = quarter * (kDimsPerWarp / 8) + 2 * ks + (matrix & 1);
        uint32_t b0, b1, b2, b3;
        ptx::ldmatrix_x4(kv_base + kv_chunk_offset(key, chunk), b0, b1, b2, b3);
        ptx::mma_bf16_16816(s_acc[n], q_frag[ks], b0, b1);
        ptx::mma_bf16_16816(s_acc[n + 1], q_frag[ks], b2, b3);
      }
    }
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) smem.partial_scores[warp][n * 4 + r][lane] = s_acc[n][r];
    __syncthreads();
    const int first_warp_of_group = warp - quarter;
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarpsPerGroup; ++w) total += smem.partial_scores[first_warp_of_group + w][n * 4 + r][lane];
        s_acc[n][r] = total;
      }

    // Scores in the log2 domain; the per-token inverse scale factors out of q . e4m3.
    float tile_max[2] = {-INFINITY, -INFINITY};
    float value_scale[kKeysPerTile / 8][2];
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = tile * kKeysPerTile + 8 * n + 2 * frag_quad + e;
        const bool valid = key < num_valid;
        const float inv_scale = valid ? s_inv_scale[key] : 0.0f;
        value_scale[n][e] = inv_scale;
        const float factor = logit_scale * inv_scale;
        s_acc[n][e] = valid ? s_acc[n][e] * factor : -INFINITY;
        s_acc[n][2 + e] = valid ? s_acc[n][2 + e] * factor : -INFINITY;
        tile_max[0] = fmaxf(tile_max[0], s_acc[n][e]);
        tile_max[1] = fmaxf(tile_max[1], s_acc[n][2 + e]);
      }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = quad_max(tile_max[h]);
      const float new_max = fmaxf(row_max[h], tile_max[h]);
      // Every tile holds at least one valid key, so new_max is finite here.
      alpha[h] = exp2f(row_max[h] - new_max);
      row_max[h] = new_max;
      row_sum[h] *= alpha[h];
    }
#pragma unroll
    for (int n = 0; n < kDimsPerWarp / 8; ++n) {
      o_acc[n][0] *= alpha[0];
      o_acc[n][1] *= alpha[0];
      o_acc[n][2] *= alpha[1];
      o_acc[n][3] *= alpha[1];
    }
    uint32_t p_frag[kKeysPerTile / 16][4];
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n) {
      float prob[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        prob[r] = exp2f(s_acc[n][r] - row_max[r / 2]);
        row_sum[r / 2] += prob[r];
      }
      // The numerator carries the inverse scale: out = sum_j (p_j * inv_scale_j) * e4m3_j.
      p_frag[n / 2][(n & 1) * 2 + 0] = pack_bf16x2(prob[0] * value_scale[n][0], prob[1] * value_scale[n][1]);
      p_frag[n / 2][(n & 1) * 2 + 1] = pack_bf16x2(prob[2] * value_scale[n][0], prob[3] * value_scale[n][1]);
    }

    // O[16 heads][this warp's 128 dims] += P[16][32 keys] * V[32 keys][128 dims].
#pragma unroll
    for (int ks = 0; ks < kKeysPerTile / 16; ++ks) {
#pragma unroll
      for (int n = 0; n < kDimsPerWarp / 8; n += 2) {
        const int matrix = lane / 8;
        const int key = 16 * ks + 8 * (matrix & 1) + (lane & 7);
        const int chunk = quarter * (kDimsPerWarp / 8) + n + (matrix >> 1);
        uint32_t b0, b1, b2, b3;
        ptx::ldmatrix_x4_trans(kv_base + kv_chunk_offset(key, chunk), b0, b1, b2, b3);
        ptx::mma_bf16_16816(o_acc[n], p_frag[ks], b0, b1);
        ptx::mma_bf16_16816(o_acc[n + 1], p_frag[ks], b2, b3);
      }
    }
  }

  // Normalize (sink, LSE) and store: four n8 blocks of a 32-dim group are 8 contiguous dims.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] = quad_sum(row_sum[h]);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = h == 0 ? head_lo : head_hi;
    if (head >= p.num_heads) continue;
    const float sink = p.attn_sink != nullptr ? p.attn_sink[head] : -INFINITY;
    const FinalizedRow fin = finalize_row(row_max[h], row_sum[h], sink);
    if (p.lse != nullptr && quarter == 0 && frag_quad == 0) p.lse[token * p.stride_lse_token + head] = fin.lse;
    __nv_bfloat16* out_row = p.out + token * p.stride_out_token + head * p.stride_out_head + dim_base + 8 * frag_quad;
#pragma unroll
    for (int c = 0; c < kDimsPerWarp / kDimGroup; ++c) {
      uint4 v;
      v.x = pack_bf16x2(o_acc[4 * c + 0][2 * h] * fin.out_factor, o_acc[4 * c + 0][2 * h + 1] * fin.out_factor);
      v.y = pack_bf16x2(o_acc[4 * c + 1][2 * h] * fin.out_factor, o_acc[4 * c + 1][2 * h + 1] * fin.out_factor);
      v.z = pack_bf16x2(o_acc[4 * c + 2][2 * h] * fin.out_factor, o_acc[4 * c + 2][2 * h + 1] * fin.out_factor);
      v.w = pack_bf16x2(o_acc[4 * c + 3][2 * h] * fin.out_factor, o_acc[4 * c + 3][2 * h + 1] * fin.out_factor);
      ptx::st_global_v4(out_row + c * kDimGroup, v);
    }
  }
}

}  // namespace swa_decode::portable

namespace swa_decode {

template <int kHeadGroups>
int portable_smem_bytes(int num_stages, int window_size) {
  return portable::ring_plan(kHeadGroups, num_stages, window_size).total_bytes;
}

template <int kHeadGroups>
cudaError_t launch_portable_decode(const DecodeParams& params, int num_stages, cudaStream_t stream) {
  constexpr int kThreads = kHeadGroups * portable::kWarpsPerGroup * 32;
  const int smem_bytes = portable_smem_bytes<kHeadGroups>(num_stages, params.window_size);
  const auto kernel = portable::decode_portable_kernel<kHeadGroups>;
  // Raising the dynamic shared-memory limit is a per-function attribute, not a stream operation,
  // so it is legal while a CUDA graph is being captured; it costs well under a microsecond.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  constexpr int kHeadsPerCta = kHeadGroups * portable::kHeadsPerGroup;
  const dim3 grid(static_cast<unsigned>(params.num_tokens),
                  static_cast<unsigned>((params.num_heads + kHeadsPerCta - 1) / kHeadsPerCta));
  kernel<<<grid, kThreads, smem_bytes, stream>>>(params, num_stages);
  return cudaGetLastError();
}

}  // namespace swa_decode
