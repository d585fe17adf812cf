// The layer kernel's compaction warp (producer warp 3): each item's tiles, a tile ahead, as
// TileRecords of row offsets and inverse scales, and the item's q by TMA.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/common/window_compaction.cuh"
#include "src/kernels/sm90/sm90_layer_pair.cuh"
#include "src/kernels/sm90/sm90_layer_plan.h"
#include "src/kernels/sm90/sm90_layer_schedule.cuh"
#include "src/kernels/sm90/sm90_plan.h"
#include "src/kernels/sm90/sm90_producer.cuh"

namespace swa_decode::sm90 {

// The index columns of a token that one share of a key split takes, counted over its window's
// columns and then its extra source's: whole subtiles, so that no subtile straddles two CTAs, the
// last share what is left (possibly nothing). Without a split (count 1): every column.
struct SplitColumns {
  int window_begin, window_end;  // of the window's columns
  int extra_begin, extra_end;    // of the extra source's columns
};
__device__ __forceinline__ SplitColumns split_columns(int window_columns, int extra_columns, const KeySplit& split) {
  if (split.count == 1) return {0, window_columns, 0, extra_columns};  // folded without a split
  const int total = window_columns + extra_columns;
  const int per_share = ((total + split.count - 1) / split.count + kSubtileKeys - 1) / kSubtileKeys * kSubtileKeys;
  const int begin = min(total, split.index * per_share);
  const int end = min(total, begin + per_share);
  return {min(begin, window_columns), min(end, window_columns), max(begin, window_columns) - window_columns,
          max(end, window_columns) - window_columns};
}

// The 8 TMA boxes of the item's q (64 dims x 64 heads each; heads past num_heads are zero-filled).
// Chunk c is reloaded as soon as consumer 0 is done with the previous item's last S on it.
__device__ __forceinline__ void load_item_q(const CUtensorMap& q_map, LayerSmemPlan& smem, LayerSmemSync& sync,
                                            const PipeState<1>& q_load, int token, int slab) {
#pragma unroll 1
  for (int c = 0; c < kQChunks; ++c) {
    ptx::mbarrier_wait(&sync.q_empty[c], q_load.phase ^ 1u);
    ptx::mbarrier_arrive_expect_tx(&sync.q_full[c], kQChunkBytes);
    ptx::tma_load_3d(smem.q[c], &q_map, &sync.q_full[c], c * kBlockDims, slab * kSlabHeads, token);
  }
}

// The compaction warp's L2 prefetch of a record's rows (prefetch_rows_l2, in the source's row
// format). A pair's CTA prefetches the keys it gathers, [rank * 32, rank * 32 + 32) of every subtile.
template <class Pair>
__device__ __forceinline__ void prefetch_source_rows_l2(const KvSourceParams& src, const uint32_t* row_offset, int n,
                                                        int lane, int rank) {
  static_assert(Pair::kGatherKeys % kCompactThreads == 0, "a lane's keys stay in this CTA's share");
  constexpr int kStep = kCompactThreads * Pair::kCtas;
  const int first = lane + slab_of_cta<Pair>(rank) * Pair::kGatherKeys;
  if (src.is_model1) {
    prefetch_rows_l2<true>(src, row_offset, n, first, kStep);
  } else {
    prefetch_rows_l2<false>(src, row_offset, n, first, kStep);
  }
}

// Per item: its window tile (window_size <= kKeys: at most one), then one tile per 128 index
// columns of the extra source, each compacted into the next meta buffer and published as a
// TileRecord. A tile can hold fewer than 128 entries (holes, ids out of range, the last columns):
// it is still one tile. An item without index columns gets one empty record, so that the gather
// warps and the consumers walk the same list.
// A record's index columns (at most kKeys) are one compaction pass of the warp.
inline constexpr int kRecordColumnsPerLane = compaction_columns_per_thread<kCompactThreads, kKeys>();
static_assert(kRecordColumnsPerLane * kCompactThreads == kKeys, "a record is one pass");

template <class Pair>
__device__ __forceinline__ void run_layer_compaction_warp(const DecodeParams& p, const CUtensorMap& q_map,
                                                          LayerSmemPlan& smem, LayerSmemSync& sync, int rank,
                                                          const KeySplit& split) {
  const int lane = threadIdx.x % 32;
  const int slab = slab_of_cta<Pair>(rank);
  const ItemOrder& order = item_order(smem);
  const int items = order.count;
  PipeState<2> meta;
  PipeState<1> q_load;
  for (int k = 0; k < items; ++k) {
    const int token = item_token(order, k);
    // The window's ids into L1 beside the lengths: its record's id loads then hit L1. So are the
    // extra source's first 128 where this CTA's share starts at the token's first column (no key
    // split, or the split's first share): its first extra record's.
    prefetch_index_columns_l1<kCompactThreads, kKeys>(p.window, token, lane);
    if (split.index == 0 && p.extra.kv_cache != nullptr) {
      prefetch_index_columns_l1<kCompactThreads, kKeys>(p.extra, token, lane);
    }
    const TokenColumns available = token_columns_of_both(p, token);
    const SplitColumns columns = split_columns(available.window, available.extra, split);
    const int window_tiles = columns.window_end > columns.window_begin ? 1 : 0;
    const int tiles = window_tiles + (columns.extra_end - columns.extra_begin + kKeys - 1) / kKeys;
    const int records = tiles > 0 ? tiles : 1;
    for (int r = 0; r < records; ++r) {
      const bool from_window = r < window_tiles;
      const KvSourceParams& src = from_window ? p.window : p.extra;
      const int begin = from_window ? columns.window_begin : columns.extra_begin + (r - window_tiles) * kKeys;
      const int end = from_window ? columns.window_end : min(begin + kKeys, columns.extra_end);
      // The record's index and scale loads go out before the wait for its buffer, so that their
      // two round trips run under it: waiting first, they followed each buffer's release and the
      // gather warps waited for records (perf-notes, layer v7: 4x fewer of those waits, 1-7%).
      const LoadedColumns<kRecordColumnsPerLane> loaded =
          load_columns<kCompactThreads, kRecordColumnsPerLane, false>(src, token, begin, end, lane);
      // The first item's q goes out with its first record's loads: nothing holds q yet, and at
      // T = 1 (one item a CTA) q's 64 KiB then land under the record's round trips, not after them.
      if (k == 0 && r == 0 && tiles > 0) {
        if (lane == 0) load_item_q(q_map, smem, sync, q_load, token, slab);
        q_load.advance();
      }
      ptx::mbarrier_wait(&sync.meta_empty[meta.index], meta.phase ^ 1u);  // everyone is done with record - 2
      const int n = tiles == 0 ? 0
                               : write_columns<kCompactThreads>(loaded, src, 0, lane, [] { __syncwarp(); },
                                                                smem.row_offset[meta.index],
                                                                smem.inv_scale[meta.index], sync.warp_counts, 0);
      if (lane == 0) {
        TileRecord& record = sync.record[meta.index];
        record.num_valid = n;
        record.from_extra = tiles > 0 && !from_window;
        record.last = r == records - 1;
        record.has_q = tiles > 0;
      }
      __syncwarp();
      ptx::mbarrier_arrive(&sync.meta_full[meta.index]);
      // Later items' q after their first record is out, so that the gather warps start on it while
      // this lane waits for the previous item's last S to free q.
      if (k > 0 && r == 0 && tiles > 0) {
        if (lane == 0) load_item_q(q_map, smem, sync, q_load, token, slab);
        q_load.advance();
      }
      // As in the window kernel: the rows go to L2 now, a tile before they are gathered; only this
      // warp rewrites row_offset[meta.index], two records from now.
      prefetch_source_rows_l2<Pair>(src, smem.row_offset[meta.index], n, lane, rank);
      meta.advance();
    }
  }
}

}  // namespace swa_decode::sm90
