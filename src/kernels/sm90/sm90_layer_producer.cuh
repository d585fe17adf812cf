// Producer warpgroup of the Hopper layer kernel: warp 3 compacts each item's tiles a tile ahead
// and loads the item's q; warps 0-2 gather and dequantize each tile into the K/V tile, a 256-dim
// half at a time (the window kernel's gather and dequantization, sm90_producer.cuh).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/common/window_compaction.cuh"
#include "src/kernels/sm90/sm90_layer_plan.h"
#include "src/kernels/sm90/sm90_plan.h"
#include "src/kernels/sm90/sm90_producer.cuh"

namespace swa_decode::sm90 {

// Work items of this CTA: blockIdx.x, blockIdx.x + gridDim.x, ... below num_items.
__device__ __forceinline__ int layer_items(const DecodeParams& p) { return p.num_tokens * layer_slabs(p.num_heads); }
__device__ __forceinline__ int items_of_this_cta(const DecodeParams& p) {
  const int num_items = layer_items(p);
  return static_cast<int>(blockIdx.x) < num_items ? (num_items - 1 - static_cast<int>(blockIdx.x)) / gridDim.x + 1 : 0;
}

// The 8 TMA boxes of the item's q (64 dims x 64 heads each; heads past num_heads are zero-filled).
// Chunk c is reloaded as soon as both consumers are done with the previous item's last S on it.
__device__ __forceinline__ void load_item_q(const CUtensorMap& q_map, LayerSmemPlan& smem, LayerSmemSync& sync,
                                            const PipeState<1>& q_load, int token, int slab) {
#pragma unroll 1
  for (int c = 0; c < kQChunks; ++c) {
    ptx::mbarrier_wait(&sync.q_empty[c], q_load.phase ^ 1u);
    ptx::mbarrier_arrive_expect_tx(&sync.q_full[c], kQChunkBytes);
    ptx::tma_load_3d(smem.q[c], &q_map, &sync.q_full[c], c * kBlockDims, slab * kSlabHeads, token);
  }
}

// Per item: its window tile (window_size <= kKeys: at most one), then one tile per 128 index
// columns of the extra source, each compacted into the next meta buffer and published as a
// TileRecord. A tile can hold fewer than 128 entries (holes, ids out of range, the last columns):
// it is still one tile. An item without index columns gets one empty record, so that the gather
// warps and the consumers walk the same list.
__device__ __forceinline__ void run_layer_compaction_warp(const DecodeParams& p, const CUtensorMap& q_map,
                                                          LayerSmemPlan& smem, LayerSmemSync& sync) {
  const int lane = threadIdx.x % 32;
  const int slabs = layer_slabs(p.num_heads);
  const int num_items = layer_items(p);
  const bool has_extra = p.extra.kv_cache != nullptr;
  PipeState<2> meta;
  PipeState<1> q_load;
  for (int item = blockIdx.x; item < num_items; item += gridDim.x) {
    const int token = item / slabs;
    const int slab = item - token * slabs;
    const int window_columns = columns_in_window(load_token_length(p.window, token), p.window.max_entries);
    const int extra_columns =
        has_extra ? columns_in_window(load_token_length(p.extra, token), p.extra.max_entries) : 0;
    const int window_tiles = window_columns > 0 ? 1 : 0;
    const int tiles = window_tiles + (extra_columns + kKeys - 1) / kKeys;
    const int records = tiles > 0 ? tiles : 1;
    for (int r = 0; r < records; ++r) {
      ptx::mbarrier_wait(&sync.meta_empty[meta.index], meta.phase ^ 1u);  // everyone is done with record - 2
      const bool from_window = r < window_tiles;
      const KvSourceParams& src = from_window ? p.window : p.extra;
      const int begin = from_window ? 0 : (r - window_tiles) * kKeys;
      const int end = from_window ? window_columns : min(begin + kKeys, extra_columns);
      const int n = tiles == 0 ? 0
                               : compact_columns<kCompactThreads, kKeys>(
                                     src, token, begin, end, lane, [] { __syncwarp(); }, smem.row_offset[meta.index],
                                     smem.inv_scale[meta.index], sync.warp_counts);
      if (lane == 0) {
        TileRecord& record = sync.record[meta.index];
        record.num_valid = n;
        record.from_extra = tiles > 0 && !from_window;
        record.last = r == records - 1;
        record.has_q = tiles > 0;
      }
      __syncwarp();
      ptx::mbarrier_arrive(&sync.meta_full[meta.index]);
      // After the first record is out, so that the gather warps start on it while this lane waits
      // for the previous item's last S to free q.
      if (r == 0 && tiles > 0) {
        if (lane == 0) load_item_q(q_map, smem, sync, q_load, token, slab);
        q_load.advance();
      }
      // As in the window kernel: the rows go to L2 now, a tile before they are gathered; only this
      // warp rewrites row_offset[meta.index], two records from now.
      prefetch_rows_l2(src.kv_cache, smem.row_offset[meta.index], n, lane);
      meta.advance();
    }
  }
}

// Walks the records of this CTA's items in order, releasing the ones without entries, until one
// with entries (true: `meta` names it and it is not released yet) or the CTA's last item is done.
__device__ __forceinline__ bool next_layer_tile(LayerSmemSync& sync, PipeState<2>& meta, int& items_left) {
  while (items_left > 0) {
    ptx::mbarrier_wait(&sync.meta_full[meta.index], meta.phase);
    const TileRecord record = sync.record[meta.index];
    if (record.last) --items_left;
    if (record.num_valid > 0) return true;
    ptx::mbarrier_arrive(&sync.meta_empty[meta.index]);
    meta.advance();
  }
  return false;
}

// Each tile with entries: half 0 lands in staging, waits for the consumers to free half 0 of the
// K/V tile, is dequantized into it; then half 1 the same way, while half 0's gather for the next
// tile is only issued once staging is free again. The window kernel's order (run_gather_warps),
// with tiles in place of tokens.
__device__ __forceinline__ void run_layer_gather_warps(const DecodeParams& p, LayerSmemPlan& smem, LayerSmemSync& sync) {
  const int tid = threadIdx.x;  // 0..95
  int items_left = items_of_this_cta(p);
  PipeState<2> meta;
  PipeState<1> kv;
  if (!next_layer_tile(sync, meta, items_left)) return;
  const uint8_t* kv_cache = sync.record[meta.index].from_extra ? p.extra.kv_cache : p.window.kv_cache;
  int num_valid = sync.record[meta.index].num_valid;
  issue_rows_half_gather(kv_cache, smem.row_offset[meta.index], num_valid, smem, 0, tid);
  for (;;) {
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      ptx::cp_async_wait<0>();
      ptx::named_barrier_sync<kGatherThreads>(kProducerBarrier);  // the whole half landed
      ptx::mbarrier_wait(&sync.kv_empty[half], kv.phase ^ 1u);    // consumers are done with it
      dequantize_half(smem, half, tid);
      ptx::fence_proxy_async_shared();
      ptx::named_barrier_sync<kGatherThreads>(kProducerBarrier);  // staging free again
      ptx::mbarrier_arrive(&sync.kv_full[half]);
      if (half == 0) {
        issue_rows_half_gather(kv_cache, smem.row_offset[meta.index], num_valid, smem, 1, tid);
        ptx::mbarrier_arrive(&sync.meta_empty[meta.index]);  // its row offsets are read
        meta.advance();
      }
    }
    kv.advance();
    if (!next_layer_tile(sync, meta, items_left)) return;
    kv_cache = sync.record[meta.index].from_extra ? p.extra.kv_cache : p.window.kv_cache;
    num_valid = sync.record[meta.index].num_valid;
    issue_rows_half_gather(kv_cache, smem.row_offset[meta.index], num_valid, smem, 0, tid);
  }
}

}  // namespace swa_decode::sm90
