// Gathers a token's valid entries into a dense list in shared memory, in column order, once per
// CTA. After this, masking is only "key index < num_valid": holes (-1), out-of-range ids and
// columns past the length are skipped instead of computed and masked, and no kernel re-derives the
// rule (src/common/window_rule.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include "src/common/fp8_convert.cuh"
#include "src/common/params.h"
#include "src/common/ptx/sm80.cuh"
#include "src/common/window_rule.h"

namespace swa_decode {

// A token's length in `src` (docs/semantics.md, "Valid entries"): lens[token / lens_rows_per_entry],
// one division per token and source, outside every per-entry loop. No lens: every index column
// counts; index_cols >= max_entries, so max_entries is what columns_in_window keeps of it either way.
// Issued and read apart (issue_token_length, then length_of), so that a caller's loads of several
// lengths go out before any is used: widened inside the int32 / int64 branch, each load waited for
// before the next was issued (the layer kernel's SASS, perf-notes "Session 24"). Each width loads
// into a register of its own (merged into one 64-bit value, the int32 load's move waited for it).
struct IssuedLength {
  int64_t wide;     // int64 lens, or max_entries without lens
  int32_t narrow;   // int32 lens
};
__device__ __forceinline__ IssuedLength issue_token_length(const KvSourceParams& src, int token) {
  IssuedLength length{src.max_entries, 0};
  if (src.lens != nullptr) {
    const int entry = token / src.lens_rows_per_entry;
    if (src.lens_is_i64) {
      length.wide = static_cast<const int64_t*>(src.lens)[entry];
    } else {
      length.narrow = static_cast<const int32_t*>(src.lens)[entry];
    }
  }
  return length;
}
__device__ __forceinline__ int64_t length_of(const KvSourceParams& src, const IssuedLength& length) {
  return src.lens == nullptr || src.lens_is_i64 ? length.wide : static_cast<int64_t>(length.narrow);
}

// The index columns of a token in `src` that may hold entries: its length cut to the source's limit.
__device__ __forceinline__ int columns_of(const KvSourceParams& src, const IssuedLength& length) {
  return columns_in_window(length_of(src, length), src.max_entries);
}
__device__ __forceinline__ int token_columns(const KvSourceParams& src, int token) {
  return columns_of(src, issue_token_length(src, token));
}

// Both sources' index columns of `token` (extra: 0 without one), both lengths issued before either
// is used; issue_token_lengths and columns_of apart let a caller issue several tokens' first.
struct IssuedLengths {
  IssuedLength window;
  IssuedLength extra;
};
struct TokenColumns {
  int window;
  int extra;
};
__device__ __forceinline__ IssuedLengths issue_token_lengths(const DecodeParams& p, int token) {
  return {issue_token_length(p.window, token),
          p.extra.kv_cache != nullptr ? issue_token_length(p.extra, token) : IssuedLength{0, 0}};
}
__device__ __forceinline__ TokenColumns columns_of(const DecodeParams& p, const IssuedLengths& lengths) {
  return {columns_of(p.window, lengths.window), p.extra.kv_cache != nullptr ? columns_of(p.extra, lengths.extra) : 0};
}
__device__ __forceinline__ TokenColumns token_columns_of_both(const DecodeParams& p, int token) {
  return columns_of(p, issue_token_lengths(p, token));
}

// Elements from src.indices to `token`'s slot id in index column `column`.
__device__ __forceinline__ int64_t slot_id_offset(const KvSourceParams& src, int token, int column) {
  return token * src.stride_indices_token + column;
}

// An entry's inverse scale (fp32 or bf16, src.inv_scale_is_f32) as its bits, loaded apart from
// their widening so that a pass's scale loads all go out before any is used (load_columns).
__device__ __forceinline__ uint32_t load_inv_scale_bits(const KvSourceParams& src, int64_t slot) {
  return src.inv_scale_is_f32 ? static_cast<const uint32_t*>(src.inv_scale)[slot]
                              : static_cast<const uint16_t*>(src.inv_scale)[slot];
}
// bf16 bits widen exactly (bf16_bits_to_float), fp32 bits are the float.
__device__ __forceinline__ float inv_scale_of_bits(const KvSourceParams& src, uint32_t bits) {
  return src.inv_scale_is_f32 ? __uint_as_float(bits) : bf16_bits_to_float(static_cast<uint16_t>(bits));
}
__device__ __forceinline__ float load_inv_scale(const KvSourceParams& src, int64_t slot) {
  return inv_scale_of_bits(src, load_inv_scale_bits(src, slot));
}

// A compacted row offset: bytes from src.kv_cache as int64, or 16-byte units as uint32 where rows are
// 16-byte aligned and the cache spans at most 64 GiB (the sm90 kernel, to save 1 KiB of its
// shared memory; select_kernel checks both).
__device__ __forceinline__ void store_row_offset(int64_t* dst, int64_t bytes) { *dst = bytes; }
__device__ __forceinline__ void store_row_offset(uint32_t* dst, int64_t bytes) {
  *dst = static_cast<uint32_t>(bytes >> 4);
}

// A compacted entry of a kModel1 source (docs/semantics.md, "Row formats"): its slot's block and
// offset in the block, from which the row and its scale row in the block's footer are both found.
// It carries no inv_scale (its scales travel with the row). 32 bits each: the portable kernel
// checks that a kModel1 cache has fewer than 2^32 blocks (block_size is an int32 already).
struct SlotInBlock {
  uint32_t block;
  uint32_t offset;
};

// Bytes from src.kv_cache to the row of slot `in_block` of block `block` (the paged layout).
__device__ __forceinline__ int64_t row_offset_in_cache(const KvSourceParams& src, int64_t block, int64_t in_block) {
  return block * src.stride_kv_block + in_block * src.stride_kv_token;
}
__device__ __forceinline__ int64_t row_offset_in_cache(const KvSourceParams& src, SlotInBlock entry) {
  return row_offset_in_cache(src, entry.block, entry.offset);
}
// The slot id a compacted entry came from.
__device__ __forceinline__ int64_t slot_of(const KvSourceParams& src, SlotInBlock entry) {
  return static_cast<int64_t>(entry.block) * src.block_size + entry.offset;
}

// Columns per thread of one compaction pass: fewer threads than the pass's columns take several
// columns each.
template <int kThreads, int kColumnsPerPass>
constexpr int compaction_columns_per_thread() {
  return kThreads >= kColumnsPerPass ? 1 : kColumnsPerPass / kThreads;
}

// One pass of compact_columns (below) as loaded, before anything is written: each thread's slot
// ids of columns base + k * kThreads + tid, whether each is valid, and (kE4m3 rows compacted into
// row offsets) its inverse scale. Splitting the loads from the writes lets a caller issue a pass's
// two dependent round trips (indices, then scales) before it waits for the list it writes into
// (the sm90 layer kernel's compaction warp).
template <int kColumnsPerThread>
struct LoadedColumns {
  int64_t slot[kColumnsPerThread];
  bool valid[kColumnsPerThread];
  float scale[kColumnsPerThread];  // unused for RowOffset = SlotInBlock
};

// Issues all of a pass's index loads, then all of its scale loads, before using any. Each load
// sits alone in its branch and is widened in a loop of its own after the last one is out: widened
// inside the branch, every load waited for the one before (the layer kernel's compaction warp
// before session 24: 4 dependent round trips a lane for the ids and 4 for the scales). The ids'
// int32 / int64 branch goes around the whole pass (kHoistIdType): per column, the int32 load's
// move into the 64-bit slot waited for it; the portable kernel's two-group extra pass keeps the
// per-column form, since the hoisted one spills it 8 B (and its 256 threads load 4 ids each).
template <int kThreads, int kColumnsPerThread, bool kSlotsInBlocks, bool kHoistIdType = true>
__device__ __forceinline__ LoadedColumns<kColumnsPerThread> load_columns(const KvSourceParams& src, int token, int base,
                                                                         int column_end, int tid) {
  LoadedColumns<kColumnsPerThread> loaded;
  const int64_t row = slot_id_offset(src, token, 0);
  if (kHoistIdType && src.index_is_i64) {
    const int64_t* const ids = static_cast<const int64_t*>(src.indices) + row;
#pragma unroll
    for (int k = 0; k < kColumnsPerThread; ++k) {
      const int column = base + k * kThreads + tid;
      loaded.slot[k] = column < column_end ? ids[column] : int64_t{-1};
    }
  } else if (kHoistIdType) {
    const int32_t* const ids = static_cast<const int32_t*>(src.indices) + row;
    int32_t narrow[kColumnsPerThread];
#pragma unroll
    for (int k = 0; k < kColumnsPerThread; ++k) {
      const int column = base + k * kThreads + tid;
      narrow[k] = column < column_end ? ids[column] : -1;
    }
#pragma unroll
    for (int k = 0; k < kColumnsPerThread; ++k) loaded.slot[k] = narrow[k];
  } else {
    uint64_t id_bits[kColumnsPerThread];  // an int32 id in the low half
#pragma unroll
    for (int k = 0; k < kColumnsPerThread; ++k) {
      const int column = base + k * kThreads + tid;
      id_bits[k] = ~uint64_t{0};  // -1 either way
      if (column < column_end) {
        id_bits[k] = src.index_is_i64 ? static_cast<const uint64_t*>(src.indices)[row + column]
                                      : static_cast<const uint32_t*>(src.indices)[row + column];
      }
    }
#pragma unroll
    for (int k = 0; k < kColumnsPerThread; ++k) {
      loaded.slot[k] = src.index_is_i64 ? static_cast<int64_t>(id_bits[k])
                                        : static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(id_bits[k])));
    }
  }
