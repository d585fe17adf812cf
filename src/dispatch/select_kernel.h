// The one place that decides which kernel runs for a shape on a device. Pure: no CUDA calls, so it
// is unit-tested on machines without a GPU and also answers query_support().
#pragma once

#include <cstdint>
#include <string>

namespace swa_decode {

enum class KernelId : int32_t { kNone = 0, kPortableMma = 1, kSm90Wgmma = 2 };

// What the selection needs to know about the problem (already validated by src/api/).
struct DecodeShape {
  int64_t num_tokens;
  int64_t num_heads;
  int64_t head_dim;
  int64_t window_size;
  // Largest power of two <= 16 dividing the kv_cache address and both its strides (bytes): rows
  // are copied in pieces of this width, and below 4 bytes no GPU kernel runs.
  int32_t kv_row_alignment;
  // q and out rows are read and written 16 bytes at a time: their addresses and token/head strides
  // must be multiples of 8 elements (16 bytes).
  bool q_out_aligned_16;
  // Bytes from the kv_cache address to the start of its last row (the sm90 kernel keeps row
  // offsets as 32-bit counts of 16 bytes, so it needs this below 64 GiB).
  int64_t kv_last_row_offset = 0;
};

// What the selection needs to know about the GPU (read once by the caller via cudaGetDeviceProperties).
struct DeviceInfo {
  int32_t cc_major;
  int32_t cc_minor;
  int32_t num_sms;
  int64_t smem_optin_bytes;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
};

struct KernelChoice {
  KernelId id = KernelId::kNone;
  int32_t head_groups_per_cta = 0;  // 16-head groups one CTA holds (portable kernel)
  int32_t num_stages = 0;           // staging buffers of 32 cache rows (portable kernel)
  int32_t window_splits = 0;        // CTAs (one cluster) sharing each window (portable kernel, sm_90+)
  int32_t persistent_ctas = 0;      // CTAs of a persistent kernel (sm90: one per SM)
  std::string name;                 // stable, printed by the bench and query_support
  std::string why_not;              // set when id == kNone
};

// Whether this build contains the sm_90a fast path (CMake builds it when sm_90 is a target).
bool sm90_kernel_built();

// `only` restricts the choice to one kernel family (KernelId::kNone = free choice).
KernelChoice select_kernel(const DecodeShape& shape, const DeviceInfo& device, KernelId only = KernelId::kNone);

}  // namespace swa_decode
