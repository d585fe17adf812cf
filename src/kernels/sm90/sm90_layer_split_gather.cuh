// The layer kernel's split gather (v5, LayerPair::kSplitGather): the gather warps as an issuer
// warp, which copies each subtile's rows into the staging ring a share at a time, and two
// dequantizing warps, which write the shares into the K/V ring.
#pragma once

#include <cstdint>

#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/kernels/sm90/sm90_layer_gather.cuh"
#include "src/kernels/sm90/sm90_layer_pair.cuh"
#include "src/kernels/sm90/sm90_layer_plan.h"
#include "src/kernels/sm90/sm90_plan.h"
#include "src/kernels/sm90/sm90_rows.cuh"

namespace swa_decode::sm90 {

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
