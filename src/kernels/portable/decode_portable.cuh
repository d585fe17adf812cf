// Portable tensor-core decode kernel: mma.sync m16n8k16 bf16, cp.async, ldmatrix (sm_80 and newer).
//
// Grid: (token, block of 16 * kHeadGroups heads). One CTA gathers and dequantizes each valid KV row
// of its token once for all the heads it holds. Each 16-head group is split over 4 warps by head-dim
// quarters (128 dims each) so that a warp's output accumulator is 16 x 128 fp32 = 64 registers
// instead of 256; the 4 partial score tiles are summed through shared memory, in the stage the tile
// was dequantized from. q waits in shared memory as ready-made A fragments, so a thread needs at
// most 128 registers and two CTAs share an SM: one CTA's barriers and gather latency hide under the
// other's matmuls (docs/perf-notes.md, portable v5). Keys stream in tiles of 32 with an online
// softmax through a ring of 2-4 staging buffers.
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
  alignas(16) uint4 q_frags[kWarps][kDimsPerWarp / 16][32];      // [warp][k-step][lane]: A fragments
  int warp_counts[kWarps];
};

static_assert(sizeof(SmemPlan<1>) <= fixed_smem_bytes(1) && sizeof(SmemPlan<2>) <= fixed_smem_bytes(2),
              "portable_plan.h must cover the fixed shared-memory plan");

// Byte offset of 16-byte chunk `chunk` of key row `key` in SmemPlan::kv. XOR-ing the chunk's low 3
// bits with the row makes the 8 rows an ldmatrix reads land in 8 different bank groups.
__device__ __forceinline__ uint32_t kv_chunk_offset(int key, int chunk) {
  return static_cast<uint32_t>(key * (kHeadDim * 2) + ((chunk ^ (key & 7)) * kChunkBytes));
}

// ldmatrix addresses. Every row a lane addresses has row & 7 == lane & 7 (rows step by 8), so
// chunk ^ (row & 7) splits into a lane constant (bit 0 and the quarter's 16-chunk block), a term in
// 4 register values (bits 1-2) and immediates (bit 3, the row step): 4 registers per matmul
// instead of 16 full addresses, which is what keeps the kernel within 128 registers.
struct SwizzledRows {
  uint32_t addr[4];  // [(step / 2) & 3]: the remaining terms are immediates
};
// first_row: the lane's row at step 0; chunk_base: its first chunk (even, a multiple of 16 plus
// the lane's own bit 0). Chunk c = chunk_base + 2 j + 8 k lives at addr[j] + 128 k.
__device__ __forceinline__ SwizzledRows swizzled_rows(uint32_t tile_base, int first_row, int chunk_base) {
  const int x = first_row & 7;
  const uint32_t row = tile_base + first_row * (kHeadDim * 2) + (((chunk_base & ~1) | ((chunk_base & 1) ^ (x & 1))) * kChunkBytes);
  SwizzledRows rows;
#pragma unroll
  for (int j = 0; j < 4; ++j) rows.addr[j] = row + ((j ^ (x >> 1)) * 2 * kChunkBytes);
  return rows;
}

// Byte offset of 16-byte chunk `chunk` of raw row `row` in a staging buffer, swizzled the same way
// so that 8 threads dequantizing the same chunk of 8 consecutive rows read 8 different bank groups.
__device__ __forceinline__ uint32_t staging_chunk_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * kHeadDim + ((chunk ^ (row & 7)) * kChunkBytes));
}

// Largest power of two <= 16 that divides every cache-row address: the cp.async width.
__device__ __forceinline__ int kv_copy_width(const DecodeParams& p) {
  const uint64_t bits = reinterpret_cast<uint64_t>(p.kv_cache) | static_cast<uint64_t>(p.stride_kv_block) |
                        static_cast<uint64_t>(p.stride_kv_token);
  return (bits & 15) == 0 ? 16 : (bits & 7) == 0 ? 8 : 4;
}

