#include "src/dispatch/select_kernel.h"

#include <string>

#include "swa_decode/limits.h"
#include "src/kernels/portable/portable_plan.h"
#include "src/kernels/sm90/sm90_plan.h"

namespace swa_decode {
namespace {

constexpr int32_t kMinComputeCapability = 80;  // mma.sync bf16 + cp.async

constexpr int64_t kSm90MaxRowOffset = (int64_t{1} << 36) - 16;  // 32-bit counts of 16 bytes
constexpr int64_t kSm90MinHeads = 17;  // 16 heads or fewer: 64-row wgmma would waste 4x the math
// The sm90 kernel runs one persistent CTA per token at a time; below ~64 tokens most SMs idle and
// the portable kernel, which spreads a token over 4-8 CTAs, finishes first (bench/results v1:
// H = 128, T = 32: 17.8 us portable vs 26.3 us sm90; T = 128: 56.4 vs 35.2).
constexpr int64_t kSm90MinTokens = 64;

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
  if (shape.window_size > sm90::kKeys) {
    return "the sm90 kernel holds the whole window in shared memory: window_size must be <= " +
           std::to_string(sm90::kKeys) + ", got " + std::to_string(shape.window_size);
  }
  if (shape.kv_row_alignment < 16) {
    return "the sm90 kernel copies cache rows 16 bytes at a time: kv_cache address and strides must be "
           "multiples of 16, got alignment " + std::to_string(shape.kv_row_alignment);
  }
  if (shape.kv_last_row_offset > kSm90MaxRowOffset) {
    return "the sm90 kernel keeps cache row offsets as 32-bit counts of 16 bytes: the last row must start within "
           "64 GiB of kv_cache, got " + std::to_string(shape.kv_last_row_offset) + " bytes";
  }
  if (device.smem_optin_bytes < sm90::kSmemBytes) {
    return "the sm90 kernel needs " + std::to_string(sm90::kSmemBytes) + " bytes of shared memory per block, device "
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
  if (shape.head_dim != kGpuHeadDim) {
    return unsupported("head_dim must be " + std::to_string(kGpuHeadDim) +
                       " on the GPU (the CPU backend takes any), got " + std::to_string(shape.head_dim));
  }
  if (shape.num_heads < 1 || shape.num_heads > kMaxGpuHeads) {
    return unsupported("num_heads must be in [1, " + std::to_string(kMaxGpuHeads) + "], got " +
                       std::to_string(shape.num_heads));
  }
  if (shape.window_size < 1 || shape.window_size > kMaxWindow) {
    return unsupported("window_size must be in [1, " + std::to_string(kMaxWindow) + "], got " +
                       std::to_string(shape.window_size));
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
  const bool sm90_preferred = shape.num_heads >= kSm90MinHeads && shape.num_tokens >= kSm90MinTokens;
  if (only == KernelId::kSm90Wgmma || (only == KernelId::kNone && sm90_fits && sm90_preferred)) {
    if (!sm90_fits) return unsupported(sm90_problem);
    KernelChoice choice;
    choice.id = KernelId::kSm90Wgmma;
    choice.persistent_ctas = device.num_sms;
    choice.name = "sm90_wgmma";
    return choice;
  }

  KernelChoice choice;
  choice.id = KernelId::kPortableMma;
  // Two 16-head groups per CTA halve the times each window is gathered and dequantized; one group
  // keeps H <= 16 (tensor parallel) from padding heads it does not have, and spreads a small batch
  // over twice the CTAs when two-group CTAs would fill less than half the SMs (H200, v1 vs v3:
  // H = 128, T = 8: 15.5 us with one group vs 16.8 with two; T = 32, 128 two-group CTAs:
  // 22.3 us with one group vs 17.8 with two).
  const int64_t two_group_ctas = shape.num_tokens * ((shape.num_heads + 31) / 32);
  const int window = static_cast<int>(shape.window_size);
  int head_groups = shape.num_heads > 16 && 2 * two_group_ctas >= device.num_sms ? 2 : 1;
  // Two groups need 16 KiB more for q: on a 99 KiB device a 1024-entry window leaves no room.
  if (head_groups == 2 && portable::choose_stages(2, window, device.smem_optin_bytes) == 0) head_groups = 1;
  choice.head_groups_per_cta = head_groups;
  choice.num_stages = portable::choose_stages(head_groups, window, device.smem_optin_bytes);
  if (choice.num_stages == 0) {
    return unsupported("the portable kernel needs " +
                       std::to_string(portable::ring_plan(1, portable::kMinStages, window).total_bytes) +
                       " bytes of shared memory per block at window_size " + std::to_string(window) +
                       ", device allows " + std::to_string(device.smem_optin_bytes));
  }
  const int64_t heads_per_cta = 16 * static_cast<int64_t>(head_groups);
  choice.window_splits = portable::choose_window_splits(
      shape.num_tokens * ((shape.num_heads + heads_per_cta - 1) / heads_per_cta), window, device.num_sms, device.cc_major);
  choice.name = "portable_mma_g" + std::to_string(choice.head_groups_per_cta) +
                (choice.window_splits > 1 ? "_split" + std::to_string(choice.window_splits) : "");
  return choice;
}

}  // namespace swa_decode
