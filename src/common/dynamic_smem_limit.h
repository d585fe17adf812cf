// The dynamic shared-memory limit of each kernel function (cudaFuncAttributeMaxDynamicSharedMemorySize),
// raised by launch_kernel (kernel_launch.h) and never lowered.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <mutex>

namespace swa_decode {

// The dynamic shared-memory limit of one kernel function, per device, raised and never lowered.
// The limit is the function's, shared by all its launches on a device, while the bytes a launch
// asks for vary (the portable kernel's entry lists and ring depend on window_size and the stages
// it fits: two windows launch the same function with two sizes). Set per launch, a smaller launch
// on one host thread could lower it between another thread's raise and its larger launch, which
// then fails; and every cudaFuncSetAttribute is a driver call (one per decode() before this).
// A high-water mark per device: a launch within it reads one atomic, a raise takes the lock.
class DynamicSmemLimit {
 public:
  cudaError_t raise_to(const void* kernel, int bytes) {
    std::atomic<int>* limit = nullptr;
    cudaError_t err = current_limit(&limit);
    if (err != cudaSuccess) return err;
    if (limit == nullptr) return set(kernel, bytes);  // not tracked: every launch sets it
    if (bytes <= limit->load(std::memory_order_acquire)) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes <= limit->load(std::memory_order_relaxed)) return cudaSuccess;
    err = set(kernel, bytes);
    if (err == cudaSuccess) limit->store(bytes, std::memory_order_release);
    return err;
  }

  // After a failed launch within the mark: the mark is stale (a cudaDeviceReset resets every
  // attribute), so it is set again, unconditionally.
  cudaError_t reset_to(const void* kernel, int bytes) {
    std::atomic<int>* limit = nullptr;
    cudaError_t err = current_limit(&limit);
    if (err != cudaSuccess) return err;
    std::lock_guard<std::mutex> lock(mutex_);
    err = set(kernel, bytes);
    if (err == cudaSuccess && limit != nullptr) limit->store(bytes, std::memory_order_release);
    return err;
  }

 private:
  static constexpr int kMaxDevices = 64;
  // The current device's mark, or nullptr past kMaxDevices (not tracked).
  cudaError_t current_limit(std::atomic<int>** limit) {
    int device = 0;
    const cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    *limit = device >= 0 && device < kMaxDevices ? &limits_[device] : nullptr;
    return cudaSuccess;
  }
  static cudaError_t set(const void* kernel, int bytes) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  }
  std::mutex mutex_;
  std::array<std::atomic<int>, kMaxDevices> limits_{};  // 0: never raised (the default 48 KiB holds)
};

// Each kernel function's one limit (whatever argument types its launches pass).
template <auto kKernel>
DynamicSmemLimit& dynamic_smem_limit() {
  static DynamicSmemLimit limit;
  return limit;
}

}  // namespace swa_decode
