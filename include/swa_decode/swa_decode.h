// swa-decode: sliding-window decode attention over a paged fp8 KV cache (DeepSeek-V4 shape).
//
// One entry point, `decode`, takes a plain argument struct of raw pointers, shapes and strides, so
// any framework can call it. It never allocates, never synchronizes and never prints on the CUDA
// path: it can be captured in a CUDA graph. The exact semantics (which entries are valid, the sink,
// the LSE convention) are written in docs/semantics.md and enforced in one place
// (src/api/validate.cpp + src/common/window_rule.h).
#pragma once

#include <cstdint>
#include <string>

#include "swa_decode/limits.h"

struct CUstream_st;  // cudaStream_t without pulling CUDA headers into every consumer.

namespace swa_decode {

// Element types the arguments may carry. Which argument accepts which is listed on the field.
enum class DType : int32_t { kBFloat16 = 0, kFloat32 = 1, kInt32 = 2, kInt64 = 3, kFloat8E4M3 = 4 };

// How a KV source lays out its rows (docs/semantics.md, "Row formats").
//  kE4m3: D e4m3 bytes per row, one inverse scale per slot in a separate inv_scale tensor.
//  kModel1: FlashMLA's 584-byte rows ("MODEL1", vLLM's fp8_ds_mla): per row 448 e4m3 bytes and 64
//    bf16 RoPE values (576 bytes), and per page block a footer of 8-byte scale rows (7 UE8M0 bytes,
//    one per 64 e4m3 dims) after the block's rows; inv_scale is unused.
enum class KvFormat : int32_t { kE4m3 = 0, kModel1 = 1 };

// The kModel1 layout's numbers, for validation and for callers sizing a cache.
inline constexpr int64_t kModel1HeadDim = 512;       // the layout is defined for D = 512 only
inline constexpr int64_t kModel1E4m3Dims = 448;      // dims 0..447: e4m3 bytes; 448..511: bf16 RoPE
inline constexpr int64_t kModel1RowBytes = 576;      // 448 + 64 * 2: the row stride
inline constexpr int64_t kModel1ScaleRowBytes = 8;   // 7 UE8M0 bytes (one per 64 e4m3 dims) + 1 pad

// What lse holds for a token without a valid entry (docs/semantics.md, "Edge cases"): -inf, the log
// of its empty sum, or +inf, FlashMLA's convention (flash_mla_with_kvcache returns +inf there), so
// that its drop-in needs no pass over lse after the kernel.
enum class EmptyTokenLse : int32_t { kNegativeInfinity = 0, kPositiveInfinity = 1 };

// Where the pointers live and where the work runs. kCpu runs the float64 reference (slow, exact).
enum class Backend : int32_t { kCuda = 0, kCpu = 1 };

enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,  // a pointer, shape, stride or dtype is wrong; the message names it
  kNotSupported = 2,     // valid input that no kernel of this build runs (e.g. head_dim 96 on GPU)
  kCudaError = 3,        // a CUDA call failed; the message carries cudaGetErrorString
  kInternal = 4,         // a bug or host out-of-memory inside the library; the message says what
};

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;  // empty when ok; otherwise names the argument, expected and actual value
  bool ok() const { return code == StatusCode::kOk; }
};

// A second KV source whose valid entries join the window's in the same softmax: DeepSeek-V4's
// compressed entries (the top-k an indexer picked in a C4A layer, all of a token's compressed
// positions in a C128A layer). Its own paged cache, scales, ids and lengths, with the window's
// rules (docs/semantics.md, "The extra source"). kv_cache == nullptr: no extra source, and every
// other field is ignored. Strides in elements (bytes for the cache), as in DecodeArgs.
struct KvSource {
  // ---- kv_cache: [num_blocks, block_size, D] e4m3 bytes, unit stride in D ----
  const void* kv_cache = nullptr;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t stride_kv_block = 0;
  int64_t stride_kv_token = 0;

  // ---- inv_scale: [num_scales] bf16 or fp32, one per slot; num_scales >= num_blocks * block_size
  const void* inv_scale = nullptr;
  DType inv_scale_dtype = DType::kBFloat16;
  int64_t num_scales = 0;

  // ---- indices: [T, index_cols] int32 or int64 slot ids, -1 = no entry; the first max_entries
  // columns of each row are read, so index_cols >= max_entries.
  const void* indices = nullptr;
  DType index_dtype = DType::kInt32;
  int64_t index_cols = 0;
  int64_t stride_indices_token = 0;

  // ---- lens: [T / lens_rows_per_entry] int32 or int64, contiguous, or nullptr. Negative counts as 0.
  // Entry e is the length of tokens [e * n, (e + 1) * n), n = lens_rows_per_entry, which must divide
  // T (n = s_q: FlashMLA's one length per batch row for its s_q query rows, read in place). nullptr:
  // every index column counts (the length is index_cols, then limited to max_entries as usual).
  const void* lens = nullptr;
  DType lens_dtype = DType::kInt32;
  int64_t lens_rows_per_entry = 1;

