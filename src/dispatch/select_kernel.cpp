#include "src/dispatch/select_kernel.h"

#include <string>

namespace swa_decode {
namespace {

constexpr int64_t kKernelHeadDim = 512;    // the D-permuted fragment layout is built for 512
constexpr int64_t kMaxHeads = 128;
constexpr int64_t kMaxWindow = 1024;
constexpr int32_t kMinComputeCapability = 80;  // mma.sync bf16 + cp.async

constexpr int64_t kSm90MaxWindow = 128;
constexpr int64_t kSm90SmemBytes = 222 * 1024;  // upper bound of sm90::kSmemBytes (checked there)
constexpr int64_t kSm90MinHeads = 17;  // 16 heads or fewer: 64-row wgmma would waste 4x the math

KernelChoice unsupported(std::string why) {
  KernelChoice choice;
  choice.why_not = std::move(why);
  return choice;
}

// Why the sm_90a fast path cannot run a shape the portable kernel runs, or "" if it can.
std::string sm90_why_not(const DecodeShape& shape, const DeviceInfo& device) {
  if (!sm90_kernel_built()) return "this build has no sm_90a kernel (sm_90 was not among its CUDA targets)";
  if (device.cc_major != 9 || device.cc_minor != 0) {
    return "the sm90 kernel needs compute capability 9.0, got " + std::to_string(device.cc_major) + "." +
           std::to_string(device.cc_minor);
  }
  if (shape.window_size > kSm90MaxWindow) {
    return "the sm90 kernel holds the whole window in shared memory: window_size must be <= 128, got " +
           std::to_string(shape.window_size);
  }
  if (shape.kv_row_alignment < 16) {
    return "the sm90 kernel copies cache rows 16 bytes at a time: kv_cache address and strides must be "
           "multiples of 16, got alignment " + std::to_string(shape.kv_row_alignment);
  }
  if (device.smem_optin_bytes < kSm90SmemBytes) {
    return "the sm90 kernel needs " + std::to_string(kSm90SmemBytes) + " bytes of shared memory per block, device "
           "allows " + std::to_string(device.smem_optin_bytes);
  }
  return {};
}

}  // namespace

bool sm90_kernel_built() {
#if defined(SWA_DECODE_HAS_SM90)
  return true;
#else
  return false;
#endif
}

KernelChoice select_kernel(const DecodeShape& shape, const DeviceInfo& device, KernelId only) {
  const int32_t cc = device.cc_major * 10 + device.cc_minor;
  if (cc < kMinComputeCapability) {
    return unsupported("device compute capability must be >= 8.0 (mma.sync bf16), got " +
                       std::to_string(device.cc_major) + "." + std::to_string(device.cc_minor));
  }
  if (shape.head_dim != kKernelHeadDim) {
    return unsupported("head_dim must be 512 on the GPU (the CPU backend takes any), got " +
                       std::to_string(shape.head_dim));
  }
  if (shape.num_heads < 1 || shape.num_heads > kMaxHeads) {
    return unsupported("num_heads must be in [1, 128], got " + std::to_string(shape.num_heads));
  }
  if (shape.window_size < 1 || shape.window_size > kMaxWindow) {
    return unsupported("window_size must be in [1, 1024], got " + std::to_string(shape.window_size));
  }

  if (shape.kv_row_alignment < 4) {
    return unsupported("kv_cache address, stride_kv_block and stride_kv_token must be multiples of 4 bytes "
                       "on the GPU, got alignment " + std::to_string(shape.kv_row_alignment));
  }
  if (!shape.q_out_aligned_16) {
    return unsupported("q and out addresses and their token/head strides must be multiples of 8 elements "
                       "(16 bytes) on the GPU");
  }

  const std::string sm90_problem = sm90_why_not(shape, device);
  const bool sm90_fits = sm90_problem.empty();
  if (only == KernelId::kSm90Wgmma || (only == KernelId::kNone && sm90_fits && shape.num_heads >= kSm90MinHeads)) {
    if (!sm90_fits) return unsupported(sm90_problem);
    KernelChoice choice;
    choice.id = KernelId::kSm90Wgmma;
    choice.persistent_ctas = device.num_sms;
    choice.name = "sm90_wgmma";
    return choice;
  }

  KernelChoice choice;
  choice.id = KernelId::kPortableMma;
  // Two 16-head groups per CTA halve the times each KV tile is gathered and dequantized; a single
  // group keeps H <= 16 (tensor parallel) from padding heads it does not have.
  choice.head_groups_per_cta = shape.num_heads > 16 ? 2 : 1;
  choice.name = "portable_mma_g" + std::to_string(choice.head_groups_per_cta);
  return choice;
}

}  // namespace swa_decode