// Eight threads per row, each copying every eighth 16-byte chunk (in pieces of kWidth bytes) of
// one row per pass: with rows 8 apart per step, (chunk ^ row & 7) is the thread's first swizzled
// chunk plus 8 i, so every destination is one register plus an immediate.
template <int kThreads, int kWidth>
__device__ __forceinline__ void issue_tile_copy_width(const DecodeParams& p, const int64_t* s_row_offset,
                                                      int num_valid, int tile, uint8_t* staging) {
  constexpr int kThreadsPerRow = 8;
  constexpr int kRowsPerPass = kThreads / kThreadsPerRow;
  constexpr int kChunksPerThread = kHeadDim / kChunkBytes / kThreadsPerRow;  // 4
  static_assert(kRowsPerPass % 8 == 0 && kKeysPerTile % kRowsPerPass == 0, "rows 8 apart keep row & 7");
  const int first_row = static_cast<int>(threadIdx.x) / kThreadsPerRow;
  const int first_chunk = static_cast<int>(threadIdx.x) % kThreadsPerRow;
  const uint32_t dst_first = ptx::smem_addr(staging) + staging_chunk_offset(first_row, first_chunk);
#pragma unroll
  for (int pass = 0; pass < kKeysPerTile / kRowsPerPass; ++pass) {
    const int row = first_row + pass * kRowsPerPass;
    const int key = tile * kKeysPerTile + row;
    const bool valid = key < num_valid;
    // A masked row copies nothing (src-size 0 zero-fills) from an address that stays in bounds.
    const uint8_t* src_row = (valid ? p.kv_cache + s_row_offset[key] : p.kv_cache) + first_chunk * kChunkBytes;
    const uint32_t src_bytes = valid ? kWidth : 0;
    const uint32_t dst_row = dst_first + pass * kRowsPerPass * kHeadDim;
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const uint32_t dst = dst_row + i * kThreadsPerRow * kChunkBytes;
      const uint8_t* src = src_row + i * kThreadsPerRow * kChunkBytes;
      if constexpr (kWidth == 16) {
        ptx::cp_async_16(dst, src, src_bytes);
      } else {
#pragma unroll
        for (int piece = 0; piece < kChunkBytes; piece += kWidth) {
          asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst + piece), "l"(src + piece),
                       "n"(kWidth), "r"(src_bytes));
        }
      }
    }
  }
}

// Starts the copy of tile `tile`'s raw rows into `staging`; rows past num_valid are zero-filled.
// Always commits a group (possibly empty) so the ring's wait counts stay uniform.
template <int kThreads>
__device__ __forceinline__ void issue_tile_copy(const DecodeParams& p, const int64_t* s_row_offset, int num_valid,
                                                int tile, uint8_t* staging, int width) {
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
// Lane l takes row l, warp w the 32-dim groups w, w + kWarps, ...: with both buffers swizzled, each
// quarter-warp's 16-byte loads and stores touch 8 different bank groups (no conflicts), and since
// a group index only moves bits above the swizzle's, all addresses are a few registers + immediates.
template <int kWarps>
__device__ __forceinline__ void dequantize_tile(const uint8_t* staging, uint8_t* kv_bytes, int warp, int lane) {
  constexpr int kGroupsPerRow = kHeadDim / kDimGroup;  // 16
  static_assert(kWarps == 4 || kWarps == 8, "group steps of 4 or 8 leave the low 3 chunk bits alone");
  const int x = lane & 7;
  // Raw chunks 2g and 2g + 1 of row `lane`; bf16 chunks 4g + a.
  const uint8_t* src_lo = staging + lane * kHeadDim + (((2 * warp) ^ x) * kChunkBytes);
  const uint8_t* src_hi = staging + lane * kHeadDim + (((2 * warp) ^ x ^ 1) * kChunkBytes);
  uint8_t* dst = kv_bytes + lane * (kHeadDim * 2);
  const int dst_chunk = (4 * warp) ^ x;
#pragma unroll
  for (int i = 0; i < kGroupsPerRow / kWarps; ++i) {
    const int step = i * kWarps;  // group = warp + step
    const uint4 lo = *reinterpret_cast<const uint4*>(src_lo + 2 * step * kChunkBytes);
    const uint4 hi = *reinterpret_cast<const uint4*>(src_hi + 2 * step * kChunkBytes);
    const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      uint32_t pairs01, pairs23;
      gather_logical_chunk_e4m3(words, a, pairs01, pairs23);
      uint4 chunk;
      e4m3x4_to_bf16x4(pairs01, chunk.x, chunk.y);
      e4m3x4_to_bf16x4(pairs23, chunk.z, chunk.w);
      // == kv_chunk_offset(lane, 4 (warp + step) + a): 4 step and a miss the swizzled bits' overlap
      *reinterpret_cast<uint4*>(dst + (((dst_chunk ^ a) + 4 * step) * kChunkBytes)) = chunk;
    }
  }
}

