// Consumer warpgroups of the Hopper layer kernel: per tile S = Q K^T against the item's resident q,
// an online softmax across the item's tiles, O += P V on this warpgroup's 256-dim half; after the
// item's last tile the sink, lse and 16-byte output stores. Consumer 0 computes S once and hands P
// to consumer 1 (ConsumerExchange, sm90_layer_plan.h).
#pragma once

#include <cstdint>

#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/common/softmax_finalize.cuh"
#include "src/kernels/sm90/sm90_consumer.cuh"
#include "src/kernels/sm90/sm90_gmma.cuh"
#include "src/kernels/sm90/sm90_layer_plan.h"
#include "src/kernels/sm90/sm90_layer_pair.cuh"
#include "src/kernels/sm90/sm90_layer_schedule.cuh"
#include "src/kernels/sm90/sm90_layer_split.cuh"
#include "src/kernels/sm90/sm90_plan.h"

namespace swa_decode::sm90 {

// The running max of a row moves only when a subtile's max exceeds it by more than this (log2
// units), as FlashAttention-4 does: until then p = 2^(x - row_max) may reach 2^8, which bf16 and
// fp32 hold with their usual relative precision, and both consumers skip O's rescale (128
// multiplies each, the first of them on consumer 0's chain). The result is the same sum over
// another base: finalize_row uses the base the probabilities were taken against. The move is a
// select, not a branch: branched, it made seed rows 3-4% slower (perf-notes, layer v13).
inline constexpr float kLazyRescaleLog2 = 8.0f;

// S -> P of one half tile (64 keys) for the fragment's two rows (head_lo, head_hi) in the log2
// domain (scale_scores, scores_to_p), folded into the item's running max and sum. The half tile's
// max is quad-reduced, so the four lanes of a row agree; where it exceeds row_max by more than
// kLazyRescaleLog2 (always on the item's first tile with an entry, row_max -inf), row_max takes it
// and row_sum (this lane's share of sum 2^(x - row_max), unscaled by inv_scale) is rescaled before
// it gains the half tile's probabilities. Returns, per row, the factor O must be multiplied by:
// 2^(old max - new max), 0 on the item's first tile, 1 where the max did not move.
__device__ __forceinline__ void subtile_softmax(float (&s)[kSubtileKeys / 2], const float* inv_scale, int num_valid,
                                                float logit_scale, int frag_quad, float (&row_max)[2],
                                                float (&row_sum)[2], uint32_t (&p_frag)[kSubtileKeys / 16][4],
                                                float (&rescale)[2]) {
  float tile_max[2] = {-INFINITY, -INFINITY};
  scale_scores(s, inv_scale, num_valid, logit_scale, frag_quad, tile_max);
  float base[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float tile = quad_max(tile_max[h]);
    const float new_max = tile > row_max[h] + kLazyRescaleLog2 ? tile : row_max[h];
    // Every score -inf (no entry can give that, only inf inputs): base 0 keeps -inf - -inf from
    // turning p or the rescale into NaN.
    base[h] = new_max == -INFINITY ? 0.0f : new_max;
    rescale[h] = exp2f(row_max[h] - base[h]);
    row_sum[h] *= rescale[h];
    row_max[h] = new_max;
  }
  scores_to_p(s, inv_scale, num_valid, frag_quad, base, row_sum, p_frag);
}

// ConsumerExchange: staging's rows from kExchangeFirstRow on, which no gather stages into.
__device__ __forceinline__ ConsumerExchange& consumer_exchange(LayerSmemPlan& smem) {
  return *reinterpret_cast<ConsumerExchange*>(&smem.staging[kExchangeFirstRow][0]);
}

// Consumer 0 hands a subtile's P and rescale factors to consumer 1: once consumer 1's PV has read
// the previous ones (p_empty), each lane writes its P fragment words where a K-major,
// 128-byte-swizzled A operand has them (head row h at 128 h, the 16-byte chunk of keys 8 c ..
// 8 c + 7 at chunk c ^ (h % 8)) and the quad's first lane its two rows' factors, then fences them
// for the async proxy (consumer 1's wgmma) and arrives on p_full.
// The addresses come from threadIdx.x read anew here: with the 16 word addresses derived once and
// held across the tile loop, ptxas spilled the consumers 88 B at 216 registers (CUDA 13.0).
__device__ __forceinline__ void hand_over_p(ConsumerExchange& exchange, PipeState<1>& use,
                                            const uint32_t (&p_frag)[kSubtileKeys / 16][4], const float (&rescale)[2]) {
  ptx::mbarrier_wait(&exchange.p_empty, use.phase ^ 1u);
  const int wtid = ptx::thread_index_x_unhoisted() % kWarpgroupThreads;
  const int frag_row = (wtid % 32) / 4;
  const int row_lo = (wtid / 32) * 16 + frag_row;  // row hi is 8 rows (1 KiB) further
  // Row lo's word in chunk 0 with the swizzle folded in: exchange.p is 1024-aligned and its rows
  // 128 B, so bits 4-6 of the address hold frag_row, and chunk c's word is this XOR (c << 4).
  const uint32_t lo_word = ptx::smem_addr(exchange.p) + static_cast<uint32_t>(row_lo) * kRowBytes +
                           static_cast<uint32_t>(frag_row << 4) + 4 * static_cast<uint32_t>(wtid % 4);
#pragma unroll
  for (int ks = 0; ks < kSubtileKeys / 16; ++ks)
#pragma unroll
    for (int r = 0; r < 4; ++r) {  // p_frag[ks][r]: row lo (r even) or hi, keys 16 ks + 8 (r / 2) + 2 q, + 1
      const uint32_t word = lo_word ^ static_cast<uint32_t>((2 * ks + r / 2) << 4);
      if (r & 1) {
        ptx::st_shared_u32<8 * kRowBytes>(word, p_frag[ks][r]);
      } else {
        ptx::st_shared_u32(word, p_frag[ks][r]);
      }
    }
  if (wtid % 4 == 0) {
    exchange.rescale[row_lo] = rescale[0];
    exchange.rescale[row_lo + 8] = rescale[1];
  }
  ptx::fence_proxy_async_shared();
  ptx::mbarrier_arrive(&exchange.p_full);
  use.advance();
}

// A consumer's half of the item's out, rows head_lo and head_lo + 8: O times each row's out factor.
// o_started false (no tile with entries): o still holds whatever it held, and out must be exactly
// 0, never 0 * NaN.
__device__ __forceinline__ void store_item_half(const DecodeParams& p, float (&o)[128], bool o_started,
                                                const float (&out_factor)[2], int token, int head_lo, int half,
                                                int frag_quad) {
  if (!o_started) {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) store_out_row_half(p, o, r, out_factor[r], token, head_lo + 8 * r, half, frag_quad);
}

// O *= rescale per row, o[4 n + 2 r + e] being row r's; a warp whose rows all kept their max skips
// the 128 multiplies.
__device__ __forceinline__ void rescale_accumulators(float (&o)[128], const float (&rescale)[2]) {
  if (__any_sync(0xFFFFFFFFu, rescale[0] != 1.0f || rescale[1] != 1.0f)) {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= rescale[(i / 2) % 2];
  }
}

// The two consumer warpgroups hold the item's 64 heads and own one 256-dim half of O each, whose
// 128 fp32 accumulators live across the item's tiles. Consumer 0 (this one, dims 0-255) computes
// each subtile's S and the softmax, hands P to consumer 1 (run_value_consumer), and writes lse. In
// a pair (LayerPair), half of every stage comes from the peer CTA's gather warps, and the peer's
// gather warps wait for these consumers too.
template <class Pair>
__device__ __forceinline__ void run_scoring_consumer(const DecodeParams& p, LayerSmemPlan& smem, LayerSmemSync& sync,
                                                     int rank) {
  constexpr int kHalf = 0;
  const int wtid = threadIdx.x % kWarpgroupThreads;
  const int warp = wtid / 32;
  const int lane = wtid % 32;
  const int frag_row = lane / 4;
  const int frag_quad = lane % 4;
  const int slab = slab_of_cta<Pair>(rank);
  const ItemOrder& order = item_order(smem);
  const int items = order.count;
  const float logit_scale = p.scale * kLog2e;
  ConsumerExchange& exchange = consumer_exchange(smem);
  PipeState<2> meta;
  PipeState<kKvStages> kv;
  PipeState<1> q;
  PipeState<1> p_use;
  PipeState<1> final_use;
  float o[128];
  // The slab's sinks (two 128-byte lines of 32 heads) into L1 now, so that the read after the
  // item's last subtile (or the split's park) hits L1 instead of waiting ~0.5-1 us on L2 with both
  // consumers stalled behind it.
  if (p.attn_sink != nullptr && lane == 0 && warp < 2 && slab * kSlabHeads + warp * 32 < p.num_heads) {
    ptx::prefetch_l1(p.attn_sink + slab * kSlabHeads + warp * 32);
  }
  for (int k = 0; k < items; ++k) {
    const int token = item_token(order, k);
    const int head_lo = slab * kSlabHeads + warp * 16 + frag_row;
    const int head_hi = head_lo + 8;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.0f, 0.0f};
    bool o_started = false;   // o holds this item's sum: a tile with entries has been multiplied
    bool q_released = false;  // the last tile's S has handed q back for the next item
    bool has_q = false;
    bool last = false;
    while (!last) {
      ptx::mbarrier_wait(&sync.meta_full[meta.index], meta.phase);
      const TileRecord record = sync.record[meta.index];
      last = record.last != 0;
      has_q = record.has_q != 0;
      if (record.num_valid == 0) {  // nothing gathered for it: no K/V tile, no S
        ptx::mbarrier_arrive(&sync.meta_empty[meta.index]);
        meta.advance();
        continue;
      }

      // ---- the tile in subtiles of 64 keys, one K/V stage each: S = Q K^T over 8 chunks of 64
      // dims, the online softmax, O = O * rescale + P V over this warpgroup's half. On the item's
      // last subtile each chunk of q is handed back as soon as the last wgmma reading it
      // completed, so the next item's q streams in under this S.
      const float* inv_scale = smem.inv_scale[meta.index];
      const int subtiles = (record.num_valid + kSubtileKeys - 1) / kSubtileKeys;
      for (int sub = 0; sub < subtiles; ++sub) {
        const bool final_sub = sub == subtiles - 1;
        const bool hands_back_q = last && final_sub;
        // Zeroed although the first wgmma overwrites it: without a definition here the compiler
        // keeps the previous S live (as the wgmma's input) through the PV below.
        float s[kSubtileKeys / 2];
#pragma unroll
        for (int i = 0; i < kSubtileKeys / 2; ++i) s[i] = 0.0f;
        fence_accumulators(s);
        wait_pair_phase<Pair>(&sync.kv_full[kv.index], kv.phase);
        // Chunk c of q and of the stage's keys lie c blocks from their first.
        const uint64_t desc_q = k_major_desc(ptx::smem_addr(smem.q[0]));
        const uint64_t desc_k = k_major_desc(ptx::smem_addr(smem.kv[kv.index][0][0]));
#pragma unroll
        for (int c = 0; c < kQChunks; ++c) {
          ptx::mbarrier_wait(&sync.q_full[c], q.phase);  // returns at once after the item's first subtile
          cute::warpgroup_arrive();
          gmma_qk_chunk_desc(s, ptx::advance_smem_desc(desc_q, c * kQChunkBytes),
                             ptx::advance_smem_desc(desc_k, c * kSubtileKeys * kRowBytes), c != 0);
          cute::warpgroup_commit_batch();
          if (c >= 1) {
            cute::warpgroup_wait<1>();
            if (hands_back_q) ptx::mbarrier_arrive(&sync.q_empty[c - 1]);
          }
        }
        cute::warpgroup_wait<0>();
        fence_accumulators(s);
        if (hands_back_q) {
          ptx::mbarrier_arrive(&sync.q_empty[kQChunks - 1]);
          q_released = true;
        }

        uint32_t p_frag[kSubtileKeys / 16][4];
        float rescale[2];
        subtile_softmax(s, inv_scale + sub * kSubtileKeys, record.num_valid - sub * kSubtileKeys, logit_scale,
                        frag_quad, row_max, row_sum, p_frag, rescale);
        if (final_sub) ptx::mbarrier_arrive(&sync.meta_empty[meta.index]);  // its scales are read

        if (o_started) rescale_accumulators(o, rescale);
        fence_accumulators(o);
#pragma unroll
        for (int ks = 0; ks < kSubtileKeys / 16; ++ks)
#pragma unroll
          for (int r = 0; r < 4; ++r) cute::warpgroup_fence_operand(p_frag[ks][r]);
        cute::warpgroup_arrive();
        gmma_pv_keys<kSubtileKeys / 16, kSubtileKeys * kRowBytes, DescriptorSteps::kAdvance>(
            o, p_frag, ptx::smem_addr(smem.kv[kv.index][kHalf * kBlocksPerHalf][0]), o_started);
        cute::warpgroup_commit_batch();
        // P goes to consumer 1 while this PV runs: the stores only read p_frag, which the wgmma reads too.
        hand_over_p(exchange, p_use, p_frag, rescale);
        cute::warpgroup_wait<0>();
        fence_accumulators(o);
        release_stage<Pair>(&sync.kv_empty[kv.index], rank);
        kv.advance();
        o_started = true;
      }
      meta.advance();
    }
    if (has_q) {
      if (!q_released) {  // no tile of the item had an entry: its q landed and is handed back unread
        for (int c = 0; c < kQChunks; ++c) {
          ptx::mbarrier_wait(&sync.q_full[c], q.phase);
          ptx::mbarrier_arrive(&sync.q_empty[c]);
        }
      }
      q.advance();
    }

    if constexpr (Pair::kSplitKeys) {  // this CTA's share of the token: its partials, combined later
      const float stats[2][2] = {{row_max[0], quad_sum(row_sum[0])}, {row_max[1], quad_sum(row_sum[1])}};
      wait_peer_done_with_stages<Pair>(sync, kv);
      park_layer_partials(p, smem, o, o_started, kHalf, stats, slab * kSlabHeads);
      continue;
    }

    // ---- the sink, lse and out (an item without entries: sum 0, so out 0 and lse p.empty_token_lse) ----
    // The sinks are read here, not held in registers across the tiles: after the first item they
    // come from L1.
    const float sink_lo = p.attn_sink != nullptr && head_lo < p.num_heads ? p.attn_sink[head_lo] : -INFINITY;
    const float sink_hi = p.attn_sink != nullptr && head_hi < p.num_heads ? p.attn_sink[head_hi] : -INFINITY;
    FinalizedRow fin[2];
    fin[0] = finalize_row(row_max[0], quad_sum(row_sum[0]), sink_lo, p.empty_token_lse);
    fin[1] = finalize_row(row_max[1], quad_sum(row_sum[1]), sink_hi, p.empty_token_lse);
    if (p.lse != nullptr && frag_quad == 0) {
      if (head_lo < p.num_heads) p.lse[token * p.stride_lse_token + head_lo] = fin[0].lse;
      if (head_hi < p.num_heads) p.lse[token * p.stride_lse_token + head_hi] = fin[1].lse;
    }
    ptx::mbarrier_wait(&exchange.final_empty, final_use.phase ^ 1u);  // consumer 1 read the previous item's
    if (frag_quad == 0) {
      exchange.out_factor[warp * 16 + frag_row] = fin[0].out_factor;
      exchange.out_factor[warp * 16 + frag_row + 8] = fin[1].out_factor;
    }
    ptx::mbarrier_arrive(&exchange.final_full);
    final_use.advance();
    store_item_half(p, o, o_started, {fin[0].out_factor, fin[1].out_factor}, token, head_lo, kHalf, frag_quad);
  }
}

