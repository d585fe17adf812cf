#include "testing/device_batch.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "testing/cuda_check.h"

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

// Pinned host memory for the pool uploads: a copy from it is synchronous, so the buffer can be
// refilled as soon as cudaMemcpy returns, and it runs at the link's full rate.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) { SWAD_TESTING_CUDA_CHECK(cudaMallocHost(&ptr_, bytes)); }
  ~PinnedBuffer() { (void)cudaFreeHost(ptr_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// A copy costs ~10 us however small and the link moves 64 KiB in a few us, so live rows up to
// 64 KiB apart go in one copy with the poison between them: a window pool is then one copy per
// window, a C4A pool (every 16th row live) or a C128A pool (all rows of a request live) a few
// copies of kMaxSpanBytes.
constexpr int64_t kMaxPoisonGapBytes = 64 << 10;
constexpr int64_t kMaxSpanBytes = 64 << 20;

void upload_pool(const HostSource& pool, DeviceBuffer& buffer, const char* name) {
  if (buffer.bytes() != static_cast<size_t>(pool.kv_cache_bytes())) {
    throw std::invalid_argument(std::string("upload_into: ") + name + " size differs from the batch's pool");
  }
  SWAD_TESTING_CUDA_CHECK(cudaMemset(buffer.get(), pool.poison_byte(), buffer.bytes()));
  const std::vector<PoolSpan> spans = pool_spans(pool, kMaxPoisonGapBytes, kMaxSpanBytes);
  if (spans.empty()) return;
  int64_t largest = 0;
  for (const PoolSpan& span : spans) largest = std::max(largest, span.end - span.begin);
  const PinnedBuffer staging(static_cast<size_t>(largest));
  for (const PoolSpan& span : spans) {
    fill_span(pool, span, staging.get());
    SWAD_TESTING_CUDA_CHECK(cudaMemcpy(buffer.as<uint8_t>() + span.begin, staging.get(),
                                       static_cast<size_t>(span.end - span.begin), cudaMemcpyHostToDevice));
  }
}

}  // namespace

DeviceBatch upload_batch(const HostBatch& batch) {
  DeviceBatch d;
  d.q = DeviceBuffer(batch.q.size() * sizeof(uint16_t));
  d.indices = DeviceBuffer(batch.indices.size() * batch.index_bytes());
  d.lens = DeviceBuffer(batch.lens.size() * batch.lens_bytes());
  d.inv_scale = DeviceBuffer(batch.num_slots * batch.scale_bytes());
  d.sinks = DeviceBuffer(batch.sinks.size() * sizeof(float));
  d.kv_cache = DeviceBuffer(batch.kv_cache_bytes());
  d.out = DeviceBuffer(batch.num_tokens * batch.out_token_stride * sizeof(uint16_t));
  if (batch.options.with_lse) d.lse = DeviceBuffer(batch.num_tokens * batch.lse_token_stride * sizeof(float));
  if (batch.extra) {
    const HostSource& x = *batch.extra;
    d.extra_indices = DeviceBuffer(x.indices.size() * x.index_bytes());
    d.extra_lens = DeviceBuffer(x.lens.size() * x.lens_bytes());
    if (!x.shares_window_cache) {
      d.extra_inv_scale = DeviceBuffer(x.num_slots * x.scale_bytes());
      d.extra_kv_cache = DeviceBuffer(x.kv_cache_bytes());
    }
  }
  upload_into(batch, d);
  return d;
}

void upload_into(const HostBatch& batch, DeviceBatch& d) {
  write(d.q, batch.q, "q");
  write(d.indices, encode_ints(batch.indices, batch.index_dtype), "indices");
  write(d.lens, encode_ints(batch.lens, batch.lens_dtype), "lens");
  write(d.inv_scale, dense_inv_scale(batch), "inv_scale");
  write(d.sinks, batch.sinks, "attn_sink");
  upload_pool(batch, d.kv_cache, "kv_cache");
  const bool own_pool = batch.extra && !batch.extra->shares_window_cache;
  if (batch.extra) {
    write(d.extra_indices, encode_ints(batch.extra->indices, batch.extra->index_dtype), "extra.indices");
    write(d.extra_lens, encode_ints(batch.extra->lens, batch.extra->lens_dtype), "extra.lens");
  } else if (!d.extra_indices.empty() || !d.extra_lens.empty()) {
    throw std::invalid_argument("upload_into: the buffers hold an extra source, the batch has none");
  }
  if (own_pool) {
    write(d.extra_inv_scale, dense_inv_scale(*batch.extra), "extra.inv_scale");
    upload_pool(*batch.extra, d.extra_kv_cache, "extra.kv_cache");
  } else if (!d.extra_kv_cache.empty() || !d.extra_inv_scale.empty()) {
    throw std::invalid_argument("upload_into: the buffers hold an extra pool, the batch has none of its own");
  }
  // The memsets and pageable copies above run on the legacy stream and may still be in flight;
  // decodes run on non-blocking streams that do not wait for it.
  SWAD_TESTING_CUDA_CHECK(cudaDeviceSynchronize());
}

DecodeArgs device_args(const HostBatch& batch, const DeviceBatch& device, int64_t token_begin,
                       int64_t token_count, cudaStream_t stream) {
  const bool shared = batch.extra && batch.extra->shares_window_cache;
  const int64_t extra_index_offset = batch.extra ? token_begin * batch.extra->index_stride * batch.extra->index_bytes() : 0;
  const int64_t extra_lens_offset = batch.extra ? token_begin * batch.extra->lens_bytes() : 0;
  const TensorPointers at{
      .q = device.q.as<uint16_t>() + token_begin * batch.q_token_stride,
      .kv_cache = device.kv_cache.get(),
      .inv_scale = device.inv_scale.get(),
      .indices = device.indices.as<uint8_t>() + token_begin * batch.index_stride * batch.index_bytes(),
      .lens = device.lens.as<uint8_t>() + token_begin * batch.lens_bytes(),
      .attn_sink = device.sinks.empty() ? nullptr : device.sinks.as<float>(),
      .lse = device.lse.empty() ? nullptr : device.lse.as<float>() + token_begin * batch.lse_token_stride,
      .out = device.out.as<uint16_t>() + token_begin * batch.out_token_stride,
      .extra_kv_cache = shared ? device.kv_cache.get() : device.extra_kv_cache.get(),
      .extra_inv_scale = shared ? device.inv_scale.get() : device.extra_inv_scale.get(),
      .extra_indices = device.extra_indices.empty() ? nullptr : device.extra_indices.as<uint8_t>() + extra_index_offset,
      .extra_lens = device.extra_lens.empty() ? nullptr : device.extra_lens.as<uint8_t>() + extra_lens_offset,
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
