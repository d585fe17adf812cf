// Internals of src/api/decode.cpp that tests reach without a GPU.
#pragma once

#include "swa_decode/swa_decode.h"
#include "src/common/params.h"
#include "src/dispatch/select_kernel.h"

namespace swa_decode {

// query_support (kernel == kNone) or query_support_for_kernel (otherwise) for a CUDA device
// described by `device` instead of one read from the driver: validates `args`, then asks
// select_kernel. args.backend == kCpu answers "cpu_reference" for the free choice only.
SupportInfo query_support_on(const DecodeArgs& args, const DeviceInfo& device, KernelId kernel = KernelId::kNone);

// The DecodeShape select_kernel sees for validated arguments (shapes and the alignments of the
// kv_cache rows and of the q / out rows, from make_params' normalised strides).
DecodeShape decode_shape(const DecodeParams& params);

// decode() restricted to one kernel family (tests and the bench run every kernel a shape
// supports, not only the one select_kernel prefers). kNotSupported if that kernel cannot run it.
Status decode_with_kernel(const DecodeArgs& args, KernelId kernel) noexcept;

// query_support for the current device restricted to one kernel family, as decode_with_kernel runs:
// supported with that family's kernel name, or not with that family's why_not (never another
// family's kernel). The tests that force a family (SWA_DECODE_TEST_KERNEL, find_kernel(name)) skip
// a case with this why_not. args.backend must be kCuda.
SupportInfo query_support_for_kernel(const DecodeArgs& args, KernelId kernel);

}  // namespace swa_decode
