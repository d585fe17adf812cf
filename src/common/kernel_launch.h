// How every decode kernel is launched (the portable, window and layer launchers): the dynamic
// shared memory it asks for, an optional thread-block cluster along x, and programmatic dependent
// launch, the attribute that lets a kernel start while the kernel before it in the stream is still
// running (its CTAs then wait in ptx::wait_for_prior_grid before touching global memory,
// src/common/ptx/sm90.cuh). What that can save is the launch and the prologue (shared-memory
// carve-up, barrier setup) of each call of a model's layers run back to back; the launchers ask
// for it where LaunchPlan::dependent_launch says.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "src/common/dynamic_smem_limit.h"

namespace swa_decode {

struct KernelLaunch {
  dim3 grid;
  dim3 block;
  int smem_bytes;
  unsigned cluster_ctas;  // CTAs of a cluster along x; 1: no cluster
  bool dependent_launch;
  cudaStream_t stream;
};

// Raises kKernel's dynamic shared-memory limit to at least launch.smem_bytes (DynamicSmemLimit: a
// per-function attribute, not a stream operation, so legal while a CUDA graph is being captured)
// and launches it. kKernel is a template argument so that each kernel function has its own limit.
template <auto kKernel, class... Args>
cudaError_t launch_kernel(const KernelLaunch& launch, Args&&... args) {
  DynamicSmemLimit& limit = dynamic_smem_limit<kKernel>();
  const void* function = reinterpret_cast<const void*>(kKernel);
  cudaError_t err = limit.raise_to(function, launch.smem_bytes);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t config = {};
  config.gridDim = launch.grid;
  config.blockDim = launch.block;
  config.dynamicSmemBytes = static_cast<size_t>(launch.smem_bytes);
  config.stream = launch.stream;
  cudaLaunchAttribute attrs[2] = {};
  unsigned num_attrs = 0;
  if (launch.cluster_ctas > 1) {
    attrs[num_attrs].id = cudaLaunchAttributeClusterDimension;
    attrs[num_attrs++].val.clusterDim = {launch.cluster_ctas, 1, 1};
  }
  if (launch.dependent_launch) {
    attrs[num_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[num_attrs++].val.programmaticStreamSerializationAllowed = 1;
  }
  config.attrs = attrs;
  config.numAttrs = num_attrs;
  err = cudaLaunchKernelEx(&config, kKernel, args...);
  if (err != cudaErrorInvalidValue) return err;
  // Perhaps a limit a cudaDeviceReset took back: once more with the limit set. The failed launch
  // ran nothing; its error, which cudaGetLastError would report after the retry, is cleared. Not
  // while the stream is being captured (no reset can come between): the error stays the launch's.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(launch.stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    return err;
  }
  (void)cudaGetLastError();
  if (limit.reset_to(function, launch.smem_bytes) != cudaSuccess) return err;
  return cudaLaunchKernelEx(&config, kKernel, std::forward<Args>(args)...);
}

}  // namespace swa_decode
