// run_decode: the binding's one way into swa_decode::decode, whichever way its arrays came in
// (swa_decode_ext.cpp). It checks what DecodeArgs cannot express (rank, the unit stride in D, one
// device for all, the DLPack dtype of each tensor) and every shape a tensor carries that another
// tensor or an argument can contradict (T, H, D across tensors; kv_cache.shape[1] against
// block_size; inv_scale.shape[0] against the slots; indices.shape[1] against window_size), so
// that DecodeArgs never describes more than the tensors hold and messages name the Python
// argument. It also owns the defaults (scale = D ** -0.5, window_size = the index columns) and
// the (1, T, W) layout of indices. The window and the optional extra source (DecodeArgs::extra)
// are checked by one function, so each rule holds for both under the source's own names. Every
// other rule (ranges, strides, limits, what the GPU supports) is the C++ layer's, and its Status
// comes back as an exception with the message intact: ValueError for kInvalidArgument and
// kNotSupported, RuntimeError for kCudaError and kInternal.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "array_view.h"
#include "swa_decode/swa_decode.h"

namespace swa_decode_py {

// DLPack device types (dlpack.h): the only two a decode can run on.
inline constexpr int32_t kDLCPU = 1;
inline constexpr int32_t kDLCUDA = 2;

// Bits of `bf16_views`: which of q / inv_scale / out / extra_inv_scale the Python layer re-viewed
// from a bfloat16 dtype DLPack cannot carry (numpy's ml_dtypes) as uint16. Only those may arrive as
// uint16.
inline constexpr int kViewQ = 1, kViewInvScale = 2, kViewOut = 4, kViewExtraInvScale = 8;

// The Python spellings of swa_decode::KvFormat.
inline constexpr const char* kE4m3Name = "e4m3";
inline constexpr const char* kModel1Name = "model1";

// The layouts the window's indices may have: the seed's batch dimension of one is dropped.
inline constexpr const char* kIndicesLayout = "2-D (T, W) or 3-D (1, T, W)";

// The arrays of one call, however they arrived; the optional ones are empty when not given.
struct DecodeArrays {
  ArrayView q, kv_cache, indices, out;
  std::optional<ArrayView> lens;       // absent: every index column counts
  std::optional<ArrayView> inv_scale;  // absent: only for kv_format 'model1'
  std::optional<ArrayView> attn_sink, lse;
  std::optional<ArrayView> extra_kv_cache, extra_inv_scale, extra_indices, extra_lens;
};

// The scalar arguments; an empty one takes its default.
struct DecodeScalars {
  int64_t block_size;
  std::optional<double> scale;         // default: head_dim ** -0.5
  std::optional<int64_t> window_size;  // default: indices.shape[-1]
  std::optional<int64_t> extra_block_size;
  std::optional<int64_t> extra_window;  // default: extra_indices.shape[1] (checked_extra)
  std::string kv_format;                // the Python spelling, parsed_format's to check
  std::string extra_kv_format;
  int64_t lens_rows_per_entry;          // tokens one lens entry covers; validate_args' range
  std::optional<int64_t> extra_lens_rows_per_entry;  // default 1 (checked_extra)
  // -inf (decode's default) or +inf (FlashMLA's, flash_mla_exchange's) for a token without entries.
  swa_decode::EmptyTokenLse empty_token_lse = swa_decode::EmptyTokenLse::kNegativeInfinity;
};

// The scalar arguments of the entry points, in their order. empty_lse_positive: +inf (FlashMLA's)
// rather than -inf for a token without entries. A flag, not decode()'s float empty_token_lse: the
// Python layer checks that float in one place and maps it to the flag, which cannot name a third
// value (and the custom ops take the flag too: torch.library's schema parser refuses a float
// default of -inf).
DecodeScalars scalars_of(int64_t block_size, std::optional<double> scale,
                         std::optional<int64_t> window_size, std::optional<int64_t> extra_block_size,
                         std::optional<int64_t> extra_window, std::string kv_format,
                         std::string extra_kv_format, int64_t lens_rows_per_entry,
                         std::optional<int64_t> extra_lens_rows_per_entry,
                         bool empty_lse_positive);

// out[t, h, :] = attention of q[t, h, :] over token t's window entries and, with an extra
// source, its extra entries, in one softmax; see docs/semantics.md.
void run_decode(const DecodeArrays& a, const DecodeScalars& s, uintptr_t stream, int bf16_views);

}  // namespace swa_decode_py
