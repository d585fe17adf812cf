// The few-heads kernel (mma.sync with keys on M and heads on N, rows gathered by bulk copies, built
// for sm_90a beside the sm90 kernels; src/kernels/few_heads/): a window alone in the seed row
// format, held whole in shared memory, one CTA per token and 16 heads. Built for the 1-16 heads a
// GPU holds under tensor parallelism, where the portable kernel's 16-head M and the sm90 kernel's
// 64-row wgmma pad most of their math; it also wins below 64 tokens at any H (see preferred).
#include <string>

#include "src/dispatch/kernel_record.h"
#include "src/dispatch/launch.h"
#include "src/dispatch/select_kernel.h"
#include "src/kernels/few_heads/few_heads_plan.h"

namespace swa_decode {
namespace {

// Where the free choice takes this kernel (H200, bench/results/v20_h*.json): up to 16 heads at any
// T (H = 16, T = 2048: 85.8 us against the portable kernel's 99.9; T = 1: 10.8 against 11.2), and
// with more heads below 64 tokens, where it beats the portable kernel's split and two-group CTAs
// (H = 128, T = 8: 11.1 against 12.8 us; H = 64, T = 32: 12.5 against 14.0) and sm90 does not run
// (it needs 64 tokens). From T = 128 on, more heads are faster on sm90 or the portable kernel
// (H = 64, T = 128: 26.6 against 23.4 and 23.9), whose CTAs hold more heads a row read.
constexpr int64_t kMaxPreferredHeads = 16;
constexpr int64_t kMaxPreferredTokensAboveThoseHeads = 63;

// Its list holds each entry's block in 32 bits (window_compaction.cuh, SlotInBlock): a block spans
// at least one 512-byte row, so a last row below 2^32 * 512 bytes (2 TiB) keeps every block index
// below 2^32.
constexpr int64_t kMaxLastRowOffset = (int64_t{1} << 32) * few_heads::kHeadDim;

std::string why_not(const DecodeShape& shape, const DeviceInfo& device) {
  std::string device_problem = sm90a_why_not("the few-heads kernel", device);
  if (!device_problem.empty()) return device_problem;
  if (shape.has_extra) return "the few-heads kernel reads a window alone: no extra source";
  if (shape.window_format != KvFormat::kE4m3) return "the few-heads kernel reads seed-format (kE4m3) rows only";
  if (shape.window_size > few_heads::kKeys) {
    return "the few-heads kernel holds the whole window in shared memory: window_size must be <= " +
           std::to_string(few_heads::kKeys) + ", got " + std::to_string(shape.window_size);
  }
  if (shape.kv_row_alignment < 16) {
    return "the few-heads kernel copies cache rows 16 bytes at a time: kv_cache address and strides must be "
           "multiples of 16, got alignment " + std::to_string(shape.kv_row_alignment);
  }
  if (shape.kv_last_row_offset >= kMaxLastRowOffset) {
    return "the few-heads kernel numbers cache blocks in 32 bits: the last row must start below " +
           std::to_string(kMaxLastRowOffset) + " bytes from kv_cache, got " + std::to_string(shape.kv_last_row_offset);
  }
  return shared_memory_why_not("the few-heads kernel", few_heads::smem_bytes(few_heads::head_tiles_for(shape.num_heads)),
                               device);
}

bool preferred(const DecodeShape& shape, const DeviceInfo&) {
  return shape.num_heads <= kMaxPreferredHeads || shape.num_tokens <= kMaxPreferredTokensAboveThoseHeads;
}

LaunchPlan plan(const DecodeShape& shape, const DeviceInfo&) {
  const int head_tiles = few_heads::head_tiles_for(shape.num_heads);
  return LaunchPlan{.name = "few_heads_n" + std::to_string(head_tiles * few_heads::kHeadsPerTile),
                    .head_groups_per_cta = 0,
                    .config = FewHeadsLaunch{.head_tiles = head_tiles}};
}

}  // namespace

extern const KernelRecord kFewHeadsRecord{.id = KernelId::kFewHeadsMma, .family = "few_heads", .why_not = why_not,
                                          .preferred = preferred, .plan = plan, .launch = launch_few_heads};

}  // namespace swa_decode
