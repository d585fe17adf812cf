// The Hopper fast path (wgmma, TMA, setmaxnreg; src/kernels/sm90/): persistent CTAs (one an SM)
// run one token at a time with the whole window in shared memory, so it pays off only where there
// are enough heads and tokens to fill the machine (the layer kernel, below, also from fewer tokens
// with a key split). Its window kernel
// (decode_sm90.cuh) reads a window alone, in either row format; a shape with an extra source runs
// on its layer kernel (decode_sm90_layer.cuh: the window and the extra entries in tiles of 128, one
// token and 64 heads at a time, either format in either source), which needs the same of both
// sources' rows.
#include <cstdint>
#include <string>

#include "src/dispatch/kernel_record.h"
#include "src/dispatch/launch.h"
#include "src/dispatch/select_kernel.h"
#include "src/kernels/sm90/sm90_layer_plan.h"
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

// Both kernels copy a source's cache rows 16 bytes at a time and keep their offsets from `cache`
// as 32-bit counts of 16 bytes.
std::string rows_why_not(const char* cache, int32_t alignment, int64_t last_row_offset) {
  if (alignment < 16) {
    return std::string("the sm90 kernel copies cache rows 16 bytes at a time: ") + cache +
           " address and strides must be multiples of 16, got alignment " + std::to_string(alignment);
  }
  if (last_row_offset > kMaxRowOffset) {
    return std::string("the sm90 kernel keeps cache row offsets as 32-bit counts of 16 bytes: the last row must "
                       "start within 64 GiB of ") + cache + ", got " + std::to_string(last_row_offset) + " bytes";
  }
  return {};
}

// The window kernel reads the window alone, seed or kModel1 rows (one instantiation each); the layer
// kernel reads either row format in either source. A window-only layer runs on the window kernel in
// both formats, so that each runs at the same ratio to its own floor (issue 12: kModel1's SWA H = 128
// T = 2048 on the layer kernel was 2.27x its floor, seed rows on the window kernel 1.47x), except
// kModel1 rows at H <= 64 from kModel1LayerKernelMinTokens on: there the layer kernel's lone CTA
// is the faster (H200, perf-notes "sm90 window kernel: kModel1 rows": T = 512 60.9 vs 62.7 us,
// T = 2048 203.2 vs 217.1; T = 128 25.2 vs 24.0).
constexpr int64_t kModel1LayerKernelMinTokens = 512;
bool runs_layer_kernel(const DecodeShape& shape) {
  if (shape.has_extra) return true;
  return shape.window_format == KvFormat::kModel1 && shape.num_heads <= sm90::kSlabHeads &&
         shape.num_tokens >= kModel1LayerKernelMinTokens;
}

std::string why_not(const DecodeShape& shape, const DeviceInfo& device) {
  std::string device_problem = sm90a_why_not("the sm90 kernel", device);
  if (!device_problem.empty()) return device_problem;
  if (shape.window_size > sm90::kKeys) {
    return "the sm90 kernel holds the whole window in shared memory: window_size must be <= " +
           std::to_string(sm90::kKeys) + ", got " + std::to_string(shape.window_size);
  }
  std::string rows = rows_why_not("kv_cache", shape.kv_row_alignment, shape.kv_last_row_offset);
  if (!rows.empty()) return rows;
  const int smem_bytes = runs_layer_kernel(shape) ? sm90::kLayerSmemBytes : sm90::kSmemBytes;
  std::string smem = shared_memory_why_not("the sm90 kernel", smem_bytes, device);
  if (!smem.empty()) return smem;
  if (!runs_layer_kernel(shape)) return {};
  if (shape.has_extra) {
    rows = rows_why_not("extra.kv_cache", shape.extra_kv_row_alignment, shape.extra_kv_last_row_offset);
    if (!rows.empty()) return rows;
  }
  // Work items (a token and 64 heads) are numbered in int32; gpu_why_not has checked num_heads.
  const int64_t slabs = sm90::layer_slabs(static_cast<int>(shape.num_heads));
  if (shape.num_tokens > INT32_MAX / slabs) {
    return "the sm90 kernel numbers its work items (a token and 64 heads) in int32: num_tokens must be <= " +
           std::to_string(INT32_MAX / slabs) + " with " + std::to_string(shape.num_heads) + " heads, got " +
           std::to_string(shape.num_tokens);
  }
  return {};
}

