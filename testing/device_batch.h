// A HostBatch on the device: the poisoned pool, its live rows, and DecodeArgs over any contiguous
// range of its tokens (the bench slices one uploaded batch into several input sets this way).
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "swa_decode/swa_decode.h"
#include "testing/batch.h"
#include "testing/device_buffer.h"

namespace swa_decode::testing {

struct DeviceBatch {
  DeviceBuffer q, kv_cache, inv_scale, indices, lens, sinks, lse, out;
  // The extra source's (empty without one; its cache and scales empty when it shares the window's).
  DeviceBuffer extra_kv_cache, extra_inv_scale, extra_indices, extra_lens;
};

// Allocates and fills every tensor; each pool is written as its poison (HostSource::poison_byte)
// everywhere but the live rows. A kModel1 source has no inv_scale buffer (its scales are in the cache).
DeviceBatch upload_batch(const HostBatch& batch);

// Writes `batch` into buffers already allocated for a batch of the same sizes (throws
// std::invalid_argument otherwise), e.g. new inputs for a captured CUDA graph. Returns once the
// device holds the data, so that a decode on any stream sees it.
void upload_into(const HostBatch& batch, DeviceBatch& device);

// Backend::kCuda arguments for tokens [token_begin, token_begin + token_count).
DecodeArgs device_args(const HostBatch& batch, const DeviceBatch& device, int64_t token_begin,
                       int64_t token_count, cudaStream_t stream);

// Fills out with bf16 NaN (0xFFFF) and lse with fp32 NaN, so any element the kernel does not write
// shows up in the check.
void poison_outputs(DeviceBatch& device, cudaStream_t stream);

struct Outputs {
  std::vector<uint16_t> out;  // bf16 bits, [num_tokens * out_token_stride]
  std::vector<float> lse;     // [num_tokens * lse_token_stride], or empty
};
Outputs download_outputs(const DeviceBatch& device);

}  // namespace swa_decode::testing
