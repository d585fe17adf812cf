#include "src/dispatch/launch.h"

#include <string>

#include "src/kernels/portable/launch_portable.h"
#if defined(SWA_DECODE_HAS_SM90)
#include "src/kernels/few_heads/launch_few_heads.h"
#include "src/kernels/sm90/launch_sm90.h"
#endif

namespace swa_decode {
namespace {

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return {};
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(err)};
}

}  // namespace

cudaError_t launch_portable(const DecodeParams& params, const LaunchPlan& plan, cudaStream_t stream) {
  const PortableLaunch* config = std::get_if<PortableLaunch>(&plan.config);
  if (config == nullptr) return cudaErrorInvalidValue;
  return config->head_groups_per_cta == 2
             ? launch_portable_decode<2>(params, config->num_stages, config->window_splits, plan.dependent_launch, stream)
             : launch_portable_decode<1>(params, config->num_stages, config->window_splits, plan.dependent_launch, stream);
}

cudaError_t launch_few_heads(const DecodeParams& params, const LaunchPlan& plan, cudaStream_t stream) {
  const FewHeadsLaunch* config = std::get_if<FewHeadsLaunch>(&plan.config);
  if (config == nullptr) return cudaErrorInvalidValue;
#if defined(SWA_DECODE_HAS_SM90)
  return launch_few_heads_decode(params, config->head_tiles, plan.dependent_launch, stream);
#else
  (void)params;
  (void)stream;
  return cudaErrorNotSupported;  // unreachable: the few-heads record's why_not refuses every shape in this build
#endif
}

cudaError_t launch_sm90(const DecodeParams& params, const LaunchPlan& plan, cudaStream_t stream) {
  const Sm90Launch* config = std::get_if<Sm90Launch>(&plan.config);
  if (config == nullptr) return cudaErrorInvalidValue;
#if defined(SWA_DECODE_HAS_SM90)
  const bool dependent = plan.dependent_launch;
  if (config->layer) {
    return launch_sm90_layer_decode(params, config->persistent_ctas, config->key_splits, dependent, stream);
  }
  return params.window.is_model1 != 0 ? launch_sm90_decode<true>(params, config->persistent_ctas, dependent, stream)
                                      : launch_sm90_decode<false>(params, config->persistent_ctas, dependent, stream);
#else
  (void)params;
  (void)stream;
  return cudaErrorNotSupported;  // unreachable: the sm90 record's why_not refuses every shape in this build
#endif
}

Status launch_decode(const DecodeParams& params, const KernelRecord& kernel, const LaunchPlan& plan,
                     cudaStream_t stream) {
  if (params.num_tokens == 0) return {};  // nothing to do; a zero-sized grid is a launch error
  Status status = cuda_status(kernel.launch(params, plan, stream), plan.name.c_str());
  if (!status.ok()) return status;
  status = cuda_status(cudaGetLastError(), "launch of the decode kernel");
#if defined(SWA_DECODE_SYNC_AFTER_LAUNCH)
  if (status.ok()) status = cuda_status(cudaStreamSynchronize(stream), "decode kernel (synchronized)");
#endif
  return status;
}

}  // namespace swa_decode
