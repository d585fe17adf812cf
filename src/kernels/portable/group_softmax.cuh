// The online softmax of one 16-head group, shared by the group's 4 warps (head-dim quarters).
//
// After QK each warp holds partial scores (its 128 dims) for all 32 keys of the tile. Instead of
// every warp summing all 4 partials and repeating the same softmax, warp w sums and exponentiates
// only key block w (8 keys), and the warps swap two small things through shared memory: each
// block's row maxima and the f16 probabilities the PV matmul needs as its A operand. Per warp and
// tile that is 4 16-byte loads of partials instead of 16 and 4 exponentials instead of 16.
//
// The running max is lazy: rows keep their max until a tile exceeds it by more than
// kRescaleSlack (log2 units), so the 64-register rescale of the output runs a few times per
// token instead of every tile. Probabilities then reach 2^kRescaleSlack, which fp32 sums and f16
// operands hold as well; the normalisation uses the same max, so the result is unchanged.
//
// The PV operand is P_j * inv_scale_j / value_norm in f16 (bf16 where the tiles are bf16; a
// kModel1 entry's inv_scale counts as 1, its scales being in its values), value_norm = the largest
// |inv_scale| of the entries so far (value_norm_of): the ratio is <= 1, so the operand is <= 256
// whatever the cache's scales are, and the epilogue multiplies by value_norm again. With an extra
// source the entries come in chunks and a later chunk may raise value_norm; the kernel then
// multiplies the accumulator by old / new value_norm (<= 1, a power of two: exact) before that
// chunk's tiles. A kModel1 value is up to bf16's largest, so sum_j P_j v_j / value_norm stays in
// fp32's range only while 256 x (the entries) x |v| does (|v| <= 2^100 at any entry count a token
// can have); docs/semantics.md says so.
#pragma once

#include <cstdint>

#include "src/common/fp8_convert.cuh"
#include "src/common/ptx/sm80.cuh"
#include "src/common/softmax_finalize.cuh"
#include "src/common/value_norm.cuh"
#include "src/kernels/portable/portable_plan.h"

namespace swa_decode::portable {

inline constexpr float kRescaleSlack = 8.0f;  // probabilities stay <= 256

// What a group's warps swap each tile (the partial scores go through the tile's staging stage).
struct GroupExchange {
  float row_max[16][kWarpsPerGroup];  // [fragment row][key block]: max over the block's 8 keys
  uint2 probs[kWarpsPerGroup][32];    // [key block][lane]: f16x2 (bf16x2) P of rows g and g + 8
};
static_assert(sizeof(GroupExchange) == kGroupExchangeBytes, "portable_plan.h sizes GroupExchange");

// Barrier of the group's 128 threads only (id 0 is __syncthreads).
__device__ __forceinline__ void group_barrier(int group) { ptx::named_barrier_sync<kWarpsPerGroup * 32>(group + 1); }

// Layout of the partial scores in `exchange` (16 x 32 x 4 floats per group): [fragment register
// (n8 block n, register r)][lane][quarter], each lane's quarters rotated by lane / 8 so that a
// warp's 32 stores hit 32 banks; a reader adds the 4 quarters of one value with one 16-byte load.
__device__ __forceinline__ void publish_partial_scores(float* exchange, const float (&s_acc)[4][4], int quarter,
                                                       int lane) {
  const int rotated_quarter = (quarter + lane / 8) % kWarpsPerGroup;
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) exchange[((n * 4 + r) * 32 + lane) * kWarpsPerGroup + rotated_quarter] = s_acc[n][r];
}

// Full scores of key block `block` for this lane: {row g, row g + 8} x {key 2q, 2q + 1}.
__device__ __forceinline__ void sum_partial_scores(const float* exchange, int block, int lane, float (&scores)[4]) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const float4 parts = *reinterpret_cast<const float4*>(&exchange[((block * 4 + r) * 32 + lane) * kWarpsPerGroup]);
    scores[r] = (parts.x + parts.y) + (parts.z + parts.w);
  }
}

// Running softmax state of this lane's two rows (g, g + 8), in the log2 domain.
struct RowState {
  float max[2] = {-INFINITY, -INFINITY};  // lazy running max, identical in the group's 4 warps
  float sum[2] = {0.0f, 0.0f};            // this lane's keys only; combined at the end
};