// With an extra source of at least kLayerCrossoverMinEntries entries a token, the layer kernel
// pays off from fewer tokens: its time is flat up to one token a unit (a CTA, or a pair at H > 64)
// while the portable kernel's grows with T. Measured on the H200 (`swa-decode bench --kernel all`).
// Unsplit (session 23, bench/results/session23/): at H = 128 the layer kernel against the portable
// one at T = 16 / 20 / 32 is 71.6 / 71.4 / 72.1 against 67.3 / 79.9 / 80.8 us (C4A, 1024 entries),
// 65.3 / 64.6 / 65.9 against 64.4 / 78.1 / 78.5 (C128A 64k), 675 / - / 727 against 742 / - / 963
// (C128A 1M); at H = 64 (C4A) at T = 32 / 48 47.0 / 47.1 against 42.5 / 50.0.
// With the key split (key_splits below: both sources of one row format; session 24,
// bench/results/session24/): at H = 128, T = 8 / 16 the split ran 36.9 / 60.6 against 53.9 / 67.4
// (C4A), 34.8 / 45.1 against 40.0 / 64.6 (C128A 64k), 184 / 188 against 266 / 747 (C128A 1M); at
// T = 1 / 2 / 4 / 6 the portable kernel still wins C4A (27.1 / 27.3 / 33.4 / 34.1 against 35.5 /
// 35.9 / 36.2 / 36.5) and C128A 64k (21.3 / 23.8 / 29.1 / 31.6 against 28.5 / 30.9 / 32.7 / 32.4),
// so the split starts at T = 8 (T = 7 not measured). At H = 64 the split lost up to
// T = 32 (T = 8 / 32: 31.6 / 54.9 against 25.5 / 42.7) and won at T = 48 (38.0 against 50.3): the
// unsplit crossover. Other head counts and fewer entries keep kMinTokens (not measured).
constexpr int64_t kLayerCrossoverMinEntries = 512;
struct LayerCrossover {
  int64_t num_heads;
  int64_t min_tokens;        // sources of two row formats: no key split
  int64_t min_tokens_split;  // sources of one row format
};
constexpr LayerCrossover kLayerCrossovers[] = {{128, 20, 8}, {64, 48, 48}};

// The key split needs both sources in one row format (a mixed pair keeps v4's gather).
bool can_split_keys(const DecodeShape& shape) { return shape.has_extra && shape.window_format == shape.extra_format; }

int64_t min_tokens(const DecodeShape& shape) {
  if (!shape.has_extra || shape.extra_max_entries < kLayerCrossoverMinEntries) return kMinTokens;
  for (const LayerCrossover& crossover : kLayerCrossovers) {
    if (crossover.num_heads == shape.num_heads) {
      return can_split_keys(shape) ? crossover.min_tokens_split : crossover.min_tokens;
    }
  }
  return kMinTokens;
}

bool preferred(const DecodeShape& shape, const DeviceInfo&) {
  return shape.num_heads >= kMinHeads && shape.num_tokens >= min_tokens(shape);
}

// The layer kernel's key split (sm90_layer_plan.h, KeySplit): while the items (a token and a slab)
// fill half the SMs or fewer, each token's columns go to 2, 4 or 8 CTAs (pairs) instead of one,
// the most that keeps the grid within one wave and the cluster within 8 CTAs, with at least a
// subtile of columns a share. Sources of one row format only (can_split_keys).
// One wave counts SMs, not the clusters the GPCs hold at once (one 226 KiB CTA an SM). Measured on
// the H200 (session 24): C4A H = 128 ran 36.9 us at T = 8 (64 CTAs in clusters of 8) and 60.6 at
// T = 16 (128 CTAs), ~ one CTA's time more, as if the last clusters waited; C128A 1M's 184 / 188 us
// do not show it (its tokens' lengths differ). Not settled; T = 16 still beat the portable kernel
// on every H = 128 layer measured.
int key_splits(const DecodeShape& shape, const DeviceInfo& device) {
  if (!can_split_keys(shape)) return 1;
  const int64_t slabs = sm90::layer_slabs(static_cast<int>(shape.num_heads));
  const int64_t columns = shape.window_size + shape.extra_max_entries;
  int splits = 1;
  while (slabs * splits * 2 <= sm90::kMaxLayerClusterCtas && shape.num_tokens * slabs * splits * 2 <= device.num_sms &&
         columns >= int64_t{splits} * 2 * sm90::kSubtileKeys) {
    splits *= 2;
  }
  return splits;
}

LaunchPlan plan(const DecodeShape& shape, const DeviceInfo& device) {
  const bool layer = runs_layer_kernel(shape);
  const int splits = layer ? key_splits(shape, device) : 1;
  return LaunchPlan{.name = std::string(layer ? "sm90_wgmma_layer" : "sm90_wgmma") +
                            (splits > 1 ? "_split" + std::to_string(splits) : ""),
                    .head_groups_per_cta = 0,
                    .config = Sm90Launch{.persistent_ctas = device.num_sms, .layer = layer, .key_splits = splits}};
}

}  // namespace

bool sm90_kernel_built() {
#if defined(SWA_DECODE_HAS_SM90)
  return true;
#else
  return false;
#endif
}

std::string sm90a_why_not(const char* kernel, const DeviceInfo& device) {
  if (!sm90_kernel_built()) return "this build has no sm_90a kernel (sm_90 was not among its CUDA targets)";
  if (device.cc_major != 9 || device.cc_minor != 0) {
    return std::string(kernel) + " needs compute capability 9.0, got " + std::to_string(device.cc_major) + "." +
           std::to_string(device.cc_minor);
  }
  return {};
}

std::string shared_memory_why_not(const char* kernel, int64_t bytes, const DeviceInfo& device) {
  if (device.smem_optin_bytes >= bytes) return {};
  return std::string(kernel) + " needs " + std::to_string(bytes) + " bytes of shared memory per block, device allows " +
         std::to_string(device.smem_optin_bytes);
}

extern const KernelRecord kSm90Record{.id = KernelId::kSm90Wgmma, .family = "sm90", .why_not = why_not,
                                      .preferred = preferred, .plan = plan, .launch = launch_sm90};

}  // namespace swa_decode
