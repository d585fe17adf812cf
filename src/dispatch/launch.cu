#include "src/dispatch/launch.h"

#include <string>

#include "src/kernels/portable/launch_portable.h"
#if defined(SWA_DECODE_HAS_SM90)
#include "src/kernels/sm90/launch_sm90.h"
#endif

namespace swa_decode {
namespace {

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return {};
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(err)};
}

cudaError_t launch_choice(const DecodeParams& params, const KernelChoice& choice, cudaStream_t stream) {
  switch (choice.id) {
    case KernelId::kPortableMma:
      return choice.head_groups_per_cta == 2
                 ? launch_portable_decode<2>(params, choice.num_stages, choice.window_splits, stream)
                 : launch_portable_decode<1>(params, choice.num_stages, choice.window_splits, stream);
#if defined(SWA_DECODE_HAS_SM90)
    case KernelId::kSm90Wgmma:
      return launch_sm90_decode(params, choice.persistent_ctas, stream);
#endif
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

Status launch_decode(const DecodeParams& params, const KernelChoice& choice, cudaStream_t stream) {
  if (choice.id == KernelId::kNone) return {StatusCode::kNotSupported, choice.why_not};
  if (params.num_tokens == 0) return {};  // nothing to do; a zero-sized grid is a launch error
  Status status = cuda_status(launch_choice(params, choice, stream), choice.name.c_str());
  if (!status.ok()) return status;
  status = cuda_status(cudaGetLastError(), "launch of the decode kernel");
#if defined(SWA_DECODE_SYNC_AFTER_LAUNCH)
  if (status.ok()) status = cuda_status(cudaStreamSynchronize(stream), "decode kernel (synchronized)");
#endif
  return status;
}

}  // namespace swa_decode
