// Error checking for the test and bench support code. Unlike the library (which returns a Status),
// tests and tools throw: a failed CUDA call there is a broken environment, not an input error.
#pragma once

#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

namespace swa_decode::testing {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " +
                           cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace swa_decode::testing

#define SWAD_TESTING_CUDA_CHECK(expr)                                                   \
  do {                                                                                  \
    const cudaError_t swad_err_ = (expr);                                               \
    if (swad_err_ != cudaSuccess) {                                                     \
      ::swa_decode::testing::throw_cuda_error(swad_err_, #expr, __FILE__, __LINE__);    \
    }                                                                                   \
  } while (0)
