// The bf16 tensor-core rate the bench's compute floor divides by, measured in the same run as the
// kernels (ANCHORS.md measured 767-786 TFLOP/s on the H200).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace swa_decode::cli {

// cuBLAS bf16 GEMM of n x n x n (bf16 A, B and C, fp32 accumulate) on random normal inputs (a
// constant matrix draws less power and clocks higher than real data), `reps` runs timed one by
// one with CUDA events after `warmup` untimed ones; returns the median in TFLOP/s counting
// 2 n^3 FLOPs a run. Throws std::runtime_error on a CUDA or cuBLAS failure.
double measure_matmul_tflops(cudaStream_t stream, int64_t n = 8192, int reps = 10, int warmup = 3);

}  // namespace swa_decode::cli
