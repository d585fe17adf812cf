#include "tools/swa_decode_cli/matmul_peak.h"

#include <stdexcept>
#include <string>
#include <vector>

#include <cublas_v2.h>

#include "testing/cuda_check.h"
#include "testing/device_buffer.h"
#include "testing/host_numerics.h"
#include "testing/timing.h"

namespace swa_decode::cli {
namespace {

namespace st = swa_decode::testing;

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string(what) + " failed: cuBLAS status " + std::to_string(static_cast<int>(status)));
  }
}

// A cuBLAS handle for the lifetime of the object.
class Blas {
 public:
  explicit Blas(cudaStream_t stream) {
    check_cublas(cublasCreate(&handle_), "cublasCreate");
    check_cublas(cublasSetStream(handle_, stream), "cublasSetStream");
  }
  ~Blas() { (void)cublasDestroy(handle_); }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

st::DeviceBuffer random_bf16_matrix(int64_t n, uint64_t seed) {
  const uint16_t* table = st::normal_bf16_table();
  std::vector<uint16_t> values(static_cast<size_t>(n * n));
  st::Rng rng(seed);
  for (size_t i = 0; i < values.size(); i += 4) {
    const uint64_t bits = rng.next_u64();
    for (size_t k = 0; k < 4 && i + k < values.size(); ++k) values[i + k] = table[(bits >> (16 * k)) & 0xFFFF];
  }
  return st::upload_vector(values);
}

}  // namespace

double measure_matmul_tflops(cudaStream_t stream, int64_t n, int reps, int warmup) {
  const Blas blas(stream);
  const st::DeviceBuffer a = random_bf16_matrix(n, 1), b = random_bf16_matrix(n, 2);
  st::DeviceBuffer c(static_cast<size_t>(n * n) * 2);
  const float alpha = 1.0f, beta = 0.0f;
  const int dim = static_cast<int>(n);
  auto gemm = [&] {
    check_cublas(cublasGemmEx(blas.get(), CUBLAS_OP_N, CUBLAS_OP_N, dim, dim, dim, &alpha, a.get(), CUDA_R_16BF, dim,
                              b.get(), CUDA_R_16BF, dim, &beta, c.get(), CUDA_R_16BF, dim, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx (bf16, fp32 accumulate)");
  };
  for (int i = 0; i < warmup; ++i) gemm();
  std::vector<cudaEvent_t> events(2 * static_cast<size_t>(reps), nullptr);
  std::vector<double> us;
  try {
    for (cudaEvent_t& event : events) SWAD_TESTING_CUDA_CHECK(cudaEventCreate(&event));
    for (int i = 0; i < reps; ++i) {
      SWAD_TESTING_CUDA_CHECK(cudaEventRecord(events[2 * i], stream));
      gemm();
      SWAD_TESTING_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], stream));
    }
    SWAD_TESTING_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < reps; ++i) {
      float ms = 0.0f;
      SWAD_TESTING_CUDA_CHECK(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
      us.push_back(1e3 * static_cast<double>(ms));
    }
  } catch (...) {
    for (cudaEvent_t event : events) {
      if (event != nullptr) (void)cudaEventDestroy(event);
    }
    throw;
  }
  for (cudaEvent_t event : events) (void)cudaEventDestroy(event);
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  return flops / (st::median(us) * 1e-6) / 1e12;
}

}  // namespace swa_decode::cli