// 2^x for x <= 0 or -inf (scores minus their running max): one MUFU.EX2, no range fix-up. Results
// below 2^-126 flush to 0, which the softmax cannot tell from the exact value next to the max's 1.
__device__ __forceinline__ float exp2_nonpositive(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
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

// Two CTAs per SM (portable_plan.h sizes shared memory for that): at two head groups (256 threads)
// that caps a thread at 128 registers; one group (128 threads) has registers to spare.
template <int kHeadGroups>
__global__ void __launch_bounds__(kHeadGroups * kWarpsPerGroup * 32, 2)
    decode_portable_kernel(const __grid_constant__ DecodeParams p, int num_stages) {
  constexpr int kThreads = kHeadGroups * kWarpsPerGroup * 32;
  using Smem = SmemPlan<kHeadGroups>;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Smem& smem = *reinterpret_cast<Smem*>(smem_raw);
  const RingPlan ring = ring_plan(kHeadGroups, num_stages, p.window_size);
  uint8_t* const staging = smem_raw + ring.staging_offset;
  int64_t* s_row_offset = reinterpret_cast<int64_t*>(smem_raw + ring.row_offset_offset);
  float* s_inv_scale = reinterpret_cast<float*>(smem_raw + ring.inv_scale_offset);

  // CTAs start in blockIdx.x-fastest order; numbering them token-major makes the head blocks of
  // one token neighbours, so their gathers of the same window rows meet in L2 instead of HBM.
  const int64_t cta = blockIdx.x + static_cast<int64_t>(blockIdx.y) * gridDim.x;
  const int token = static_cast<int>(cta / gridDim.y);
  const int head_block = static_cast<int>(cta % gridDim.y);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int quarter = warp % kWarpsPerGroup;
  const int group = warp / kWarpsPerGroup;
  const int head_base = (head_block * kHeadGroups + group) * kHeadsPerGroup;
  const int frag_row = lane / 4;   // g: fragment rows g and g + 8
  const int frag_quad = lane % 4;  // q: fragment columns 2q, 2q + 1
  const int head_lo = head_base + frag_row;
  const int head_hi = head_lo + 8;
  const int dim_base = quarter * kDimsPerWarp;

  // q fragments first (their latency hides under the index compaction below), parked in shared
  // memory in register order: each lane later reloads its own 16 bytes per k-step, conflict-free.
  {
    const __nv_bfloat16* q_token = p.q + token * p.stride_q_token + dim_base + 8 * frag_quad;
#pragma unroll
    for (int c = 0; c < kDimsPerWarp / kDimGroup; ++c) {
      const uint4 zero = make_uint4(0, 0, 0, 0);
      const uint4 lo = head_lo < p.num_heads ? ptx::ld_global_nc_v4(q_token + head_lo * p.stride_q_head + c * kDimGroup) : zero;
      const uint4 hi = head_hi < p.num_heads ? ptx::ld_global_nc_v4(q_token + head_hi * p.stride_q_head + c * kDimGroup) : zero;
      const QFragmentPair pair = q_words_to_fragments(lo, hi);
      smem.q_frags[warp][2 * c][lane] = make_uint4(pair.kstep0[0], pair.kstep0[1], pair.kstep0[2], pair.kstep0[3]);
      smem.q_frags[warp][2 * c + 1][lane] = make_uint4(pair.kstep1[0], pair.kstep1[1], pair.kstep1[2], pair.kstep1[3]);
    }
  }

  // The compaction's barriers also order the q stores above before their reloads in the tile loop.
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
  const int matrix = lane / 8;  // which 8x8 matrix of an ldmatrix.x4 this lane addresses
  const SwizzledRows qk_rows =
      swizzled_rows(kv_base, 8 * (matrix >> 1) + (lane & 7), quarter * (kDimsPerWarp / 8) + (matrix & 1));
  const SwizzledRows pv_rows =
      swizzled_rows(kv_base, 8 * (matrix & 1) + (lane & 7), quarter * (kDimsPerWarp / 8) + (matrix >> 1));
  for (int tile = 0; tile < num_stages - 1; ++tile) {
    issue_tile_copy<kThreads>(p, s_row_offset, num_valid, tile, staging + tile * kStageBytes, copy_width);
  }
  // Byte offsets in the ring of this tile's stage and of the one refilled this iteration (the
  // previous tile's), stepped without a runtime modulo.
  int read_offset = 0;
  int refill_offset = (num_stages - 1) * kStageBytes;
  for (int tile = 0; tile < num_tiles; ++tile) {
    cp_async_wait_pending(num_stages - 2);
    // This tile's rows landed for all threads; every warp is done with the previous tile: its PV
    // (smem.kv) and its partial scores (in the stage refilled next).
    __syncthreads();
    issue_tile_copy<kThreads>(p, s_row_offset, num_valid, tile + num_stages - 1, staging + refill_offset, copy_width);
    dequantize_tile<Smem::kWarps>(staging + read_offset, reinterpret_cast<uint8_t*>(&smem.kv[0][0]), warp, lane);
    __syncthreads();

    // Partial scores over this warp's 128 dims: S[16 heads][32 keys].
    float s_acc[kKeysPerTile / 8][4];
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n) s_acc[n][0] = s_acc[n][1] = s_acc[n][2] = s_acc[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kDimsPerWarp / 16; ++ks) {
      const uint4 a = smem.q_frags[warp][ks][lane];
      const uint32_t q_frag[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int n = 0; n < kKeysPerTile / 8; n += 2) {
        // == kv_base + kv_chunk_offset(8 (n + matrix / 2) + lane % 8, quarter * 16 + 2 ks + matrix % 2)
        const uint32_t addr = qk_rows.addr[ks & 3] + (ks >> 2) * 8 * kChunkBytes + n * 8 * (kHeadDim * 2);
        uint32_t b0, b1, b2, b3;
        ptx::ldmatrix_x4(addr, b0, b1, b2, b3);
        ptx::mma_bf16_16816(s_acc[n], q_frag, b0, b1);
        ptx::mma_bf16_16816(s_acc[n + 1], q_frag, b2, b3);
      }
    }
    // Sum the group's 4 partials through the stage this tile came from (dequantized, so free):
    // [fragment reg][lane][4 quarters], each lane's quarters rotated by lane / 8 so that a warp's
    // 32 stores hit 32 banks; the reader adds all 4 in one 16-byte load, order irrelevant.
    float* exchange = reinterpret_cast<float*>(staging + read_offset) + group * (16 * 32 * kWarpsPerGroup);
    const int rotated_quarter = (quarter + lane / 8) % kWarpsPerGroup;
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) exchange[((n * 4 + r) * 32 + lane) * kWarpsPerGroup + rotated_quarter] = s_acc[n][r];
    __syncthreads();
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float4 parts = *reinterpret_cast<const float4*>(&exchange[((n * 4 + r) * 32 + lane) * kWarpsPerGroup]);
        s_acc[n][r] = (parts.x + parts.y) + (parts.z + parts.w);
      }

    // Scores in the log2 domain; the per-token inverse scale factors out of q . e4m3.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = tile * kKeysPerTile + 8 * n + 2 * frag_quad + e;
        const bool valid = key < num_valid;
        const float factor = valid ? logit_scale * s_inv_scale[key] : 0.0f;
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
      alpha[h] = exp2_nonpositive(row_max[h] - new_max);
      row_max[h] = new_max;
      row_sum[h] *= alpha[h];
    }
    // Rescaling by exactly 1 changes nothing: skip the 64 multiplies when no row's max moved.
    if (__any_sync(0xFFFFFFFFu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int n = 0; n < kDimsPerWarp / 8; ++n) {
        o_acc[n][0] *= alpha[0];
        o_acc[n][1] *= alpha[0];
        o_acc[n][2] *= alpha[1];
        o_acc[n][3] *= alpha[1];
      }
    }
    uint32_t p_frag[kKeysPerTile / 16][4];