#pragma unroll
  for (int k = 0; k < kColumnsPerThread; ++k) {
    loaded.valid[k] = base + k * kThreads + tid < column_end && slot_is_valid(loaded.slot[k], src.num_slots);
  }
  if constexpr (!kSlotsInBlocks) {
    // A kModel1 row carries its scales (applied when it is dequantized): compacted as row offsets
    // (the sm90 layer kernel) its entry's factor is 1, and its inv_scale (null) is never read.
    uint32_t scale_bits[kColumnsPerThread];
#pragma unroll
    for (int k = 0; k < kColumnsPerThread; ++k) {
      scale_bits[k] = 0;
      if (loaded.valid[k] && !src.is_model1) scale_bits[k] = load_inv_scale_bits(src, loaded.slot[k]);
    }
#pragma unroll
    for (int k = 0; k < kColumnsPerThread; ++k) {
      loaded.scale[k] = !loaded.valid[k] ? 0.0f : src.is_model1 ? 1.0f : inv_scale_of_bits(src, scale_bits[k]);
    }
  }
  return loaded;
}

// Appends a loaded pass's valid entries, in column order, after the num_valid already listed;
// returns the new count. compact_columns says what is written and how `sync` is used.
template <int kThreads, int kColumnsPerThread, typename Sync, typename RowOffset>
__device__ __forceinline__ int write_columns(const LoadedColumns<kColumnsPerThread>& loaded,
                                             const KvSourceParams& src, int num_valid, int tid, Sync sync,
                                             RowOffset* s_row_offset, float* s_inv_scale, int* s_warp_counts,
                                             int64_t row_offset_bias) {
  constexpr int kWarps = kThreads / 32;
  constexpr bool kModel1 = std::is_same_v<RowOffset, SlotInBlock>;
  const int lane = tid % 32;
  const int warp = tid / 32;
  // Slot ids below 2^31 (every cache of fewer slots) take 32-bit divisions by block_size, a
  // fraction of the 64-bit ones' instructions (the same for every entry of the source).
  const bool narrow_slots = src.num_slots <= INT32_MAX;
  const auto block_of = [&](int64_t slot) {
    return narrow_slots ? static_cast<int64_t>(static_cast<uint32_t>(slot) / static_cast<uint32_t>(src.block_size))
                        : slot / src.block_size;
  };
#pragma unroll
  for (int k = 0; k < kColumnsPerThread; ++k) {
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, loaded.valid[k]);
    if (lane == 0) s_warp_counts[warp] = __popc(ballot);
    sync();
    int before = num_valid;
    int slice_total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int count = s_warp_counts[w];
      before += (w < warp) ? count : 0;
      slice_total += count;
    }
    if (loaded.valid[k]) {
      const int entry = before + __popc(ballot & ((1u << lane) - 1u));
      const int64_t block = block_of(loaded.slot[k]);
      const int64_t in_block = loaded.slot[k] - block * src.block_size;
      if constexpr (kModel1) {
        s_row_offset[entry] = SlotInBlock{static_cast<uint32_t>(block), static_cast<uint32_t>(in_block)};
      } else {
        store_row_offset(&s_row_offset[entry], row_offset_bias + row_offset_in_cache(src, block, in_block));
        s_inv_scale[entry] = loaded.scale[k];
      }
    }
    num_valid += slice_total;
    sync();  // s_warp_counts is rewritten by the next slice of columns
  }
  return num_valid;
}

