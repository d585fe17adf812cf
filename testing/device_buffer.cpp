#include "testing/device_buffer.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "testing/cuda_check.h"

namespace swa_decode::testing {

bool cuda_device_available() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: clear the error state and answer no
    return false;
  }
  return count > 0;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) SWAD_TESTING_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) (void)cudaFree(ptr_);  // a destructor must not throw
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  if (offset + bytes > bytes_) {
    throw std::out_of_range("DeviceBuffer::upload: " + std::to_string(offset + bytes) +
                            " bytes past a buffer of " + std::to_string(bytes_));
  }
  SWAD_TESTING_CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) {
    throw std::out_of_range("DeviceBuffer::download: " + std::to_string(offset + bytes) +
                            " bytes past a buffer of " + std::to_string(bytes_));
  }
  SWAD_TESTING_CUDA_CHECK(cudaMemcpy(host, static_cast<const uint8_t*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::fill_bytes(uint8_t value, cudaStream_t stream) {
  if (bytes_ > 0) SWAD_TESTING_CUDA_CHECK(cudaMemsetAsync(ptr_, value, bytes_, stream));
}

Stream::Stream() { SWAD_TESTING_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }

Stream::~Stream() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

void Stream::synchronize() const { SWAD_TESTING_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

}  // namespace swa_decode::testing
