// Enqueue the chosen kernel. No allocation, no synchronization (CUDA-graph capturable); every
// launch is followed by cudaGetLastError. Build with -DSWA_DECODE_SYNC_AFTER_LAUNCH=ON to also
// synchronize after each launch while debugging.
#pragma once

#include <cuda_runtime_api.h>

#include "swa_decode/swa_decode.h"
#include "src/common/params.h"
#include "src/dispatch/kernel_record.h"

namespace swa_decode {

// Runs kernel.launch with `plan` (which kernel.plan made for these params' shape) and turns its
// error, or the one cudaGetLastError reports after it, into a Status naming the kernel.
Status launch_decode(const DecodeParams& params, const KernelRecord& kernel, const LaunchPlan& plan,
                     cudaStream_t stream);

// The records' launch adapters: unpack the plan's configuration and call the kernel's launcher.
// cudaErrorInvalidValue if the plan was made by another record.
cudaError_t launch_portable(const DecodeParams& params, const LaunchPlan& plan, cudaStream_t stream);
cudaError_t launch_sm90(const DecodeParams& params, const LaunchPlan& plan, cudaStream_t stream);
cudaError_t launch_few_heads(const DecodeParams& params, const LaunchPlan& plan, cudaStream_t stream);

}  // namespace swa_decode