// Writes, for each valid entry of `token` among columns [column_begin, column_end) of src.indices,
// in column order, row_offset_bias plus the offset of its cache row from src.kv_cache to
// s_row_offset[0, n) (store_row_offset; a bias lets a kernel address two sources' rows from one
// base) and its inverse scale to s_inv_scale[0, n); returns n. With RowOffset = SlotInBlock (a
// kModel1 source) it writes the entry's block and offset instead, reads no inv_scale and writes
// nothing to s_inv_scale (which may then be null); row_offset_bias is unused. A kE4m3 source
// compacted so (the few-heads kernel) leaves its inv_scales to the caller, who finds them from the
// slot. A kModel1 source compacted into row offsets (the sm90 layer kernel, which finds the scale
// row from the offset) gets inverse scale 1 for every entry. The caller clips the range to the
// token's length (columns_in_window). The slot -> (block, offset) division
// happens here once per entry, not once per copy.
// Run by kThreads threads numbered `tid` = 0..kThreads-1 (whole warps); `sync` is a barrier over
// exactly those threads. s_warp_counts needs kThreads / 32 ints. Every thread has passed `sync`
// before the first entry is written (so the lists may still be in use when it is called), and on
// return every entry written is visible to all participating threads (the last write is followed
// by `sync`).
// A pass covers kColumnsPerPass columns (load_columns, then write_columns), so a pass costs two
// dependent global round trips whatever the thread count: a single warp compacts a 128-entry
// window in three (length, indices, scales) instead of nine, and 128 threads a 1024-column chunk
// of the extra source in two instead of sixteen.
template <int kThreads, int kColumnsPerPass, bool kHoistIdType = true, typename Sync, typename RowOffset>
__device__ int compact_columns(const KvSourceParams& src, int token, int column_begin, int column_end, int tid, Sync sync,
                               RowOffset* s_row_offset, float* s_inv_scale, int* s_warp_counts,
                               int64_t row_offset_bias = 0) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps only");
  constexpr int kColumnsPerThread = compaction_columns_per_thread<kThreads, kColumnsPerPass>();
  constexpr bool kModel1 = std::is_same_v<RowOffset, SlotInBlock>;
  int num_valid = 0;
  for (int base = column_begin; base < column_end; base += kThreads * kColumnsPerThread) {
    const LoadedColumns<kColumnsPerThread> loaded =
        load_columns<kThreads, kColumnsPerThread, kModel1, kHoistIdType>(src, token, base, column_end, tid);
    num_valid = write_columns<kThreads>(loaded, src, num_valid, tid, sync, s_row_offset, s_inv_scale, s_warp_counts,
                                        row_offset_bias);
  }
  return num_valid;
}

