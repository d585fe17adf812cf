// The window/length/mask rule, in exactly one place for every kernel (docs/semantics.md, "Valid
// entries"). The CPU reference re-derives it independently from the document on purpose.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SWAD_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SWAD_HOST_DEVICE inline
#endif

namespace swa_decode {

// Number of leading index columns of a token that may hold entries: min(max(len, 0), window).
// Taking len as int64 keeps a length of -1 from wrapping to UINT_MAX.
SWAD_HOST_DEVICE int32_t columns_in_window(int64_t len, int32_t window_size) {
  if (len <= 0) return 0;
  return len < window_size ? static_cast<int32_t>(len) : window_size;
}

// A slot id names a cache row only when it lies in [0, num_slots); anything else (-1 padding,
// garbage, ids past the pool) is "no entry" and is never dereferenced.
SWAD_HOST_DEVICE bool slot_is_valid(int64_t slot, int64_t num_slots) {
  return slot >= 0 && slot < num_slots;
}

}  // namespace swa_decode
