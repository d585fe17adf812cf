// Which tokens each unit of the layer kernel runs, and in which order (perf-notes, layer v12). A
// unit is a pair (H > 64) or a lone CTA. Tokens differ in work by up to 250x: a C128A token at a 1M
// context has 0..16384 extra entries. Round robin (unit u: tokens u, u + U, ...) left the unit with
// the largest sum the last to finish, 1.8x the mean at T = 128. Every CTA costs every token from its
// two lengths, sorts the costs (largest first) and takes its share in a snake: round r's position
// r U + u, or r U + U - 1 - u on odd rounds. Each round's largest tokens thus pair with the next
// round's smallest. All CTAs compute the same order from the same lengths, so a pair's two CTAs
// agree on it, and nothing is written outside shared memory.
#pragma once

#include <cstdint>

#include "src/common/params.h"
#include "src/common/ptx/sm90.cuh"
#include "src/common/window_compaction.cuh"
#include "src/kernels/sm90/sm90_layer_plan.h"
#include "src/kernels/sm90/sm90_plan.h"
#include "swa_decode/limits.h"

namespace swa_decode::sm90 {

__device__ __forceinline__ ItemOrder& item_order(LayerSmemPlan& smem) {
  return *reinterpret_cast<ItemOrder*>(&smem.staging[kExchangeFirstRow][0] + kItemOrderOffset);
}

// The token of this CTA's item k (k < order.count).
__device__ __forceinline__ int item_token(const ItemOrder& order, int k) {
  return order.sorted ? order.tokens[k] : order.first + k * order.stride;
}

// A token's work in subtiles of kSubtileKeys entries, plus 1 for what every item pays once (its q,
// its records' waits, the epilogue). The compaction warp takes the same columns (its records hold
// 128 columns, two subtiles, so ceil(columns / 64) is its subtile count without holes).
inline constexpr int kMaxItemCost = 1 + kKeys / kSubtileKeys + static_cast<int>(kMaxExtraEntries) / kSubtileKeys;
__device__ __forceinline__ int item_cost(const TokenColumns& columns) {
  return 1 + (columns.window + kSubtileKeys - 1) / kSubtileKeys + (columns.extra + kSubtileKeys - 1) / kSubtileKeys;
}

// Sort keys in the q buffer, which nothing uses before the roles start: up to 16384 of 4 bytes. A
// key is (kMaxItemCost - cost) above the token (14 bits), so ascending keys are costs descending,
// ties by token: the same order in every CTA.
inline constexpr int kTokenBits = 14;
inline constexpr int kMaxSortedTokens = 1 << kTokenBits;
static_assert(kMaxSortedTokens * sizeof(uint32_t) <= sizeof(LayerSmemPlan::q), "the keys fit the q buffer");
static_assert(kMaxItemCost < (1 << (32 - kTokenBits)) - 1, "a cost fits above the token, below the padding key");
inline constexpr uint32_t kPaddingKey = 0xFFFFFFFFu;  // sorts after every real key
// Tokens a thread costs at once (order_items): T <= 1536 in one batch.
inline constexpr int kCostBatch = 4;

__device__ __forceinline__ uint32_t sort_key(int cost, int token) {
  return static_cast<uint32_t>(kMaxItemCost - cost) << kTokenBits | static_cast<uint32_t>(token);
}

// Ascending bitonic sort of n keys (n a power of two) by all kThreads threads; every stage ends in a
// CTA barrier. n / 2 compare-exchanges a stage, log2(n) (log2(n) + 1) / 2 stages: 66 at n = 2048.
__device__ __forceinline__ void bitonic_sort(uint32_t* keys, int n) {
  for (int block = 2; block <= n; block <<= 1) {
    for (int stride = block >> 1; stride > 0; stride >>= 1) {
      for (int c = threadIdx.x; c < n / 2; c += kThreads) {
        const int i = ((c & ~(stride - 1)) << 1) | (c & (stride - 1));  // the lower of the pair
        const uint32_t a = keys[i];
        const uint32_t b = keys[i + stride];
        const bool ascending = (i & block) == 0;
        if ((a > b) == ascending) {
          keys[i] = b;
          keys[i + stride] = a;
        }
      }
      __syncthreads();
    }
  }
}

// Up to kMaxRankedTokens tokens a key's rank is counted instead (the keys below it, all distinct
// by their token bits): one pass over the keys and 2 barriers, against bitonic's 28
// barrier-separated stages at T = 128. Each thread ranks kRankedPerThread tokens, reading the keys
// 4 at a time. Measured (perf-notes, layer v12b and v12c): 0.7 us faster at T = 128, but 3 us
// slower at T = 512, since the pass is quadratic (~37 K warp instructions an SM at T = 512).
inline constexpr int kRankedPerThread = 3;
inline constexpr int kMaxRankedTokens = kRankedPerThread * kThreads;  // 1152
inline constexpr int kRankedKeys = (kMaxRankedTokens + 3) / 4 * 4;    // padded to whole uint4
static_assert(2 * kRankedKeys * sizeof(uint32_t) <= sizeof(LayerSmemPlan::q),
              "keys and ranked tokens fit the q buffer");

// Ranks the kSlots tokens threadIdx.x, + kThreads, ... of this thread, every one of them a token.
template <int kSlots>
__device__ __forceinline__ void rank_slots(const uint32_t* keys, int tokens, int32_t* sorted) {
  uint32_t mine[kSlots];
  int rank[kSlots];
#pragma unroll
  for (int r = 0; r < kSlots; ++r) {
    mine[r] = keys[static_cast<int>(threadIdx.x) + r * kThreads];
    rank[r] = 0;
  }
  for (int j = 0; j < tokens; j += 4) {
    const uint4 k = *reinterpret_cast<const uint4*>(keys + j);
#pragma unroll
    for (int r = 0; r < kSlots; ++r) {
      rank[r] += (k.x < mine[r]) + (k.y < mine[r]) + (k.z < mine[r]) + (k.w < mine[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < kSlots; ++r) sorted[rank[r]] = static_cast<int>(threadIdx.x) + r * kThreads;
}

// sorted[rank of key i] = i for the tokens' keys (then padding keys up to a multiple of 4). A
// thread ranks only its slots that hold a token: ranking all kRankedPerThread on every thread was
// 2.7 us of the prologue at T = 128, where 128 of the 1152 slots are tokens (ncu, session 25).
__device__ __forceinline__ void rank_keys(const uint32_t* keys, int tokens, int32_t* sorted) {
  static_assert(kRankedPerThread == 3, "one branch a slot count");
  const int t = static_cast<int>(threadIdx.x);
  const int slots = t < tokens ? (tokens - 1 - t) / kThreads + 1 : 0;
  if (slots >= 3) {
    rank_slots<3>(keys, tokens, sorted);
  } else if (slots == 2) {
    rank_slots<2>(keys, tokens, sorted);
  } else if (slots == 1) {
    rank_slots<1>(keys, tokens, sorted);
  }
}

// Writes this CTA's ItemOrder; run by all kThreads threads before the roles start (it ends in a CTA
// barrier). Round robin where sorting cannot help (one token a unit or fewer) or does not fit (more
// than kMaxSortedTokens tokens, more than kItemOrderCapacity a unit). With a key split, one item:
// the cluster's token.
template <class Pair>
__device__ __forceinline__ void order_items(const DecodeParams& p, LayerSmemPlan& smem, const KeySplit& split) {
  const int units = static_cast<int>(gridDim.x) / Pair::kCtas;
  const int unit = static_cast<int>(blockIdx.x) / Pair::kCtas;
  const int tokens = p.num_tokens;
  ItemOrder& order = item_order(smem);
  // Tokens first, first + stride, ... (count of them), unsorted; ends the function's work.
  const auto walk = [&](int count, int first, int stride) {
    if (threadIdx.x == 0) {
      order.count = count;
      order.sorted = 0;
      order.first = first;
      order.stride = stride;
    }
    __syncthreads();
  };
  if constexpr (Pair::kSplitKeys) {
    const int token = static_cast<int>(blockIdx.x) / (Pair::kCtas * split.count);
    walk(token < tokens ? 1 : 0, token, 0);
    return;
  }
  const int rounds = tokens / units + (tokens % units != 0 ? 1 : 0);
  if (tokens <= units || tokens > kMaxSortedTokens || rounds > kItemOrderCapacity) {
    walk(unit < tokens ? (tokens - 1 - unit) / units + 1 : 0, unit, units);
    return;
  }
  uint32_t* keys = reinterpret_cast<uint32_t*>(&smem.q[0][0][0]);
  const bool ranked = tokens <= kMaxRankedTokens;
  // Keys up to a multiple of 4 (ranked) or a power of two (bitonic), the rest padding.
  const int n = ranked ? (tokens + 3) / 4 * 4 : 1 << (32 - __clz(tokens - 1));  // tokens >= 2 here
  // kCostBatch tokens' lengths a thread go out before any is used: one after another, each cost
  // waited for its two loads, ~T / 384 dependent round trips before the first item (T = 2048: 6).
  for (int first = threadIdx.x; first < n; first += kCostBatch * kThreads) {
    // Past the last token a batch reloads the last token's lengths (unconditional loads: no branch
    // for the compiler to put a wait in) and writes padding keys instead.
    IssuedLengths lengths[kCostBatch];
#pragma unroll
    for (int b = 0; b < kCostBatch; ++b) lengths[b] = issue_token_lengths(p, min(first + b * kThreads, tokens - 1));
#pragma unroll
    for (int b = 0; b < kCostBatch; ++b) {
      const int i = first + b * kThreads;
      if (i < n) keys[i] = i < tokens ? sort_key(item_cost(columns_of(p, lengths[b])), i) : kPaddingKey;
    }
  }
  __syncthreads();
  int32_t* const sorted = reinterpret_cast<int32_t*>(keys + kRankedKeys);
  if (ranked) {
    rank_keys(keys, tokens, sorted);
    __syncthreads();
  } else {
    bitonic_sort(keys, n);
  }
  const auto token_at = [&](int position) {
    return ranked ? sorted[position] : static_cast<int32_t>(keys[position] & (kMaxSortedTokens - 1));
  };
  // Every round but the last is whole, so only the last position can lie past the tokens.
  const auto position = [&](int round) { return round * units + (round % 2 == 0 ? unit : units - 1 - unit); };
  for (int r = threadIdx.x; r < rounds; r += kThreads) {
    const int at = position(r);
    if (at < tokens) order.tokens[r] = token_at(at);
  }
  if (threadIdx.x == 0) {
    order.count = position(rounds - 1) < tokens ? rounds : rounds - 1;
    order.sorted = 1;
  }
  // q's TMA loads (the async proxy) overwrite the keys these threads wrote.
  ptx::fence_proxy_async_shared();
  __syncthreads();
}

}  // namespace swa_decode::sm90
