// Programmatic dependent launch, host side: the launch attribute that lets a decode kernel start
// while the kernel before it in the stream is still running (its CTAs then wait in
// ptx::wait_for_prior_grid before touching global memory, src/common/ptx/sm90.cuh). What it can
// save is the launch and the prologue (shared-memory carve-up, barrier setup) of each call of a
// model's layers run back to back; the launchers set it where LaunchPlan::dependent_launch says.
#pragma once

#include <cuda_runtime_api.h>

namespace swa_decode {

inline cudaLaunchAttribute dependent_launch_attribute() {
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  return attribute;
}

}  // namespace swa_decode
