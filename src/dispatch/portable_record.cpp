// The portable tensor-core kernel (mma.sync m16n8k16, sm_80 and newer; src/kernels/portable/):
// runs every shape the shared GPU checks accept, with or without an extra source, each source in
// either row format (a kModel1 one 16-byte aligned), on any device with room for its smallest
// staging ring, so it is the last record and always preferred.
#include <string>

#include "src/dispatch/kernel_record.h"
#include "src/dispatch/launch.h"
#include "src/dispatch/select_kernel.h"
#include "src/kernels/portable/portable_plan.h"

namespace swa_decode {
namespace {

// The row formats of the shape's sources, as the portable plan sizes them.
portable::SourceFormats source_formats(const DecodeShape& shape) {
  return {.window_model1 = shape.window_format == KvFormat::kModel1,
          .extra_model1 = shape.has_extra && shape.extra_format == KvFormat::kModel1};
}

// kModel1 rows (docs/semantics.md, "Row formats") are copied 16 bytes at a time and their scale
// rows 8 (tile_staging.cuh): the cache address must be 16-byte aligned (576 and a block stride
// that is a multiple of 576 are multiples of 64, so every row and scale row then is). A kModel1
// entry holds its block in 32 bits (window_compaction.cuh, SlotInBlock): a block spans at least
// 1,152 bytes (2 x 576 at block_size 1), so a last row below 2^32 * 1,152 bytes (4.5 TiB) keeps
// every block index below 2^32.
constexpr int64_t kModel1MinBlockStride = 2 * kModel1RowBytes;
constexpr int64_t kModel1MaxLastRowOffset = (int64_t{1} << 32) * kModel1MinBlockStride;
std::string model1_rows_why_not(const char* cache, int32_t alignment, int64_t last_row_offset) {
  if (alignment < 16) {
    return std::string("the portable kernel copies kModel1 rows 16 bytes at a time: ") + cache +
           " must be 16-byte aligned, got alignment " + std::to_string(alignment);
  }
  if (last_row_offset >= kModel1MaxLastRowOffset) {
    return std::string("the portable kernel numbers kModel1 blocks in 32 bits: the last row must start below ") +
           std::to_string(kModel1MaxLastRowOffset) + " bytes from " + cache + ", got " + std::to_string(last_row_offset);
  }
  return {};
}

std::string why_not(const DecodeShape& shape, const DeviceInfo& device) {
  const portable::SourceFormats formats = source_formats(shape);
  if (formats.window_model1) {
    std::string rows = model1_rows_why_not("kv_cache", shape.kv_row_alignment, shape.kv_last_row_offset);
    if (!rows.empty()) return rows;
  }
  if (formats.extra_model1) {
    std::string rows = model1_rows_why_not("extra.kv_cache", shape.extra_kv_row_alignment, shape.extra_kv_last_row_offset);
    if (!rows.empty()) return rows;
  }
  const int window = static_cast<int>(shape.window_size);
  const portable::ListShape list = portable::list_shape(window, shape.has_extra, formats);
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
  const portable::SourceFormats formats = source_formats(shape);
  const portable::ListShape list = portable::list_shape(window, shape.has_extra, formats);
  int head_groups = shape.num_heads > kGroupHeads && 2 * two_group_ctas >= device.num_sms ? 2 : 1;
  // Two groups need 16 KiB more for q: on a 99 KiB device a 1024-entry list leaves no room.
  if (head_groups == 2 && portable::choose_stages(2, list, device.smem_optin_bytes) == 0) head_groups = 1;
  // One source of each format builds the tile loop twice, which does not fit the two-group
  // kernel's 128 registers on sm_90 without spilling (decode_portable.cuh): no two-group variant.
  if (shape.has_extra && formats.window_model1 != formats.extra_model1) head_groups = 1;
  const int64_t heads_per_cta = kGroupHeads * head_groups;
  const PortableLaunch config{
      .head_groups_per_cta = head_groups,
      .num_stages = portable::choose_stages(head_groups, list, device.smem_optin_bytes),
      .window_splits = portable::choose_window_splits(
          shape.num_tokens * ((shape.num_heads + heads_per_cta - 1) / heads_per_cta), window,
          shape.has_extra ? shape.extra_max_entries : 0, device.num_sms, device.cc_major),
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
