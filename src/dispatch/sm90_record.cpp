// The Hopper fast path (wgmma, TMA, setmaxnreg; src/kernels/sm90/): one persistent CTA per SM runs
// one token at a time with the whole window and all heads, so it needs the window in shared memory
// and pays off only where there are enough heads and tokens to fill the machine. It reads no extra
// source yet (issue 11): the first line of why_not refuses one.
#include <cstdint>
#include <string>

#include "src/dispatch/kernel_record.h"
#include "src/dispatch/launch.h"
#include "src/dispatch/select_kernel.h"
#include "src/kernels/sm90/sm90_plan.h"

namespace swa_decode {
namespace {

// Row offsets are kept as 32-bit counts of 16 bytes: the last row must start within 64 GiB.
constexpr int64_t kMaxRowOffset = int64_t{UINT32_MAX} * 16;
constexpr int64_t kMinHeads = 17;  // 16 heads or fewer: 64-row wgmma would waste 4x the math
// One persistent CTA per token at a time: below ~64 tokens most SMs idle and the portable kernel,
// which spreads a token over 4-8 CTAs, finishes first (bench/results v1: H = 128, T = 32:
// 17.8 us portable vs 26.3 us sm90; T = 128: 56.4 vs 35.2).
constexpr int64_t kMinTokens = 64;

std::string why_not(const DecodeShape& shape, const DeviceInfo& device) {
  if (shape.has_extra) return "the sm90 kernel does not read an extra KV source yet";  // issue 11
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
  if (shape.kv_last_row_offset > kMaxRowOffset) {
    return "the sm90 kernel keeps cache row offsets as 32-bit counts of 16 bytes: the last row must start within "
           "64 GiB of kv_cache, got " + std::to_string(shape.kv_last_row_offset) + " bytes";
  }
  if (device.smem_optin_bytes < sm90::kSmemBytes) {
    return "the sm90 kernel needs " + std::to_string(sm90::kSmemBytes) + " bytes of shared memory per block, device "
           "allows " + std::to_string(device.smem_optin_bytes);
  }
  return {};
}

bool preferred(const DecodeShape& shape, const DeviceInfo&) {
  return shape.num_heads >= kMinHeads && shape.num_tokens >= kMinTokens;
}

LaunchPlan plan(const DecodeShape&, const DeviceInfo& device) {
  return LaunchPlan{
      .name = "sm90_wgmma", .head_groups_per_cta = 0, .config = Sm90Launch{.persistent_ctas = device.num_sms}};
}

}  // namespace

bool sm90_kernel_built() {
#if defined(SWA_DECODE_HAS_SM90)
  return true;
#else
  return false;
#endif
}

extern const KernelRecord kSm90Record{.id = KernelId::kSm90Wgmma, .family = "sm90", .why_not = why_not,
                                      .preferred = preferred, .plan = plan, .launch = launch_sm90};

}  // namespace swa_decode