// Pulls the lines of a token's first kColumns index columns of `src` into L1, `tid` of kThreads
// threads taking columns tid, tid + kThreads, ..., before the length that bounds them is known
// (columns below max_entries, which the indices hold whatever the length; read, never dereferenced
// past it: docs/semantics.md). The compaction's id loads after the length then hit L1 instead of
// making a second dependent round trip to HBM. Prefetches, not loads: nothing is held in registers
// across the length's round trip (loads held so spilled the portable kernel, which does not call
// this: its two-group variant spilled even with the prefetches).
template <int kThreads, int kColumns>
__device__ __forceinline__ void prefetch_index_columns_l1(const KvSourceParams& src, int token, int tid) {
  const size_t id_bytes = src.index_is_i64 ? sizeof(int64_t) : sizeof(int32_t);
  const char* const ids = static_cast<const char*>(src.indices) + slot_id_offset(src, token, 0) * id_bytes;
#pragma unroll
  for (int column = tid; column < kColumns; column += kThreads) {
    if (column < src.max_entries) ptx::prefetch_l1(ids + column * id_bytes);
  }
}

// All of a token's valid entries of `src` (its window: at most max_entries <= 1024 columns), 128
// columns a pass; compact_columns says the rest.
template <int kThreads, typename Sync, typename RowOffset>
__device__ int compact_window(const KvSourceParams& src, int token, int tid, Sync sync, RowOffset* s_row_offset,
                              float* s_inv_scale, int* s_warp_counts) {
  const int columns = token_columns(src, token);
  return compact_columns<kThreads, 128>(src, token, 0, columns, tid, sync, s_row_offset, s_inv_scale, s_warp_counts);
}

}  // namespace swa_decode