#pragma unroll
    for (int n = 0; n < kKeysPerTile / 8; ++n) {
      float prob[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        prob[r] = exp2_nonpositive(s_acc[n][r] - row_max[r / 2]);
        row_sum[r / 2] += prob[r];
      }
      // The numerator carries the inverse scale: out = sum_j (p_j * inv_scale_j) * e4m3_j. Reloaded
      // (a broadcast read) rather than kept from the scores: registers are the limit here.
      // Past num_valid the probability is already 0 and the entry of s_inv_scale is never read.
      const int key = tile * kKeysPerTile + 8 * n + 2 * frag_quad;
      const float scale0 = key < num_valid ? s_inv_scale[key] : 0.0f;
      const float scale1 = key + 1 < num_valid ? s_inv_scale[key + 1] : 0.0f;
      p_frag[n / 2][(n & 1) * 2 + 0] = pack_bf16x2(prob[0] * scale0, prob[1] * scale1);
      p_frag[n / 2][(n & 1) * 2 + 1] = pack_bf16x2(prob[2] * scale0, prob[3] * scale1);
    }

    // O[16 heads][this warp's 128 dims] += P[16][32 keys] * V[32 keys][128 dims].
#pragma unroll
    for (int ks = 0; ks < kKeysPerTile / 16; ++ks) {
#pragma unroll
      for (int n = 0; n < kDimsPerWarp / 8; n += 2) {
        // == kv_base + kv_chunk_offset(16 ks + 8 (matrix % 2) + lane % 8, quarter * 16 + n + matrix / 2)
        const uint32_t addr = pv_rows.addr[(n / 2) & 3] + (n / 8) * 8 * kChunkBytes + ks * 16 * (kHeadDim * 2);
        uint32_t b0, b1, b2, b3;
        ptx::ldmatrix_x4_trans(addr, b0, b1, b2, b3);
        ptx::mma_bf16_16816(o_acc[n], p_frag[ks], b0, b1);
        ptx::mma_bf16_16816(o_acc[n + 1], p_frag[ks], b2, b3);
      }
    }
    refill_offset = read_offset;
    read_offset = read_offset + kStageBytes == num_stages * kStageBytes ? 0 : read_offset + kStageBytes;
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
  // x: tokens (up to 2^31 - 1), y: head blocks (up to 8); the kernel renumbers them token-major.
  const dim3 grid(static_cast<unsigned>(params.num_tokens),
                  static_cast<unsigned>((params.num_heads + kHeadsPerCta - 1) / kHeadsPerCta));
  kernel<<<grid, kThreads, smem_bytes, stream>>>(params, num_stages);
  return cudaGetLastError();
}

}  // namespace swa_decode
