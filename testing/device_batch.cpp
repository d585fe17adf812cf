#include "testing/device_batch.h"

#include <stdexcept>
#include <string>

#include "testing/cuda_check.h"
#include "testing/host_numerics.h"

namespace swa_decode::testing {

namespace {

void write(DeviceBuffer& buffer, const void* host, size_t bytes, const char* name) {
  if (buffer.bytes() != bytes) {
    throw std::invalid_argument(std::string("upload_into: ") + name + " needs " + std::to_string(bytes) +
                                " bytes, the buffer has " + std::to_string(buffer.bytes()));
  }
  if (bytes > 0) buffer.upload(host, bytes);
}

template <typename T>
void write(DeviceBuffer& buffer, const std::vector<T>& host, const char* name) {
  write(buffer, host.data(), host.size() * sizeof(T), name);
}

}  // namespace

DeviceBatch upload_batch(const HostBatch& batch) {
  DeviceBatch d;
  d.q = DeviceBuffer(batch.q.size() * sizeof(uint16_t));
  d.indices = DeviceBuffer(batch.indices.size() * batch.index_bytes());
  d.lens = DeviceBuffer(batch.lens.size() * (batch.options.lens_dtype == DType::kInt32 ? 4 : 8));
  d.inv_scale = DeviceBuffer(batch.num_slots * batch.scale_bytes());
  d.sinks = DeviceBuffer(batch.sinks.size() * sizeof(float));
  d.kv_cache = DeviceBuffer(batch.kv_cache_bytes());
  d.out = DeviceBuffer(batch.num_tokens * batch.out_token_stride * sizeof(uint16_t));
  if (batch.options.with_lse) d.lse = DeviceBuffer(batch.num_tokens * batch.lse_token_stride * sizeof(float));
  upload_into(batch, d);
  return d;
}

void upload_into(const HostBatch& batch, DeviceBatch& d) {
  write(d.q, batch.q, "q");
  write(d.indices, encode_ints(batch.indices, batch.options.index_dtype), "indices");
  write(d.lens, encode_ints(batch.lens, batch.options.lens_dtype), "lens");
  write(d.inv_scale, dense_inv_scale(batch), "inv_scale");
  write(d.sinks, batch.sinks, "attn_sink");
  if (d.kv_cache.bytes() != static_cast<size_t>(batch.kv_cache_bytes())) {
    throw std::invalid_argument("upload_into: kv_cache size differs from the batch's pool");
  }
  SWAD_TESTING_CUDA_CHECK(cudaMemset(d.kv_cache.get(), kE4m3NaN, d.kv_cache.bytes()));
  // Live slots come in runs of consecutive rows (a window spans at most a few blocks), so one 2-D
  // copy per run writes D bytes per row and leaves the row and block padding poisoned.
  const auto& slots = batch.live_slots;
  for (size_t begin = 0; begin < slots.size();) {
    size_t end = begin + 1;
    while (end < slots.size() &&
           batch.kv_row_offset(slots[end]) == batch.kv_row_offset(slots[end - 1]) + batch.kv_row_stride) {
      ++end;
    }
    SWAD_TESTING_CUDA_CHECK(cudaMemcpy2D(d.kv_cache.as<uint8_t>() + batch.kv_row_offset(slots[begin]),
                                         batch.kv_row_stride, &batch.live_rows[begin * batch.head_dim],
                                         batch.head_dim, batch.head_dim, end - begin,
                                         cudaMemcpyHostToDevice));
    begin = end;
  }
}

DecodeArgs device_args(const HostBatch& batch, const DeviceBatch& device, int64_t token_begin,
                       int64_t token_count, cudaStream_t stream) {
  const int64_t index_bytes = batch.index_bytes();
  const int64_t lens_bytes = batch.options.lens_dtype == DType::kInt32 ? 4 : 8;
  const TensorPointers at{
      .q = device.q.as<uint16_t>() + token_begin * batch.q_token_stride,
      .kv_cache = device.kv_cache.get(),
      .inv_scale = device.inv_scale.get(),
      .indices = device.indices.as<uint8_t>() + token_begin * batch.index_stride * index_bytes,
      .lens = device.lens.as<uint8_t>() + token_begin * lens_bytes,
      .attn_sink = device.sinks.empty() ? nullptr : device.sinks.as<float>(),
      .lse = device.lse.empty() ? nullptr : device.lse.as<float>() + token_begin * batch.lse_token_stride,
      .out = device.out.as<uint16_t>() + token_begin * batch.out_token_stride,
  };
  return batch_args(batch, at, token_count, Backend::kCuda, stream);
}

void poison_outputs(DeviceBatch& device, cudaStream_t stream) {
  device.out.fill_bytes(0xFF, stream);  // bf16 0xFFFF: NaN
  device.lse.fill_bytes(0xFF, stream);  // fp32 0xFFFFFFFF: NaN
}

Outputs download_outputs(const DeviceBatch& device) {
  SWAD_TESTING_CUDA_CHECK(cudaDeviceSynchronize());
  return Outputs{.out = download_vector<uint16_t>(device.out), .lse = download_vector<float>(device.lse)};
}

}  // namespace swa_decode::testing
