// The layer kernel's gather: a record's keys, a subtile at a time, through staging into the
// K/V ring (copies, dequantization, a pair's bulk copy to its peer), the cursor the gather warps
// walk the records with, and v4's gather warps, which do all of it in three warps.
#pragma once

#include <cstdint>

#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/kernels/sm90/sm90_layer_pair.cuh"
#include "src/kernels/sm90/sm90_layer_plan.h"
#include "src/kernels/sm90/sm90_layer_schedule.cuh"
#include "src/kernels/sm90/sm90_plan.h"
#include "src/kernels/sm90/sm90_rows.cuh"
#include "swa_decode/swa_decode.h"

namespace swa_decode::sm90 {

// One subtile (64 keys of a record) at a time through staging into the K/V ring. Seed rows (512
// e4m3 bytes) land whole in staging; a kModel1 row (docs/semantics.md) lands as its 448 e4m3 bytes
// and its 8-byte scale row in staging, while its 64 bf16 RoPE values are copied straight into the
// stage's last 64-dim block, so they are issued only once the consumers have freed that stage.
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

}  // namespace swa_decode::sm90
