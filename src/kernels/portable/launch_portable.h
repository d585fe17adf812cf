// Launcher of the portable tensor-core kernel (mma.sync m16n8k16, sm_80 and newer).
#pragma once

#include <cuda_runtime_api.h>

#include "src/common/params.h"

namespace swa_decode {

// One variant per head-group count, source set and row formats, each built in its own file
// (decode_portable_g<kHeadGroups>[_extra][_model1...].cu): kHasExtra == true reads params.extra
// too; kWindowModel1 (kExtraModel1) means the window's (the extra source's) rows are kModel1
// (docs/semantics.md, "Row formats"; params.window.is_model1, params.extra.is_model1).
template <int kHeadGroups, bool kHasExtra, bool kWindowModel1, bool kExtraModel1>
cudaError_t launch_portable_source_variant(const DecodeParams& params, int num_stages, int window_splits,
                                           bool dependent_launch, cudaStream_t stream);

// One CTA holds kHeadGroups groups of 16 heads; each group is split over 4 warps by D quarters.
// num_stages (2..4) staging buffers of 32 cache rows; the shared memory is portable::ring_plan with
// portable::list_shape of the sources' formats (portable_plan.h), which the caller's choice of
// num_stages must have fitted. window_splits > 1 (sm_90+ only: thread-block clusters) splits each
// window, and the extra source's columns, over that many CTAs (portable_plan.h,
// choose_window_splits). dependent_launch: LaunchPlan::dependent_launch.
template <int kHeadGroups>
cudaError_t launch_portable_decode(const DecodeParams& params, int num_stages, int window_splits, bool dependent_launch,
                                   cudaStream_t stream) {
  const bool window_model1 = params.window.is_model1 != 0;
  if (params.extra.kv_cache == nullptr) {
    return window_model1 ? launch_portable_source_variant<kHeadGroups, false, true, false>(
                               params, num_stages, window_splits, dependent_launch, stream)
                         : launch_portable_source_variant<kHeadGroups, false, false, false>(
                               params, num_stages, window_splits, dependent_launch, stream);
  }
  if (window_model1 == (params.extra.is_model1 != 0)) {
    return window_model1 ? launch_portable_source_variant<kHeadGroups, true, true, true>(
                               params, num_stages, window_splits, dependent_launch, stream)
                         : launch_portable_source_variant<kHeadGroups, true, false, false>(
                               params, num_stages, window_splits, dependent_launch, stream);
  }
  // One source of each format runs one head group a CTA (portable_record.cpp's plan says why).
  if constexpr (kHeadGroups == 1) {
    return window_model1 ? launch_portable_source_variant<1, true, true, false>(params, num_stages, window_splits,
                                                                                dependent_launch, stream)
                         : launch_portable_source_variant<1, true, false, true>(params, num_stages, window_splits,
                                                                                dependent_launch, stream);
  } else {
    return cudaErrorInvalidValue;
  }
}

}  // namespace swa_decode
