// Producer warpgroup of the Hopper layer kernel: warp 3 compacts each item's tiles a tile ahead
// and loads the item's q; warps 0-2 gather and dequantize each tile, 64 keys (a subtile) at a
// time, into the two-stage K/V ring. Both row formats (docs/semantics.md, "Row formats").
#pragma once

#include <cuda.h>

#include <cstdint>

#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/common/window_compaction.cuh"
#include "src/kernels/sm90/sm90_layer_plan.h"
#include "src/kernels/sm90/sm90_layer_schedule.cuh"
#include "src/kernels/sm90/sm90_plan.h"
#include "src/kernels/sm90/sm90_producer.cuh"
#include "src/kernels/sm90/sm90_rows.cuh"
#include "swa_decode/swa_decode.h"

namespace swa_decode::sm90 {

// The slab of 64 heads this CTA runs of each of its tokens, which is also its place in its pair
// (the half of each subtile it gathers): a pair's cluster rank (with a key split, the rank's low
// bit: rank = split * 2 + slab), 0 alone.
template <class Pair>
__device__ __forceinline__ int slab_of_cta(int rank) {
  if constexpr (Pair::kCtas == 2) return Pair::kSplitKeys ? rank % 2 : rank;
  return 0;
}

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

// ---- the gather warps: one subtile (64 keys of a record) at a time through staging into the
// K/V ring. Seed rows (512 e4m3 bytes) land whole in staging; a kModel1 row (docs/semantics.md)
// lands as its 448 e4m3 bytes and its 8-byte scale row in staging, while its 64 bf16 RoPE values
// are copied straight into the stage's last 64-dim block, so they are issued only once the
// consumers have freed that stage.
inline constexpr int kStagingChunks = kHeadDim / 16;  // 16-byte pieces of a staged row; kModel1's scale
                                                      // row is piece kModel1E4m3Chunks (28)

// Where piece `chunk` of staged row `key` lies: 16-byte chunks XOR-swizzled by key % 8, so the 8
// threads of a quarter-warp reading 8 consecutive keys hit 8 different bank groups. `rows` is
// staging from a multiple of 8 keys on (a pair's CTA counts its keys from its first), so the
// swizzle of a key counted from there is the same.
__device__ __forceinline__ uint8_t* staged_piece(uint8_t (*rows)[kHeadDim], int key, int chunk) {
  return &rows[key][(chunk ^ (key & 7)) * 16];
}
static_assert(LayerPair<2>::kGatherKeys % 8 == 0, "a pair's second CTA's keys start on a multiple of 8");

// The subtile the gather warps are on: keys [first_key, first_key + count) of the record in its
// meta buffer.
struct Subtile {
  const KvSourceParams* src;
  const uint32_t* row_offset;  // the record's first entry of this subtile
  int count;                   // 1..kSubtileKeys valid keys; the rest of the stage is zero-filled
};

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

// The first kChunks 16-byte pieces of each of this CTA's rows of the subtile (keys first_key ..
// first_key + kGatherKeys - 1) into the staging rows `rows`, zero-filled past count. Keys are
// counted from first_key (row_offset and count shifted by it), so that the unrolled loop's
// addresses are what they were without pairs (a runtime first_key in each of them spilled the
// producer 24 B at 72 registers).
template <class Pair, int kChunks, int kUnroll>
__device__ __forceinline__ void issue_row_pieces(const Subtile& u, uint8_t (*rows)[kHeadDim], int tid, int first_key) {
  const uint8_t* kv_cache = u.src->kv_cache;
  const uint32_t* row_offset = u.row_offset + first_key;
  const int count = u.count - first_key;
#pragma unroll kUnroll
  for (int piece = tid; piece < Pair::kGatherKeys * kChunks; piece += kGatherThreads) {
    const int key = piece / kChunks;
    const int chunk = piece % kChunks;
    const bool valid = key < count;
    const uint8_t* src = valid ? row_address(kv_cache, row_offset[key]) + chunk * 16 : kv_cache;
    ptx::cp_async_16(ptx::smem_addr(staged_piece(rows, key, chunk)), src, valid ? 16u : 0u);
  }
}

// The part of a subtile's copies that may run while the consumers still use its stage: whole seed
// rows, or kModel1's e4m3 bytes and scale rows, into the staging rows `rows`. Keys past count are
// zero-filled, so that they enter S and O as zeros (the consumers mask their scores; 0 * stale
// data could be NaN).
template <class Pair>
__device__ __forceinline__ void issue_subtile_gather(const Subtile& u, uint8_t (*rows)[kHeadDim], int tid,
                                                     int first_key) {
  if (!u.src->is_model1) {
    issue_row_pieces<Pair, kStagingChunks, 4>(u, rows, tid, first_key);
  } else {
    // two pieces a round, as the build measured on the H200
    issue_row_pieces<Pair, kModel1E4m3Chunks, 2>(u, rows, tid, first_key);
    static_assert(Pair::kGatherKeys <= kGatherThreads, "one scale row per thread");
    if (tid < Pair::kGatherKeys) {
      const bool valid = first_key + tid < u.count;
      const uint8_t* src = valid ? model1_scale_row(*u.src, u.row_offset[first_key + tid]) : u.src->kv_cache;
      ptx::cp_async_ca<kModel1ScaleRowBytes>(ptx::smem_addr(staged_piece(rows, tid, kModel1E4m3Chunks)), src,
                                             valid ? kModel1ScaleRowBytes : 0u);
    }
  }
  ptx::cp_async_commit();
}

// kModel1: the RoPE values into the stage's last 64-dim block, by kCopyThreads threads (tid 0..
// kCopyThreads - 1). Only once the stage is free.
template <int kCopyThreads>
__device__ __forceinline__ void issue_rope_copy(const Subtile& u, LayerSmemPlan& smem, int stage, int tid) {
  issue_model1_rope_copy<kSubtileKeys, kCopyThreads>(u.src->kv_cache, u.row_offset, u.count,
                                                     smem.kv[stage][kQChunks - 1], tid);
}

// Staging -> bf16 stage, in units of (key, 32-dim group), keys fastest (conflict-free reads of
// staging and swizzled writes of the tile, as dequantize_half). Seed rows convert exactly and keep
// their inverse scale for the consumers' scores (fp8_convert.cuh); a kModel1 group is multiplied by
// its power of two, exactly in bf16 (its 7 scale bytes are staged piece 28). A pair's CTA converts
// its keys and writes each chunk into its own stage and the same place of the peer's.
// kRows staged rows from `rows` on are keys first_key .. first_key + kRows - 1 of the stage.
// kPieces staged 16-byte pieces of a unit from first_piece on (2: the whole unit, 1: half of it),
// both loaded before either is converted.
template <class Pair, bool kModel1, int kRows, int kPieces>
__device__ __forceinline__ void dequantize_unit(LayerSmemPlan& smem, uint8_t (*rows)[kHeadDim], int stage, int unit,
                                                int first_piece, int first_key, int peer) {
  const int key = unit % kRows;
  const int group = unit / kRows;
  uint32_t words[4 * kPieces];
#pragma unroll
  for (int piece = 0; piece < kPieces; ++piece) {
    const uint4 codes = *reinterpret_cast<const uint4*>(staged_piece(rows, key, 2 * group + first_piece + piece));
    words[4 * piece] = codes.x;
    words[4 * piece + 1] = codes.y;
    words[4 * piece + 2] = codes.z;
    words[4 * piece + 3] = codes.w;
  }
  __nv_bfloat162 scale{};
  if constexpr (kModel1) scale = ue8m0_to_bf16x2(staged_piece(rows, key, kModel1E4m3Chunks)[group / 2]);
  uint8_t* row = smem.kv[stage][group / 2][first_key + key];
#pragma unroll
  for (int k = 0; k < 2 * kPieces; ++k) {
    const uint4 chunk = dequantize_chunk<kModel1>(words[2 * k], words[2 * k + 1], scale);
    const int position = ((group % 2) * 4 + 2 * first_piece + k) ^ (key & 7);
    *reinterpret_cast<uint4*>(row + position * 16) = chunk;
    if constexpr (Pair::kCtas == 2 && !Pair::kPeerBulkCopy) {
      ptx::store_cluster_u32x4(ptx::cluster_address(ptx::smem_addr(row + position * 16), peer), chunk);
    }
  }
}

template <class Pair, bool kModel1, int kRows = Pair::kGatherKeys>
__device__ __forceinline__ void dequantize_subtile(LayerSmemPlan& smem, uint8_t (*rows)[kHeadDim], int stage, int tid,
                                                   int first_key, int peer) {
  constexpr int kThreads = Pair::kStageWriters;
  constexpr int kGroups = (kModel1 ? kModel1E4m3Dims : kHeadDim) / 32;
  constexpr int kUnits = kRows * kGroups;
  // Units left after whole rounds. Where twice as many fit the writers, they go as half units (one
  // staged 16-byte piece each), so the writer warps finish together: a kModel1 share is 224 units
  // for 64 writers, whose last 32 as whole units left one warp 4 rounds to the other's 3 at the named
  // barrier (ncu, session 25: +197 ns a subtile).
  constexpr int kRest = kUnits % kThreads;
  constexpr bool kRestAsHalves = kRest > 0 && 2 * kRest <= kThreads;
  constexpr int kWholeUnits = kRestAsHalves ? kUnits - kRest : kUnits;
  // One unit at a time: two in flight spill the producer at 72 registers (ptxas, CUDA 13.0).
#pragma unroll 1
  for (int unit = tid; unit < kWholeUnits; unit += kThreads) {
    dequantize_unit<Pair, kModel1, kRows, 2>(smem, rows, stage, unit, 0, first_key, peer);
  }
  if constexpr (kRestAsHalves) {
    if (tid < 2 * kRest) {
      dequantize_unit<Pair, kModel1, kRows, 1>(smem, rows, stage, kWholeUnits + tid % kRest, tid / kRest, first_key,
                                               peer);
    }
  }
}

// LayerPair::kPeerBulkCopy: once every stage writer stored its part of a share (kShareRows keys
// from share_key on) into this CTA's stage and fenced it for the async proxy, the first writer
// copies those rows of each dequantized 64-dim block (kModel1: the 7 e4m3 blocks; the RoPE block
// each CTA fills itself, all 64 keys) into the peer's stage: 16 rows of 128 B, 2 KiB a block, in
// one piece, completing on the peer's kv_full. Returns the bytes sent.
template <class Pair>
__device__ __forceinline__ uint32_t copy_share_to_peer(LayerSmemPlan& smem, LayerSmemSync& sync, int stage,
                                                       int share_key, bool model1, int tid, int peer) {
  constexpr uint32_t kShareBlockBytes = kShareRows * kRowBytes;
  const int blocks = model1 ? kModel1E4m3Dims / 64 : kQChunks;
  ptx::fence_proxy_async_shared();
  ptx::named_barrier_sync<Pair::kStageWriters>(kStageWritersBarrier);
  if (tid == 0) {
    const uint32_t bar = ptx::cluster_address(ptx::smem_addr(&sync.kv_full[stage]), peer);
    for (int block = 0; block < blocks; ++block) {
      const uint32_t src = ptx::smem_addr(&smem.kv[stage][block][share_key][0]);
      ptx::bulk_copy_shared_to_cluster(ptx::cluster_address(src, peer), src, kShareBlockBytes, bar);
    }
  }
  return static_cast<uint32_t>(blocks) * kShareBlockBytes;
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

// Where the gather warps are: the record in `meta` (num_valid entries, its subtile from
// first_key) and the CTA's items not yet finished.
struct GatherCursor {
  PipeState<2> meta;
  int items_left;
  int first_key;
  int num_valid;
};

// The cursor on the CTA's first record with entries; false if it has none.
__device__ __forceinline__ bool start_gather(LayerSmemPlan& smem, LayerSmemSync& sync, GatherCursor& at) {
  at = GatherCursor{PipeState<2>{}, item_order(smem).count, 0, 0};
  if (!next_layer_tile(sync, at.meta, at.items_left)) return false;
  at.num_valid = sync.record[at.meta.index].num_valid;
  return true;
}

__device__ __forceinline__ Subtile subtile_at(const DecodeParams& p, const LayerSmemPlan& smem, LayerSmemSync& sync,
                                              const GatherCursor& at) {
  const KvSourceParams& src = sync.record[at.meta.index].from_extra ? p.extra : p.window;
  return Subtile{&src, smem.row_offset[at.meta.index] + at.first_key, min(at.num_valid - at.first_key, kSubtileKeys)};
}

// Moves the cursor to its next subtile: the record's next 64 keys or the next record with entries
// (releasing the empty ones on the way); false once the CTA's items are done.
__device__ __forceinline__ bool advance_gather(LayerSmemSync& sync, GatherCursor& at) {
  if (at.first_key + kSubtileKeys < at.num_valid) {
    at.first_key += kSubtileKeys;
    return true;
  }
  at.meta.advance();
  if (!next_layer_tile(sync, at.meta, at.items_left)) return false;
  at.num_valid = sync.record[at.meta.index].num_valid;
  at.first_key = 0;
  return true;
}

// Arrives on this CTA's barrier `bar` (kv_full) and, in a pair, on the peer's barrier
// at the same place, which counts this CTA's threads too; the remote arrive releases at cluster
// scope (wait_pair_phase acquires kv_full's).
template <class Pair>
__device__ __forceinline__ void arrive_pair(uint64_t* bar, int rank) {
  ptx::mbarrier_arrive(bar);
  if constexpr (Pair::kCtas == 2) ptx::mbarrier_arrive_cluster(ptx::cluster_address(ptx::smem_addr(bar), rank ^ 1));
}

// A consumer's arrive on kv_empty: this CTA's barrier and, in a pair, the peer's, whose writers
// fill this CTA's stage too. It orders only this thread's reads of the stage, by wgmmas already
// waited for, before those writes, so the remote arrive releases at CTA scope, as CUTLASS's
// cluster pipelines release a stage to the CTA that fills it; a cluster-scoped one cost consumer 0
// ~10% of its samples in a MEMBAR.ALL.GPU / ERRBAR that also waited for its out stores (ncu, v8).
// The writers' kv_full arrive, which carries their stores to the peer's consumers, stays
// cluster-scoped.
template <class Pair>
__device__ __forceinline__ void release_stage(uint64_t* bar, int rank) {
  ptx::mbarrier_arrive(bar);
  if constexpr (Pair::kCtas == 2) {
    ptx::mbarrier_arrive_cluster_cta_release(ptx::cluster_address(ptx::smem_addr(bar), rank ^ 1));
  }
}

// A stage writer's stores (to this CTA's stage and, in a pair of v4's gather warps, the peer's),
// ordered before the consumers' wgmmas read them through the async proxy; kv_full's arrive
// follows. With kPeerBulkCopy the peer's half arrives by bulk copy (async proxy) instead.
template <class Pair>
__device__ __forceinline__ void fence_stage_writes() {
  if constexpr (Pair::kCtas == 2 && !Pair::kPeerBulkCopy) {
    ptx::fence_proxy_async_cluster();
  } else {
    ptx::fence_proxy_async_shared();
  }
}

// A consumer's wait for phase `parity` of kv_full, on which a pair's peer arrives too. v4's gather
// warps release their kv_full arrivals at cluster scope, and what those order (their stores into
// this CTA's stage) is then read: the acquire must be cluster-scoped as well, or those stores are
// not ordered before this CTA's wgmmas after the wait. A lone CTA, and a pair whose peer's half
// comes by bulk copy (complete_tx on this CTA's barrier, as a TMA load's bytes), wait at CTA scope.
template <class Pair>
__device__ __forceinline__ void wait_pair_phase(uint64_t* bar, uint32_t parity) {
  if constexpr (Pair::kCtas == 2 && !Pair::kPeerBulkCopy) {
    ptx::mbarrier_wait_cluster(bar, parity);
  } else {
    ptx::mbarrier_wait(bar, parity);
  }
}

// A stage writer's wait for phase `parity` of kv_empty (the stage is free in both CTAs). Its
// remote arrivals release at CTA scope and order only reads completed before them (release_stage),
// so a cluster-scoped acquire would pair with nothing stronger; it would cost each wait an L1
// invalidate (CCTL.IVALL, 0.8% of the kernel's samples at the dequantizing warps' wait in v8's
// ncu profile). CUTLASS's cluster pipelines wait at CTA scope too.
__device__ __forceinline__ void wait_stage_free(uint64_t* bar, uint32_t parity) { ptx::mbarrier_wait(bar, parity); }

// v4's gather warps, for a pair over sources of two row formats (LayerPair): per subtile its gather
// (issued as soon as staging is free, a stage ahead of the consumers) lands, the stage is free,
// the stage is written and published; then the next subtile's gather goes out. A subtile's latency
// thus hides under the consumers' multiply of the previous one.
// A pair's CTAs walk the same records (the same token's entries) and stages in lockstep: each
// waits for its kv_empty, which counts both CTAs' consumers, before writing either stage, and
// arrives on both CTAs' kv_full.
template <class Pair>
__device__ __forceinline__ void run_layer_gather_warps(const DecodeParams& p, LayerSmemPlan& smem, LayerSmemSync& sync,
                                                       int rank) {
  const int first_key = slab_of_cta<Pair>(rank) * Pair::kGatherKeys;
  GatherCursor at;
  PipeState<kKvStages> kv;
  if (!start_gather(smem, sync, at)) return;
  for (;;) {
    const int tid = ptx::thread_index_x_unhoisted();  // 0..95; held across the loop, the addresses
                                                      // derived from it spilled the producer
    const Subtile u = subtile_at(p, smem, sync, at);
    issue_subtile_gather<Pair>(u, smem.staging, tid, first_key);
    const bool record_done = at.first_key + kSubtileKeys >= at.num_valid;
    if (record_done) {
      ptx::mbarrier_arrive(&sync.meta_empty[at.meta.index]);  // its row offsets are read
    }
    wait_stage_free(&sync.kv_empty[kv.index], kv.phase ^ 1u);  // the stage is free
    const bool model1 = u.src->is_model1 != 0;
    if (model1) {
      issue_rope_copy<kGatherThreads>(u, smem, kv.index, tid);
      ptx::cp_async_wait<1>();
    } else {
      ptx::cp_async_wait<0>();
    }
    ptx::named_barrier_sync<kGatherThreads>(kProducerBarrier);  // staging holds the whole subtile
    if (model1) {
      dequantize_subtile<Pair, true>(smem, smem.staging, kv.index, tid, first_key, rank ^ 1);
      ptx::cp_async_wait<0>();  // the RoPE values
    } else {
      dequantize_subtile<Pair, false>(smem, smem.staging, kv.index, tid, first_key, rank ^ 1);
    }
    fence_stage_writes<Pair>();
    ptx::named_barrier_sync<kGatherThreads>(kProducerBarrier);  // staging free again
    arrive_pair<Pair>(&sync.kv_full[kv.index], rank);
    kv.advance();
    if (!advance_gather(sync, at)) return;
  }
}

// ---- v5: the gather warps as an issuer and two dequantizing warps (LayerPair) ----


// The issuer's copies of one share: rows first_key .. first_key + kShareRows - 1 of the subtile
// into the staging share `rows`, zero-filled past count. Four lanes a row, 64 bytes apart, so that
// one instruction reads 8 rows x 64 contiguous bytes and each lane computes 2 row addresses a
// share rather than one per 16-byte piece (the per-piece arithmetic cost v2's gather warps a
// quarter of their time); a kModel1 row's scale row comes with it (lane = key).
template <bool kModel1>
__device__ __forceinline__ void issue_share(const Subtile& u, uint8_t (*rows)[kHeadDim], int lane, int first_key) {
  constexpr int kChunks = kModel1 ? kModel1E4m3Chunks : kStagingChunks;  // 28 or 32, 16 B each
  constexpr int kLanesPerRow = 4;
  constexpr int kRowsPerPass = 32 / kLanesPerRow;
  static_assert(kChunks % kLanesPerRow == 0 && kShareRows % kRowsPerPass == 0, "whole rows a pass");
  const uint8_t* kv_cache = u.src->kv_cache;
  const int quad = lane % kLanesPerRow;
#pragma unroll
  for (int pass = 0; pass < kShareRows / kRowsPerPass; ++pass) {
    const int key = lane / kLanesPerRow + pass * kRowsPerPass;  // key % 8 == lane / 4
    const bool valid = first_key + key < u.count;
    const uint8_t* row = valid ? row_address(kv_cache, u.row_offset[first_key + key]) : kv_cache;
#pragma unroll
    for (int j = 0; j < kChunks / kLanesPerRow; ++j) {
      const int chunk = quad + j * kLanesPerRow;
      ptx::cp_async_16(ptx::smem_addr(staged_piece(rows, key, chunk)), valid ? row + chunk * 16 : kv_cache,
                       valid ? 16u : 0u);
    }
  }
  if constexpr (kModel1) {
    if (lane < kShareRows) {
      const bool valid = first_key + lane < u.count;
      const uint8_t* src = valid ? model1_scale_row(*u.src, u.row_offset[first_key + lane]) : kv_cache;
      ptx::cp_async_ca<kModel1ScaleRowBytes>(ptx::smem_addr(staged_piece(rows, lane, kModel1E4m3Chunks)), src,
                                             valid ? kModel1ScaleRowBytes : 0u);
    }
  }
}

// Warp 0: walks the same subtiles as everyone, this CTA's keys of each (64 alone, 32 in a pair)
// as shares of 16 into the staging ring, each as soon as its buffer is free; each lane's arrive
// on staged_full completes once its copies landed. It may wait for the next record (the
// compaction publishes it after loading the next item's q, which waits for this item's last S):
// whoever publishes the stage that S needs must not wait there first. The dequantizing warps and,
// in a pair for a kModel1 subtile, this warp arrive on kv_full, and both do so before
// advance_gather; moving this warp's arrival after it would deadlock at an item's end.
template <class Pair>
__device__ __forceinline__ void run_issuer_warp(const DecodeParams& p, LayerSmemPlan& smem, LayerSmemSync& sync,
                                                int rank) {
  const int lane = threadIdx.x % 32;
  const int first_key = slab_of_cta<Pair>(rank) * Pair::kGatherKeys;
  GatherCursor at;
  PipeState<kStagingShares> share;
  PipeState<kKvStages> kv;
  if (!start_gather(smem, sync, at)) return;
  for (;;) {
    const Subtile u = subtile_at(p, smem, sync, at);
#pragma unroll 1
    for (int part = 0; part < Pair::kSharesPerSubtile; ++part) {
      ptx::mbarrier_wait(&sync.staged_empty[share.index], share.phase ^ 1u);  // the share two back is read
      uint8_t(*rows)[kHeadDim] = smem.staging + share.index * kShareRows;
      if (u.src->is_model1) {
        issue_share<true>(u, rows, lane, first_key + part * kShareRows);
      } else {
        issue_share<false>(u, rows, lane, first_key + part * kShareRows);
      }
      ptx::cp_async_mbarrier_arrive(&sync.staged_full[share.index]);
      share.advance();
    }
    // In a pair (kIssuerCopiesRope), a kModel1 subtile's RoPE values (all 64 keys, into this CTA's
    // stage) once the stage is free, then, once they landed and were fenced for the consumers'
    // wgmmas, this warp's kv_full arrivals; for a seed subtile the dequantizing warps arrive in its
    // place and this warp goes on to the next share unblocked (waiting here for seed stages too
    // cost seed C4A H = 128 T = 512 / 2048 +1.6 / +0.9%, session 26). The wait never holds the
    // next share back: that share's buffer comes back only after the dequantizing warps' own wait
    // for this stage.
    if constexpr (Pair::kIssuerCopiesRope) {
      if (u.src->is_model1) {
        wait_stage_free(&sync.kv_empty[kv.index], kv.phase ^ 1u);
        issue_rope_copy<Pair::kIssuerThreads>(u, smem, kv.index, lane);
        ptx::cp_async_wait<0>();
        ptx::fence_proxy_async_shared();
        ptx::mbarrier_arrive(&sync.kv_full[kv.index]);
      }
      kv.advance();
    }
    if (at.first_key + kSubtileKeys >= at.num_valid) {
      ptx::mbarrier_arrive(&sync.meta_empty[at.meta.index]);  // its row offsets are read
    }
    if (!advance_gather(sync, at)) return;
  }
}

// Warps 1-2: per subtile, the stage is free, then for each of its shares: the share has landed,
// its keys go into the stage (in a pair both CTAs' stages), the share goes back to the issuer; the
// stage is published to the consumers (in a pair both CTAs'). A kModel1 stage's RoPE block is
// the issuer's in a pair (LayerPair::kIssuerCopiesRope), these warps' alone, by cp.async issued
// once the stage is free and waited for before the stage is published.
template <class Pair>
__device__ __forceinline__ void run_dequant_warps(const DecodeParams& p, LayerSmemPlan& smem, LayerSmemSync& sync,
                                                  int rank) {
  const int first_key = slab_of_cta<Pair>(rank) * Pair::kGatherKeys;
  GatherCursor at;
  PipeState<kKvStages> kv;
  PipeState<kStagingShares> share;
  if (!start_gather(smem, sync, at)) return;
  for (;;) {
    const int tid = ptx::thread_index_x_unhoisted() - Pair::kIssuerThreads;  // 0..63
    const Subtile u = subtile_at(p, smem, sync, at);
    const bool model1 = u.src->is_model1 != 0;
    uint32_t peer_bytes = 0;  // kPeerBulkCopy: what this CTA copies into the peer's stage
    wait_stage_free(&sync.kv_empty[kv.index], kv.phase ^ 1u);  // the stage is free
    const bool copies_rope = model1 && !Pair::kIssuerCopiesRope;    // a lone CTA's RoPE block
    if (copies_rope) issue_rope_copy<Pair::kStageWriters>(u, smem, kv.index, tid);
#pragma unroll 1
    for (int part = 0; part < Pair::kSharesPerSubtile; ++part) {
      ptx::mbarrier_wait(&sync.staged_full[share.index], share.phase);
      uint8_t(*rows)[kHeadDim] = smem.staging + share.index * kShareRows;
      const int share_key = first_key + part * kShareRows;
      if (model1) {
        dequantize_subtile<Pair, true, kShareRows>(smem, rows, kv.index, tid, share_key, rank ^ 1);
      } else {
        dequantize_subtile<Pair, false, kShareRows>(smem, rows, kv.index, tid, share_key, rank ^ 1);
      }
      ptx::mbarrier_arrive(&sync.staged_empty[share.index]);
      share.advance();
      if constexpr (Pair::kPeerBulkCopy) {
        peer_bytes += copy_share_to_peer<Pair>(smem, sync, kv.index, share_key, model1, tid, rank ^ 1);
      }
    }
    if (copies_rope) ptx::cp_async_wait<0>();  // the RoPE values
    fence_stage_writes<Pair>();
    if constexpr (Pair::kPeerBulkCopy) {
      // This CTA's writers arrive; the first also expects the bytes the peer's copies bring, the
      // same as this CTA's sent (both CTAs gather the same subtile, each half its keys).
      if (tid == 0) {
        ptx::mbarrier_arrive_expect_tx(&sync.kv_full[kv.index], peer_bytes);
        // The issuer's arrivals, which it makes only after a kModel1 stage's RoPE values.
        if (Pair::kIssuerCopiesRope && !model1) {
          ptx::mbarrier_arrive_count(&sync.kv_full[kv.index], Pair::kIssuerThreads);
        }
      } else {
        ptx::mbarrier_arrive(&sync.kv_full[kv.index]);
      }
    } else {
      arrive_pair<Pair>(&sync.kv_full[kv.index], rank);
    }
    kv.advance();
    if (at.first_key + kSubtileKeys >= at.num_valid) {
      ptx::mbarrier_arrive(&sync.meta_empty[at.meta.index]);  // its record (alone: row offsets) is read
    }
    if (!advance_gather(sync, at)) return;
  }
}

}  // namespace swa_decode::sm90
