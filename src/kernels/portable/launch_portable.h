// Launcher of the portable tensor-core kernel (mma.sync m16n8k16, sm_80 and newer).
#pragma once

#include <cuda_runtime_api.h>

#include "src/common/params.h"

namespace swa_decode {

// One variant per head-group count and source set, each built in its own file
// (decode_portable_g<kHeadGroups>[_extra].cu): kHasExtra == true reads params.extra too.
template <int kHeadGroups, bool kHasExtra>
cudaError_t launch_portable_source_variant(const DecodeParams& params, int num_stages, int window_splits,
                                           cudaStream_t stream);

// One CTA holds kHeadGroups groups of 16 heads; each group is split over 4 warps by D quarters.
// num_stages (2..4) staging buffers of 32 cache rows; the shared memory is portable::ring_plan with
// portable::compacted_list_entries (portable_plan.h), which the caller's choice of num_stages must
// have fitted. window_splits > 1 (sm_90+ only: thread-block clusters) splits each window, and the
// extra source's columns, over that many CTAs (portable_plan.h, choose_window_splits).
template <int kHeadGroups>
cudaError_t launch_portable_decode(const DecodeParams& params, int num_stages, int window_splits, cudaStream_t stream) {
  return params.extra.kv_cache != nullptr
             ? launch_portable_source_variant<kHeadGroups, true>(params, num_stages, window_splits, stream)
             : launch_portable_source_variant<kHeadGroups, false>(params, num_stages, window_splits, stream);
}

}  // namespace swa_decode