  // Index columns a token may use, 1..kMaxExtraEntries (the window's window_size).
  int64_t max_entries = 0;

  // Row layout of kv_cache; kModel1 ignores inv_scale and num_scales (the scales are in the cache).
  KvFormat format = KvFormat::kE4m3;
};

// All strides are in elements of the tensor's own dtype (bytes for the e4m3 cache).
struct DecodeArgs {
  // ---- shapes ----
  int64_t num_tokens = 0;   // T: decode rows (requests x speculative drafts); 0 is a valid no-op
  int64_t num_heads = 0;    // H: query heads, 1..kMaxGpuHeads on the GPU (limits.h)
  int64_t head_dim = kGpuHeadDim;  // D: GPU kernels run kGpuHeadDim; the CPU backend any positive value
  int64_t num_blocks = 0;   // pages in the cache
  int64_t block_size = 0;   // tokens per page (DeepSeek-V4 serving uses 256)
  int64_t window_size = 128;  // W: columns of `indices` read per token, 1..kMaxWindow (DeepSeek-V4: 128)
  float scale = 0.0f;         // softmax scale, usually head_dim^-0.5; must be finite

  // ---- q: [T, H, D] bf16, unit stride in D ----
  const void* q = nullptr;
  int64_t stride_q_token = 0;
  int64_t stride_q_head = 0;

  // ---- kv_cache: [num_blocks, block_size, D] e4m3 bytes, unit stride in D.
  // stride_kv_token may exceed D (e.g. 576 or 584 bytes per row in padded formats).
  const void* kv_cache = nullptr;
  int64_t stride_kv_block = 0;
  int64_t stride_kv_token = 0;
  KvFormat kv_format = KvFormat::kE4m3;  // kModel1: FlashMLA's 584-byte rows (see KvFormat)

  // ---- inv_scale: [num_scales] bf16 or fp32, one per slot (slot = block * block_size + offset);
  // a row dequantizes as e4m3 * inv_scale[slot]. num_scales >= num_blocks * block_size.
  const void* inv_scale = nullptr;
  DType inv_scale_dtype = DType::kBFloat16;
  int64_t num_scales = 0;

  // ---- indices: [T, index_cols] int32 or int64 slot ids, -1 = no entry; the first window_size
  // columns of each row are read, so index_cols >= window_size.
  const void* indices = nullptr;
  DType index_dtype = DType::kInt32;
  int64_t index_cols = 0;
  int64_t stride_indices_token = 0;

  // ---- lens: [T / lens_rows_per_entry] int32 or int64, contiguous, or nullptr. Negative counts as 0
  // (CUDA-graph padding rows). Entry e is the length of tokens [e * n, (e + 1) * n) for n =
  // lens_rows_per_entry, 1..kInt32Max, which must divide T (docs/semantics.md, "Valid entries").
  // nullptr: every index column counts (the length is index_cols, then limited to window_size).
  const void* lens = nullptr;
  DType lens_dtype = DType::kInt32;
  int64_t lens_rows_per_entry = 1;

  // ---- optional: the compressed entries, in the same softmax as the window (KvSource above).
  KvSource extra = {};

  // ---- optional: attn_sink [H] fp32 per-head sink logit, or nullptr for none. -inf = no sink.
  const float* attn_sink = nullptr;

  // ---- optional: lse [T, H] fp32 natural-log sum-exp of the scores WITHOUT the sink, or nullptr.
  float* lse = nullptr;
  int64_t stride_lse_token = 0;
  EmptyTokenLse empty_token_lse = EmptyTokenLse::kNegativeInfinity;  // lse of a token without entries

  // ---- out: [T, H, D] bf16, unit stride in D ----
  void* out = nullptr;
  int64_t stride_out_token = 0;
  int64_t stride_out_head = 0;

  Backend backend = Backend::kCuda;
  CUstream_st* stream = nullptr;  // CUDA stream; nullptr = legacy default stream
};

// What would run for a given shape, decided without touching the data or launching anything.
struct SupportInfo {
  bool supported = false;
  std::string kernel;   // e.g. "portable_mma_g2", "sm90_wgmma", "few_heads_n16", "cpu_reference"
  int32_t head_groups_per_cta = 0;  // 16-head groups one CTA holds (1 for the CPU path, 0 for sm90 and few_heads)
  std::string why_not;  // filled when !supported: which argument, what was expected, what was seen
  std::string family;   // the kernel's family when supported: "portable", "sm90", "few_heads" or "cpu"
};

// Validates `args` (shapes, strides, dtypes, null pointers) and answers what would run on
// `device_ordinal` (ignored for Backend::kCpu; -1 = the current device). Reads no tensor data.
SupportInfo query_support(const DecodeArgs& args, int device_ordinal = -1);

// Runs the op. On Backend::kCuda it enqueues on args.stream and returns at once (no sync); the
// pointers must be device memory. On Backend::kCpu it computes in float64 on host pointers.
Status decode(const DecodeArgs& args) noexcept;

// Semantic version of the library, e.g. "0.1.0".
const char* version() noexcept;

}  // namespace swa_decode