// One tile's softmax for the group. `scores`: raw q . k of this warp's key block (keys first_key,
// first_key + 1 for this lane; k the tile's e4m3 codes, or a kModel1 row's values); `inv_scale`:
// the compacted list's scales (kUnitScales: none, every key's is 1, as for kModel1 rows, whose
// scales are in their values); `row_logit`: scale * log2(e) / 2^k of rows g and g + 8 (q_f16.cuh;
// k = 0 for bf16 tiles); `inv_value_norm`: 1 / value_norm. Rescales o_acc when the max moves, and
// leaves in p_frag the PV A fragments (f16, or bf16 with kBf16P) of all 32 keys. Every warp of the
// group must call it (it holds two group barriers).
template <bool kBf16P, bool kUnitScales, int kOutBlocks>
__device__ __forceinline__ void group_softmax_tile(float (&scores)[4], int first_key, int num_valid,
                                                   const float* inv_scale, const float (&row_logit)[2],
                                                   float inv_value_norm, GroupExchange& ex, int group, int quarter,
                                                   int lane, RowState& state, float (&o_acc)[kOutBlocks][4],
                                                   uint32_t (&p_frag)[2][4]) {
  const int row = lane / 4;
  const bool valid[2] = {first_key < num_valid, first_key + 1 < num_valid};
  // The inverse scale factors out of q . e4m3; masked keys score -inf and weigh 0.
  const float key_scale[2] = {valid[0] ? (kUnitScales ? 1.0f : inv_scale[first_key]) : 0.0f,
                              valid[1] ? (kUnitScales ? 1.0f : inv_scale[first_key + 1]) : 0.0f};
#pragma unroll
  for (int r = 0; r < 4; ++r) scores[r] = valid[r & 1] ? scores[r] * (row_logit[r / 2] * key_scale[r & 1]) : -INFINITY;

  const float block_max[2] = {quad_max(fmaxf(scores[0], scores[1])), quad_max(fmaxf(scores[2], scores[3]))};
  if (lane % 4 == 0) {
    ex.row_max[row][quarter] = block_max[0];
    ex.row_max[row + 8][quarter] = block_max[1];
  }
  group_barrier(group);
  float tile_max[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float4 m = *reinterpret_cast<const float4*>(&ex.row_max[row + 8 * h][0]);
    tile_max[h] = fmaxf(fmaxf(m.x, m.y), fmaxf(m.z, m.w));
  }
  // Every tile holds a valid key, so tile_max is finite and the first tile always takes this
  // branch; the accumulator is still all zero then, so only the max and the sums move.
  const bool grows = tile_max[0] > state.max[0] + kRescaleSlack || tile_max[1] > state.max[1] + kRescaleSlack;
  if (__any_sync(0xFFFFFFFFu, grows)) {
    const bool first = __all_sync(0xFFFFFFFFu, state.max[0] == -INFINITY && state.max[1] == -INFINITY);
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float new_max = fmaxf(state.max[h], tile_max[h]);
      alpha[h] = ptx::exp2_approx(state.max[h] - new_max);
      state.max[h] = new_max;
      state.sum[h] *= alpha[h];
    }
    if (!first) {
#pragma unroll
      for (int n = 0; n < kOutBlocks; ++n) {
        o_acc[n][0] *= alpha[0];
        o_acc[n][1] *= alpha[0];
        o_acc[n][2] *= alpha[1];
        o_acc[n][3] *= alpha[1];
      }
    }
  }

  float prob[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    // ptx::exp2_approx needs no range fix-up here: the argument is <= kRescaleSlack or -inf, and
    // the 2^-126 it flushes to 0 cannot be told from the exact value next to the max's 1.
    prob[r] = ptx::exp2_approx(scores[r] - state.max[r / 2]);
    state.sum[r / 2] += prob[r];
  }
  // The numerator carries the inverse scale: out = value_norm * sum_j (p_j * inv_scale_j /
  // value_norm) * e4m3_j.
  const float ratio[2] = {key_scale[0] * inv_value_norm, key_scale[1] * inv_value_norm};
  const auto pack = [](float lo, float hi) { return kBf16P ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi); };
  ex.probs[quarter][lane] =
      make_uint2(pack(prob[0] * ratio[0], prob[1] * ratio[1]), pack(prob[2] * ratio[0], prob[3] * ratio[1]));
  group_barrier(group);
  // A fragment of k-step ks: keys 16 ks .. 16 ks + 15 = key blocks 2 ks and 2 ks + 1.
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    const uint2 lo = ex.probs[2 * ks][lane];
    const uint2 hi = ex.probs[2 * ks + 1][lane];
    p_frag[ks][0] = lo.x;
    p_frag[ks][1] = lo.y;
    p_frag[ks][2] = hi.x;
    p_frag[ks][3] = hi.y;
  }
}

// The largest |inv_scale| of a compacted list for value_norm_of. A kModel1 entry has none: its P
// is its probability itself, as if its inv_scale were 1, so a non-empty kModel1 list gives 1.
template <bool kModel1>
__device__ __forceinline__ float listed_scale_magnitude(const float* inv_scale, int n, int lane) {
  if constexpr (kModel1) {
    return n > 0 ? 1.0f : 0.0f;
  } else {
    return list_max_magnitude(inv_scale, n, lane);
  }
}

// The group's row sums, once after the last tile: each warp summed only its own key blocks.
__device__ __forceinline__ void combine_row_sums(GroupExchange& ex, int group, int quarter, int lane,
                                                 RowState& state) {
  const int row = lane / 4;
  const float mine[2] = {quad_sum(state.sum[0]), quad_sum(state.sum[1])};
  // Safe to overwrite row_max: every warp of the group read it before the last tile's second
  // barrier, which this warp has passed (with no tile, before the barrier the kernel adds).
  if (lane % 4 == 0) {
    ex.row_max[row][quarter] = mine[0];
    ex.row_max[row + 8][quarter] = mine[1];
  }
  group_barrier(group);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float4 s = *reinterpret_cast<const float4*>(&ex.row_max[row + 8 * h][0]);
    state.sum[h] = (s.x + s.y) + (s.z + s.w);
  }
}

}  // namespace swa_decode::portable
