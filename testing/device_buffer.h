// Owning device allocations for tests and tools (RAII over cudaMalloc / cudaFree) and the copies
// in and out of them. Every CUDA call is checked and throws std::runtime_error on failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

namespace swa_decode::testing {

// True when the CUDA runtime reports at least one device (false, not an error, without a driver).
bool cuda_device_available();

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  bool empty() const { return ptr_ == nullptr; }

  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  void fill_bytes(uint8_t value, cudaStream_t stream = nullptr);  // cudaMemsetAsync on `stream`

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
DeviceBuffer upload_vector(const std::vector<T>& host) {
  DeviceBuffer buffer(host.size() * sizeof(T));
  if (!host.empty()) buffer.upload(host.data(), host.size() * sizeof(T));
  return buffer;
}

template <typename T>
std::vector<T> download_vector(const DeviceBuffer& buffer) {
  std::vector<T> host(buffer.bytes() / sizeof(T));
  if (!host.empty()) buffer.download(host.data(), host.size() * sizeof(T));
  return host;
}

// A non-blocking stream owned for the lifetime of the object (graph capture needs one that is not
// the legacy default stream).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace swa_decode::testing
