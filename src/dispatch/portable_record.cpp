// The portable tensor-core kernel (mma.sync m16n8k16, sm_80 and newer; src/kernels/portable/):
// runs every shape the shared GPU checks accept, with or without an extra source, on any device
// with room for its smallest staging ring, so it is the last record and always preferred.
#include <string>

#include "src/dispatch/kernel_record.h"
#include "src/dispatch/launch.h"
#include "src/dispatch/select_kernel.h"
#include "src/kernels/portable/portable_plan.h"

namespace swa_decode {
namespace {

std::string why_not(const DecodeShape& shape, const DeviceInfo& device) {
  const char* model1 = model1_source(shape);
  if (model1 != nullptr) return std::string("the portable kernel reads no kModel1 rows yet, got ") + model1 + " = kModel1";
  const int window = static_cast<int>(shape.window_size);
  const int list = portable::compacted_list_entries(window, shape.has_extra);
  if (portable::choose_stages(1, list, device.smem_optin_bytes) != 0) return {};
  const int smallest_ring_bytes = portable::ring_plan(1, portable::kMinStages, list).total_bytes;
  return "the portable kernel needs " + std::to_string(smallest_ring_bytes) + " bytes of shared memory per block at "
         "window_size " + std::to_string(window) + ", device allows " + std::to_string(device.smem_optin_bytes);
}

bool preferred(const DecodeShape&, const DeviceInfo&) { return true; }

LaunchPlan plan(const DecodeShape& shape, const DeviceInfo& device) {
  // Two 16-head groups per CTA halve the times each window is gathered and dequantized; one group
  // keeps H <= 16 (tensor parallel) from padding heads it does not have, and spreads a small batch
  // over twice the CTAs when two-group CTAs would fill less than half the SMs (H200, v1 vs v3:
  // H = 128, T = 8: 15.5 us with one group vs 16.8 with two; T = 32, 128 two-group CTAs:
  // 22.3 us with one group vs 17.8 with two).
  constexpr int64_t kGroupHeads = portable::kHeadsPerGroup;
  const int64_t two_group_ctas = shape.num_tokens * ((shape.num_heads + 2 * kGroupHeads - 1) / (2 * kGroupHeads));
  const int window = static_cast<int>(shape.window_size);
  const int list = portable::compacted_list_entries(window, shape.has_extra);
  int head_groups = shape.num_heads > kGroupHeads && 2 * two_group_ctas >= device.num_sms ? 2 : 1;
  // Two groups need 16 KiB more for q: on a 99 KiB device a 1024-entry list leaves no room.
  if (head_groups == 2 && portable::choose_stages(2, list, device.smem_optin_bytes) == 0) head_groups = 1;
  const int64_t heads_per_cta = kGroupHeads * head_groups;
  const PortableLaunch config{
      .head_groups_per_cta = head_groups,
      .num_stages = portable::choose_stages(head_groups, list, device.smem_optin_bytes),
      .window_splits = portable::choose_window_splits(
          shape.num_tokens * ((shape.num_heads + heads_per_cta - 1) / heads_per_cta), window, device.num_sms,
          device.cc_major),
  };
  return LaunchPlan{
      .name = "portable_mma_g" + std::to_string(head_groups) +
              (config.window_splits > 1 ? "_split" + std::to_string(config.window_splits) : ""),
      .head_groups_per_cta = head_groups,
      .config = config,
  };
}

}  // namespace

extern const KernelRecord kPortableRecord{.id = KernelId::kPortableMma, .family = "portable", .why_not = why_not,
                                          .preferred = preferred, .plan = plan, .launch = launch_portable};

}  // namespace swa_decode