// Consumer 1: walks the same records and subtiles as consumer 0, and per subtile waits for its P
// (p_full), rescales its half of O by the factors that came with it and multiplies P V on dims
// 256-511 with P read from shared memory; after an item, stores its half with the out factors
// consumer 0 handed over. It reads neither q nor the inverse scales.
template <class Pair>
__device__ __forceinline__ void run_value_consumer(const DecodeParams& p, LayerSmemPlan& smem, LayerSmemSync& sync,
                                                   int rank) {
  constexpr int kHalf = 1;
  const int wtid = threadIdx.x % kWarpgroupThreads;
  const int warp = wtid / 32;
  const int frag_row = (wtid % 32) / 4;
  const int frag_quad = wtid % 4;
  const int row_lo = warp * 16 + frag_row;  // of the slab's 64 heads
  const int slab = slab_of_cta<Pair>(rank);
  const ItemOrder& order = item_order(smem);
  const int items = order.count;
  ConsumerExchange& exchange = consumer_exchange(smem);
  PipeState<2> meta;
  PipeState<kKvStages> kv;
  PipeState<1> p_use;
  PipeState<1> final_use;
  float o[128];
  for (int k = 0; k < items; ++k) {
    const int token = item_token(order, k);
    const int head_lo = slab * kSlabHeads + row_lo;
    bool o_started = false;
    bool last = false;
    while (!last) {
      ptx::mbarrier_wait(&sync.meta_full[meta.index], meta.phase);
      const TileRecord record = sync.record[meta.index];
      ptx::mbarrier_arrive(&sync.meta_empty[meta.index]);  // only the record is read here
      last = record.last != 0;
      const int subtiles = (record.num_valid + kSubtileKeys - 1) / kSubtileKeys;
      for (int sub = 0; sub < subtiles; ++sub) {
        wait_pair_phase<Pair>(&sync.kv_full[kv.index], kv.phase);
        ptx::mbarrier_wait(&exchange.p_full, p_use.phase);
        const float rescale[2] = {exchange.rescale[row_lo], exchange.rescale[row_lo + 8]};
        if (o_started) rescale_accumulators(o, rescale);
        fence_accumulators(o);
        cute::warpgroup_arrive();
        gmma_pv_keys_shared_p<kSubtileKeys / 16, kSubtileKeys * kRowBytes>(
            o, ptx::smem_addr(exchange.p), ptx::smem_addr(smem.kv[kv.index][kHalf * kBlocksPerHalf][0]), o_started);
        cute::warpgroup_commit_batch();
        cute::warpgroup_wait<0>();
        fence_accumulators(o);
        ptx::mbarrier_arrive(&exchange.p_empty);
        p_use.advance();
        release_stage<Pair>(&sync.kv_empty[kv.index], rank);
        kv.advance();
        o_started = true;
      }
      meta.advance();
    }
    if constexpr (Pair::kSplitKeys) {  // this CTA's share of the token: its partials, combined later
      wait_peer_done_with_stages<Pair>(sync, kv);
      park_layer_partials(p, smem, o, o_started, kHalf, nullptr, slab * kSlabHeads);
      continue;
    }
    ptx::mbarrier_wait(&exchange.final_full, final_use.phase);
    const float out_factor[2] = {exchange.out_factor[row_lo], exchange.out_factor[row_lo + 8]};
    ptx::mbarrier_arrive(&exchange.final_empty);
    final_use.advance();
    store_item_half(p, o, o_started, out_factor, token, head_lo, kHalf, frag_quad);
  }
}

}  // namespace swa_decode::sm90
