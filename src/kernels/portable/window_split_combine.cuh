// Window split for small batches (sm_90+): the S CTAs of a thread-block cluster share one (token,
// head block), each runs the online softmax over 1/S of the window's tiles (and 1/S of the extra
// source's columns, where there is one), and they combine
// through distributed shared memory, so no global scratch is needed and the run path still
// allocates nothing.
//
// Why: with few tokens a CTA's serial chain (q and index loads, gathers, 4 tiles of compute, the
// epilogue) sets the time while most SMs idle (H = 128, T = 1: 8 CTAs, issue slots 0.9% busy,
// docs/perf-notes.md). Splitting the window shortens each chain to ~1/S of the tiles and puts S
// times the CTAs to work.
//
// The combine: each CTA parks its unnormalized output (fp32, 16 * kHeadGroups heads x 512 dims)
// over its own f16 tile and q fragments, which the last tile has finished with, plus each head's
// running max and sum; after a cluster barrier, CTA rank r normalizes heads r/S .. (r+1)/S - 1 of
// the block, loading every CTA's partials remotely in one batch: O = sum_s 2^(m_s - M) O_s,
// l = sum_s 2^(m_s - M) l_s with M = max_s m_s, then the usual sink and LSE (softmax_finalize.cuh).
// Pushing the partials into the owner with remote stores instead measured 0.3 us slower at T = 1
// (the release barrier then waits for the stores; docs/perf-notes.md).
#pragma once

#include <cstdint>

#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/common/softmax_finalize.cuh"
#include "src/common/split_partials.cuh"
#include "src/kernels/portable/group_softmax.cuh"
#include "src/kernels/portable/portable_plan.h"

namespace swa_decode::portable {

// Parks this warp's rows g and g + 8 (of `group`), dims dim_base .. dim_base + 127 in the output
// order of the epilogue (4 n8 blocks of a 32-dim group are 8 contiguous dims), and, from the
// group's first warp, each row's max and sum. `partials` and `row_stats` must be free for the CTA.
template <int kOutBlocks>
__device__ __forceinline__ void park_split_partials(uint8_t* partials, float2* row_stats, const float (&o_acc)[kOutBlocks][4],
                                                    const RowState& rows, int group, int quarter, int lane) {
  const int frag_row = lane / 4;
  const int frag_quad = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = group * kHeadsPerGroup + frag_row + 8 * h;
#pragma unroll
    for (int c = 0; c < kOutBlocks / 4; ++c) {
      const int chunk = (quarter * 128 + c * 32 + 8 * frag_quad) / 4;
      *reinterpret_cast<float4*>(partials + partial_chunk_offset(head, chunk)) =
          make_float4(o_acc[4 * c + 0][2 * h], o_acc[4 * c + 0][2 * h + 1], o_acc[4 * c + 1][2 * h], o_acc[4 * c + 1][2 * h + 1]);
      *reinterpret_cast<float4*>(partials + partial_chunk_offset(head, chunk + 1)) =
          make_float4(o_acc[4 * c + 2][2 * h], o_acc[4 * c + 2][2 * h + 1], o_acc[4 * c + 3][2 * h], o_acc[4 * c + 3][2 * h + 1]);
    }
    if (quarter == 0 && frag_quad == 0) row_stats[head] = make_float2(rows.max[h], rows.sum[h]);
  }
}

}  // namespace swa_decode::portable
