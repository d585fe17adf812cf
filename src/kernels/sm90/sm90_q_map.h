// q's TMA descriptor, encoded on the host for both Hopper kernels (decode_sm90.cu,
// decode_sm90_layer.cu): no allocation, no synchronization, so a launch stays capturable.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "src/common/params.h"
#include "src/kernels/sm90/sm90_plan.h"

namespace swa_decode::sm90 {

// cuTensorMapEncodeTiled through the runtime's driver entry point: no link against libcuda.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// q as a 3-D tensor (dims, heads, tokens), fetched in boxes of 64 dims x 64 heads x 1 token with
// the 128-byte swizzle wgmma reads. Heads past num_heads are zero-filled by the copy engine.
inline cudaError_t encode_q_map(const DecodeParams& p, CUtensorMap* map) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(p.head_dim), static_cast<cuuint64_t>(p.num_heads),
                              static_cast<cuuint64_t>(p.num_tokens)};
  const cuuint64_t strides_bytes[2] = {static_cast<cuuint64_t>(p.stride_q_head) * 2,
                                       static_cast<cuuint64_t>(p.stride_q_token) * 2};
  const cuuint32_t box[3] = {kBlockDims, kSlabHeads, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const auto encode_once = [&] {
    return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<__nv_bfloat16*>(p.q), dims, strides_bytes, box,
                  element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  CUresult result = encode_once();
  if (result != CUDA_SUCCESS) {
    // A driver call: it needs a current context, which the runtime makes current on a host thread
    // only at its first call that needs one (a launch, a copy). A fresh thread's first decode()
    // reaches this before any such call, and every later one too (nothing else it does binds one):
    // measured on the H200, every call of two new threads failed here (session 23,
    // GpuChainedCalls.TwoHostThreadsLaunchOneKernelWithTwoSharedMemorySizes). cudaSetDevice makes
    // the current device's primary context current, the one the launch would use; once a thread.
    int device = 0;
    if (cudaGetDevice(&device) == cudaSuccess && cudaSetDevice(device) == cudaSuccess) result = encode_once();
  }
  return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace swa_decode::sm90
