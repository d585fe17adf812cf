// select_kernel (pure) and query_support: supported shapes name a kernel, unsupported ones say why.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "swa_decode/limits.h"
#include "src/api/decode.h"
#include "src/api/validate.h"
#include "src/dispatch/built_targets.h"
#include "src/dispatch/select_kernel.h"
#include "src/kernels/portable/portable_plan.h"
#include "src/kernels/sm90/sm90_plan.h"
#include "testing/host_problem.h"

namespace swa_decode {
namespace {

using testing::HostProblem;
using testing::ProblemShape;

constexpr DeviceInfo kH200{.cc_major = 9, .cc_minor = 0, .num_sms = 132, .smem_optin_bytes = 232448};
constexpr DeviceInfo kA100{.cc_major = 8, .cc_minor = 0, .num_sms = 108, .smem_optin_bytes = 166912};
constexpr DeviceInfo kT4{.cc_major = 7, .cc_minor = 5, .num_sms = 40, .smem_optin_bytes = 65536};

DecodeShape shape(int64_t tokens, int64_t heads, int64_t dim = 512, int64_t window = 128,
                  int32_t kv_row_alignment = 16, bool q_out_aligned_16 = true) {
  return DecodeShape{.num_tokens = tokens, .num_heads = heads, .head_dim = dim, .window_size = window,
                     .kv_row_alignment = kv_row_alignment, .q_out_aligned_16 = q_out_aligned_16};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// `s` with an extra source of `entries` entries (C4A: 512 or 1024, C128A: up to 8192).
DecodeShape with_extra(DecodeShape s, int64_t entries = 512, int32_t alignment = 16) {
  s.has_extra = true;
  s.extra_max_entries = entries;
  s.extra_kv_row_alignment = alignment;
  return s;
}

// What a GPU family says of a shape with an extra source until its kernel reads one.
std::string no_extra_source(const KernelRecord& record) {
  return std::string("the ") + record.family + " kernel does not read an extra KV source yet";
}

// Whether a family's kernel reads an extra source: its why_not does not refuse one (sm90 reads one
// with its layer kernel).
bool reads_extra_source(const KernelRecord& record) {
  return record.why_not(with_extra(shape(128, 64)), kH200) != no_extra_source(record);
}

// The launch configuration of a choice that must be the portable (sm90) kernel's; a failed
// expectation, and zeros, otherwise.
PortableLaunch portable_of(const KernelChoice& choice) {
  const PortableLaunch* config = std::get_if<PortableLaunch>(&choice.plan.config);
  EXPECT_NE(config, nullptr) << "not a portable plan: '" << choice.plan.name << "' " << choice.why_not;
  return config != nullptr ? *config : PortableLaunch{};
}

Sm90Launch sm90_of(const KernelChoice& choice) {
  const Sm90Launch* config = std::get_if<Sm90Launch>(&choice.plan.config);
  EXPECT_NE(config, nullptr) << "not an sm90 plan: '" << choice.plan.name << "' " << choice.why_not;
  return config != nullptr ? *config : Sm90Launch{};
}

TEST(SelectKernel, DeepSeekShapesRunOnHopperAndAmpere) {
  for (const DeviceInfo& device : {kH200, kA100}) {
    for (int64_t heads : {1, 8, 16, 17, 32, 64, 128}) {
      for (int64_t tokens : {0, 1, 8, 512, 2048}) {
        for (int64_t window : {1, 128, 1024}) {
          const KernelChoice choice = select_kernel(shape(tokens, heads, 512, window), device);
          EXPECT_NE(choice.id(), KernelId::kNone) << heads << " heads, " << choice.why_not;
          EXPECT_FALSE(choice.plan.name.empty());
          EXPECT_TRUE(choice.why_not.empty()) << choice.why_not;
          if (choice.id() == KernelId::kSm90Wgmma) {
            EXPECT_EQ(sm90_of(choice).persistent_ctas, device.num_sms);
          } else if (choice.id() == KernelId::kFewHeadsMma) {
            // A window of at most 128, for at most 16 heads or fewer than 64 tokens; one head tile
            // up to 8 heads.
            EXPECT_TRUE(heads <= 16 || tokens < 64) << heads << " heads, " << tokens << " tokens";
            EXPECT_LE(window, 128);
            EXPECT_EQ(choice.plan.name, heads <= 8 ? "few_heads_n8" : "few_heads_n16");
          } else {
            EXPECT_GE(choice.plan.head_groups_per_cta, 1);
            // A CTA never holds more 16-head groups than the problem has.
            EXPECT_LE(choice.plan.head_groups_per_cta, (heads + 15) / 16 > 1 ? (heads + 15) / 16 : 1);
          }
        }
      }
    }
  }
}

// The few-heads kernel runs a seed-format window alone of at most 128 keys with 16-byte rows on a
// compute-capability 9.0 GPU; each other shape says what it lacks, and the free choice runs it on
// the portable kernel (or sm90) instead.
TEST(SelectKernel, FewHeadsRunsSeedWindowsOfAtMost128Keys) {
  if (!sm90_kernel_built()) GTEST_SKIP() << "this build has no sm_90a kernel";
  const auto few_heads_why_not = [](const DecodeShape& s, const DeviceInfo& device) {
    return select_kernel(s, device, KernelId::kFewHeadsMma).why_not;
  };
  EXPECT_EQ(few_heads_why_not(shape(2048, 16), kH200), "");
  EXPECT_EQ(few_heads_why_not(shape(1, 1), kH200), "");
  EXPECT_EQ(few_heads_why_not(shape(1, 128), kH200), "");

  DecodeShape model1 = shape(512, 16);
  model1.window_format = KvFormat::kModel1;
  DecodeShape far_rows = shape(512, 16);
  far_rows.kv_last_row_offset = (int64_t{1} << 32) * 512;
  const struct {
    DecodeShape shape;
    DeviceInfo device;
    std::vector<std::string> parts;
  } refused[] = {
      {shape(512, 16), kA100, {"compute capability 9.0", "got 8.0"}},
      {with_extra(shape(512, 16)), kH200, {"a window alone"}},
      {model1, kH200, {"kE4m3"}},
      {shape(512, 16, 512, 129), kH200, {"window_size must be <= 128", "got 129"}},
      {shape(512, 16, 512, 128, 8), kH200, {"multiples of 16", "got alignment 8"}},
      {far_rows, kH200, {"32 bits", "got 2199023255552"}},
  };
  for (const auto& c : refused) {
    const std::string why = few_heads_why_not(c.shape, c.device);
    for (const std::string& part : c.parts) EXPECT_TRUE(contains(why, part)) << why << " lacks " << part;
    EXPECT_NE(select_kernel(c.shape, c.device).id(), KernelId::kFewHeadsMma);
  }
  // The free choice: every T at H <= 16, below 64 tokens above.
  EXPECT_EQ(select_kernel(shape(2048, 16), kH200).plan.name, "few_heads_n16");
  EXPECT_EQ(select_kernel(shape(2048, 8), kH200).plan.name, "few_heads_n8");
  EXPECT_EQ(select_kernel(shape(63, 128), kH200).plan.name, "few_heads_n16");
  EXPECT_EQ(select_kernel(shape(64, 128), kH200).id(), KernelId::kSm90Wgmma);
}

TEST(SelectKernel, HopperFastPathWhereItFits) {
  // The sm90 kernel runs H > 16 with the whole window (<= 128) in shared memory and 16-byte rows;
  // the few-heads kernel such windows of 16 heads or fewer; everything else, and every non-Hopper
  // device, runs the portable kernel.
  const bool built = sm90_kernel_built();
  EXPECT_EQ(select_kernel(shape(512, 128, 512, 128), kH200).id(), built ? KernelId::kSm90Wgmma : KernelId::kPortableMma);
  EXPECT_EQ(select_kernel(shape(512, 64, 512, 100), kH200).id(), built ? KernelId::kSm90Wgmma : KernelId::kPortableMma);
  // 16 heads or fewer with a window of at most 128 (16-byte rows): the few-heads kernel (sm_90a).
  EXPECT_EQ(select_kernel(shape(512, 16, 512, 128), kH200).id(), built ? KernelId::kFewHeadsMma : KernelId::kPortableMma);
  EXPECT_EQ(select_kernel(shape(1, 8, 512, 128), kH200).id(), built ? KernelId::kFewHeadsMma : KernelId::kPortableMma);
  EXPECT_EQ(select_kernel(shape(1, 8, 512, 128), kA100).id(), KernelId::kPortableMma);
  EXPECT_EQ(select_kernel(shape(512, 16, 512, 129), kH200).id(), KernelId::kPortableMma);
  EXPECT_EQ(select_kernel(shape(512, 17, 512, 128), kH200).id(), built ? KernelId::kSm90Wgmma : KernelId::kPortableMma);
  EXPECT_EQ(select_kernel(shape(512, 128, 512, 129), kH200).id(), KernelId::kPortableMma);
  EXPECT_EQ(select_kernel(shape(512, 128, 512, 128), kA100).id(), KernelId::kPortableMma);
  DecodeShape eight_byte_rows = shape(512, 128, 512, 128);
  eight_byte_rows.kv_row_alignment = 8;  // e.g. 584-byte rows
  EXPECT_EQ(select_kernel(eight_byte_rows, kH200).id(), KernelId::kPortableMma);

  // Forcing a kernel family answers whether that kernel could run the shape, and why not.
  const KernelChoice forced = select_kernel(shape(512, 128, 512, 128), kA100, KernelId::kSm90Wgmma);
  EXPECT_EQ(forced.id(), KernelId::kNone);
  EXPECT_NE(forced.why_not.find(built ? "compute capability 9.0, got 8.0" : "no sm_90a kernel"), std::string::npos)
      << forced.why_not;
  const KernelChoice wide = select_kernel(shape(512, 128, 512, 256), kH200, KernelId::kSm90Wgmma);
  EXPECT_EQ(wide.id(), KernelId::kNone);
  if (built) {
    EXPECT_NE(wide.why_not.find("window_size must be <= 128, got 256"), std::string::npos) << wide.why_not;
  }
  EXPECT_EQ(select_kernel(shape(512, 128, 512, 128), kH200, KernelId::kPortableMma).id(), KernelId::kPortableMma);
}

TEST(SelectKernel, Sm90NeedsRowsWithin64GiBOfTheCache) {
  // The sm90 kernel keeps row offsets as 32-bit counts of 16 bytes; a larger cache runs portable.
  DecodeShape huge = shape(512, 128, 512, 128);
  huge.kv_last_row_offset = int64_t{1} << 36;
  EXPECT_EQ(select_kernel(huge, kH200).id(), KernelId::kPortableMma);
  const KernelChoice forced = select_kernel(huge, kH200, KernelId::kSm90Wgmma);
  EXPECT_EQ(forced.id(), KernelId::kNone);
  if (sm90_kernel_built()) {
    EXPECT_TRUE(contains(forced.why_not, "within 64 GiB of kv_cache, got 68719476736 bytes")) << forced.why_not;
    huge.kv_last_row_offset = (int64_t{1} << 36) - 16;  // the last offset that fits
    EXPECT_EQ(select_kernel(huge, kH200).id(), KernelId::kSm90Wgmma);
  }
}

TEST(SelectKernel, PortableStagingRingFitsTheDevice) {
  // A 128-entry window is 4 tiles of 32 rows: with room, all of them are in flight at once.
  EXPECT_EQ(portable_of(select_kernel(shape(512, 128, 512, 128), kA100)).num_stages, 4);
  // Never more stages than the window has tiles.
  EXPECT_EQ(portable_of(select_kernel(shape(512, 128, 512, 64), kA100)).num_stages, 2);
  EXPECT_EQ(portable_of(select_kernel(shape(512, 128, 512, 96), kA100)).num_stages, 3);
  // Where two CTAs can share an SM (H200: 2 x 113 KiB), the ring stops at what lets them: at two
  // head groups that is 2 stages, at one group 3.
  const KernelChoice shared = select_kernel(shape(512, 128, 512, 128), kH200, KernelId::kPortableMma);
  EXPECT_EQ(shared.plan.head_groups_per_cta, 2);
  EXPECT_EQ(portable_of(shared).num_stages, 2);
  EXPECT_LE(portable::ring_plan(2, portable_of(shared).num_stages, portable::list_shape(128, false)).total_bytes,
            portable::two_ctas_per_sm_budget(kH200.smem_optin_bytes));
  EXPECT_EQ(portable_of(select_kernel(shape(512, 16, 512, 128), kH200, KernelId::kPortableMma)).num_stages, 3);
  // A 99 KiB device (sm_86/89/120) still runs the longest window, with the minimum ring and one
  // head group (two would need 16 KiB more for q than it has).
  constexpr DeviceInfo k99KiB{.cc_major = 8, .cc_minor = 9, .num_sms = 128, .smem_optin_bytes = 101376};
  const KernelChoice wide = select_kernel(shape(512, 128, 512, 1024), k99KiB);
  ASSERT_EQ(wide.id(), KernelId::kPortableMma);
  EXPECT_EQ(portable_of(wide).num_stages, portable::kMinStages);
  EXPECT_EQ(wide.plan.head_groups_per_cta, 1);
  EXPECT_LE(portable::ring_plan(wide.plan.head_groups_per_cta, portable_of(wide).num_stages,
                                portable::list_shape(1024, false))
                .total_bytes,
            101376);
  for (const int64_t window : {1, 31, 128, 500, 1024}) {
    for (const DeviceInfo& device : {kH200, kA100, k99KiB}) {
      const KernelChoice choice = select_kernel(shape(2048, 16, 512, window), device, KernelId::kPortableMma);
      ASSERT_EQ(choice.id(), KernelId::kPortableMma);
      const int stages = portable_of(choice).num_stages;
      EXPECT_LE(portable::ring_plan(choice.plan.head_groups_per_cta, stages,
                                    portable::list_shape(static_cast<int>(window), false))
                    .total_bytes,
                device.smem_optin_bytes)
          << "window " << window;
    }
  }
}

TEST(SelectKernel, SmallBatchesSplitTheWindowOnHopperOnly) {
  const auto portable = [](int64_t tokens, int64_t heads, int64_t window, const DeviceInfo& device) {
    return select_kernel(shape(tokens, heads, 512, window), device, KernelId::kPortableMma);
  };
  // A window splits 4 ways when the split grid stays within a quarter of the SMs (33 of 132).
  EXPECT_EQ(portable_of(portable(1, 128, 128, kH200)).window_splits, 4);  // 8 one-group CTAs -> 32
  EXPECT_EQ(portable(1, 128, 128, kH200).plan.name, "portable_mma_g1_split4");
  EXPECT_EQ(portable_of(portable(8, 16, 128, kH200)).window_splits, 4);   // 8 CTAs
  EXPECT_EQ(portable_of(portable(9, 16, 128, kH200)).window_splits, 1);   // 9 CTAs
  EXPECT_EQ(portable_of(portable(2, 64, 128, kH200)).window_splits, 4);
  EXPECT_EQ(portable_of(portable(8, 128, 128, kH200)).window_splits, 1);  // 64 CTAs
  EXPECT_EQ(portable(8, 128, 128, kH200).plan.name, "portable_mma_g1");
  EXPECT_EQ(portable_of(portable(1, 128, 96, kH200)).window_splits, 1);   // fewer than 4 tiles of 32 keys
  EXPECT_EQ(portable_of(portable(1, 16, 1024, kH200)).window_splits, 4);
  // Clusters need sm_90: Ampere never splits.
  for (int64_t tokens : {1, 2, 8}) EXPECT_EQ(portable_of(portable(tokens, 16, 128, kA100)).window_splits, 1);
  for (int64_t tokens : {1, 2, 5, 16, 33, 100, 1000}) {
    for (int64_t heads : {1, 16, 64, 128}) {
      const KernelChoice choice = portable(tokens, heads, 128, kH200);
      const int64_t heads_per_cta = 16 * choice.plan.head_groups_per_cta;
      const int64_t ctas = tokens * ((heads + heads_per_cta - 1) / heads_per_cta);
      const int32_t splits = portable_of(choice).window_splits;
      EXPECT_TRUE(splits == 1 || (splits == 4 && ctas * 4 <= kH200.num_sms / 4))
          << tokens << " tokens, " << heads << " heads";
    }
  }
}

// With an extra source of at least 4 tiles a token, the portable kernel splits 4 ways while the
// split grid fits two CTAs per SM (portable_plan.h, choose_window_splits; 264 on the H200's 132
// SMs); with at least 8 tiles 8 ways where that grid fills at most half the SMs (66), or, with at
// least kHeavyExtraTiles (128), where it fits two CTAs per SM.
TEST(SelectKernel, LayersSplitTheirEntriesWhereTheSplitGridFits) {
  const auto portable = [](int64_t tokens, int64_t heads, int64_t entries, const DeviceInfo& device) {
    return select_kernel(with_extra(shape(tokens, heads), entries), device, KernelId::kPortableMma);
  };
  EXPECT_EQ(portable_of(portable(8, 128, 1024, kH200)).window_splits, 4);  // 64 one-group CTAs -> 256
  EXPECT_EQ(portable(8, 128, 1024, kH200).plan.name, "portable_mma_g1_split4");
  EXPECT_EQ(portable_of(portable(4, 128, 1024, kH200)).window_splits, 4);  // 32 -> 256 > 66 at 8 ways
  EXPECT_EQ(portable_of(portable(4, 128, 8192, kH200)).window_splits, 8);  // 256 tiles; 32 -> 256 <= 264
  EXPECT_EQ(portable_of(portable(4, 128, 4096, kH200)).window_splits, 8);  // 128 tiles
  EXPECT_EQ(portable_of(portable(4, 128, 4064, kH200)).window_splits, 4);  // 127 tiles
  EXPECT_EQ(portable_of(portable(5, 128, 8192, kH200)).window_splits, 4);  // 40 -> 320 > 264
  EXPECT_EQ(portable_of(portable(33, 16, 4096, kH200)).window_splits, 8);  // 33 -> 264: the bound itself
  EXPECT_EQ(portable_of(portable(34, 16, 4096, kH200)).window_splits, 4);  // 34 -> 272
  // The half-SM bound on a device whose half is not a multiple of 8: 114 SMs, 57.
  const DeviceInfo sms114 = [] { DeviceInfo d = kH200; d.num_sms = 114; return d; }();
  EXPECT_EQ(portable_of(portable(1, 128, 1024, sms114)).window_splits, 4);  // 8 -> 64 > 57
  EXPECT_EQ(portable_of(portable(1, 64, 1024, sms114)).window_splits, 8);   // 4 -> 32
  EXPECT_EQ(portable_of(portable(2, 64, 512, kH200)).window_splits, 8);    // 8 -> 64 <= 66
  EXPECT_EQ(portable(1, 128, 1024, kH200).plan.name, "portable_mma_g1_split8");
  EXPECT_EQ(portable_of(portable(8, 64, 512, kH200)).window_splits, 4);   // 32 -> 256 > 66 at 8 ways
  EXPECT_EQ(portable_of(portable(4, 64, 512, kH200)).window_splits, 4);   // 16 -> 128 > 66
  EXPECT_EQ(portable_of(portable(16, 64, 512, kH200)).window_splits, 4);  // 64 -> 256
  EXPECT_EQ(portable_of(portable(32, 64, 512, kH200)).window_splits, 1);  // 128 -> 512
  EXPECT_EQ(portable_of(portable(32, 128, 1024, kH200)).window_splits, 1);
  EXPECT_EQ(portable_of(portable(1, 128, 200, kH200)).window_splits, 4);  // 7 extra tiles: not 8
  EXPECT_EQ(portable_of(portable(1, 128, 224, kH200)).window_splits, 4);  // 7 tiles
  EXPECT_EQ(portable_of(portable(1, 128, 225, kH200)).window_splits, 8);  // 8 tiles
  EXPECT_EQ(portable_of(portable(8, 128, 96, kH200)).window_splits, 1);  // 3 extra tiles: the window's rule
  EXPECT_EQ(portable_of(portable(1, 128, 96, kH200)).window_splits, 4);
  for (int64_t tokens : {1, 8}) EXPECT_EQ(portable_of(portable(tokens, 64, 512, kA100)).window_splits, 1);
  for (int64_t tokens : {1, 2, 8, 16, 33, 100}) {
    for (int64_t heads : {1, 16, 64, 128}) {
      const KernelChoice choice = portable(tokens, heads, 1024, kH200);
      const int64_t heads_per_cta = 16 * choice.plan.head_groups_per_cta;
      const int64_t ctas = tokens * ((heads + heads_per_cta - 1) / heads_per_cta);
      const int expected = ctas * 8 <= kH200.num_sms / 2 ? 8 : ctas * 4 <= 2 * kH200.num_sms ? 4 : 1;
      EXPECT_EQ(portable_of(choice).window_splits, expected) << tokens << " tokens, " << heads << " heads";
    }
  }
}

// A window of kModel1 rows alone runs on the sm90 window kernel, but at H <= 64 from 512 tokens on
// the layer kernel's lone CTA (sm90_record.cpp, kModel1LayerKernelMinTokens: measured the faster).
TEST(SelectKernel, Model1WindowsAtFewHeadsAndManyTokensRunTheLayerKernel) {
  if (!sm90_kernel_built()) GTEST_SKIP() << "this build has no sm_90a kernel";
  const auto plan_name = [](int64_t tokens, int64_t heads, KvFormat format) {
    DecodeShape s = shape(tokens, heads);
    s.window_format = format;
    return kSm90Record.plan(s, kH200).name;
  };
  EXPECT_EQ(plan_name(512, 64, KvFormat::kModel1), "sm90_wgmma_layer");
  EXPECT_EQ(plan_name(2048, 1, KvFormat::kModel1), "sm90_wgmma_layer");
  EXPECT_EQ(plan_name(511, 64, KvFormat::kModel1), "sm90_wgmma");
  EXPECT_EQ(plan_name(2048, 65, KvFormat::kModel1), "sm90_wgmma");
  EXPECT_EQ(plan_name(2048, 64, KvFormat::kE4m3), "sm90_wgmma");
  DecodeShape model1 = shape(2048, 64);
  model1.window_format = KvFormat::kModel1;
  EXPECT_EQ(kSm90Record.why_not(model1, kH200), "");
}

TEST(SelectKernel, WithAnExtraSourceAFamilyRunsItOrSaysWhyNot) {
  EXPECT_TRUE(reads_extra_source(kPortableRecord));
  EXPECT_EQ(reads_extra_source(kSm90Record), sm90_kernel_built());
  int shapes = 0;
  for (const DeviceInfo& device : {kH200, kA100}) {
    for (int64_t tokens : {1, 128, 2048}) {
      for (int64_t heads : {16, 64, 128}) {
        for (int64_t entries : {int64_t{1}, int64_t{512}, int64_t{1024}, int64_t{8192}, kMaxExtraEntries}) {
          const DecodeShape s = with_extra(shape(tokens, heads), entries);
          EXPECT_TRUE(gpu_why_not(s, device).empty()) << gpu_why_not(s, device);
          EXPECT_EQ(kPortableRecord.why_not(s, device), "");
          const KernelChoice choice = select_kernel(s, device);
          bool some_family_runs_it = false;
          for (const KernelRecord* record : kernel_records()) {
            const KernelChoice forced = select_kernel(s, device, record->id);
            if (reads_extra_source(*record)) {
              some_family_runs_it |= record->why_not(s, device).empty();
              continue;
            }
            EXPECT_EQ(record->why_not(s, device), no_extra_source(*record));
            EXPECT_EQ(forced.kernel, nullptr) << record->family;
            EXPECT_EQ(forced.why_not, no_extra_source(*record));
            EXPECT_TRUE(choice.kernel != nullptr || contains(choice.why_not, no_extra_source(*record)))
                << choice.why_not;
          }
          // The free choice runs it on a family that reads it, where one can: the sm90 layer kernel
          // wherever sm90 is preferred (the H200, more than 16 heads, at least 64 tokens).
          EXPECT_EQ(choice.kernel != nullptr, some_family_runs_it) << choice.plan.name << choice.why_not;
          if (choice.kernel != nullptr) {
            EXPECT_TRUE(reads_extra_source(*choice.kernel)) << choice.kernel->family;
          }
          if (choice.kernel == &kSm90Record) {
            EXPECT_EQ(choice.plan.name, "sm90_wgmma_layer");
            EXPECT_TRUE(sm90_of(choice).layer);
          }
          if (sm90_kernel_built() && device.cc_major == 9 && heads > 16 && tokens >= 64) {
            EXPECT_EQ(choice.kernel, &kSm90Record) << choice.why_not;
          }
          ++shapes;
        }
      }
    }
  }
  EXPECT_EQ(shapes, 2 * 3 * 3 * 5);
  // The same shapes without the extra source run, on the window-only kernel where it is sm90's.
  const KernelChoice window_only = select_kernel(shape(128, 128), kH200);
  ASSERT_NE(window_only.kernel, nullptr);
  if (window_only.kernel == &kSm90Record) {
    EXPECT_EQ(window_only.plan.name, "sm90_wgmma");
    EXPECT_FALSE(sm90_of(window_only).layer);
  }
}

// The layer kernel keeps the extra source's row offsets as the window's (32-bit counts of 16
// bytes), numbers its work items (a token and 64 heads) in int32, and needs the window in one tile.
TEST(SelectKernel, TheSm90LayerKernelChecksTheExtraSourceLikeTheWindow) {
  if (!sm90_kernel_built()) GTEST_SKIP() << "this build has no sm_90a kernel";
  const DecodeShape c4a = with_extra(shape(512, 64), 1024);
  EXPECT_TRUE(kSm90Record.why_not(c4a, kH200).empty()) << kSm90Record.why_not(c4a, kH200);
  EXPECT_EQ(kSm90Record.why_not(with_extra(shape(512, 64), 1024, 8), kH200),
            "the sm90 kernel copies cache rows 16 bytes at a time: extra.kv_cache address and strides must be "
            "multiples of 16, got alignment 8");
  DecodeShape far = c4a;
  far.extra_kv_last_row_offset = int64_t{UINT32_MAX} * 16 + 16;
  EXPECT_EQ(kSm90Record.why_not(far, kH200),
            "the sm90 kernel keeps cache row offsets as 32-bit counts of 16 bytes: the last row must start within "
            "64 GiB of extra.kv_cache, got " + std::to_string(far.extra_kv_last_row_offset) + " bytes");
  far.extra_kv_last_row_offset = int64_t{UINT32_MAX} * 16;  // the last row that fits
  EXPECT_TRUE(kSm90Record.why_not(far, kH200).empty());
  // Two work items per token above 64 heads.
  EXPECT_TRUE(kSm90Record.why_not(with_extra(shape(INT32_MAX, 64)), kH200).empty());
  EXPECT_TRUE(kSm90Record.why_not(with_extra(shape(INT32_MAX / 2, 65)), kH200).empty());
  EXPECT_EQ(kSm90Record.why_not(with_extra(shape(INT32_MAX / 2 + 1, 65)), kH200),
            "the sm90 kernel numbers its work items (a token and 64 heads) in int32: num_tokens must be <= " +
                std::to_string(INT32_MAX / 2) + " with 65 heads, got " + std::to_string(INT32_MAX / 2 + 1));
  // The window's own limits hold as without an extra source.
  EXPECT_TRUE(contains(kSm90Record.why_not(with_extra(shape(512, 64, 512, 129)), kH200), "window_size must be <= 128"));
  EXPECT_TRUE(contains(kSm90Record.why_not(with_extra(shape(512, 64, 512, 128, 8)), kH200),
                       "kv_cache address and strides must be multiples of 16"));
  // The free choice's preference is the window kernel's (more than 16 heads, at least 64 tokens)
  // except at the measured crossovers, with at least 512 entries (sm90_record.cpp, kLayerCrossovers):
  // H = 128 from 8 tokens where the key split runs (one row format), from 20 where it does not
  // (a seed window with a MODEL1 extra source); H = 64 from 48 either way.
  EXPECT_TRUE(kSm90Record.preferred(with_extra(shape(64, 17)), kH200));
  EXPECT_FALSE(kSm90Record.preferred(with_extra(shape(63, 17)), kH200));
  EXPECT_FALSE(kSm90Record.preferred(with_extra(shape(63, 96)), kH200));
  EXPECT_FALSE(kSm90Record.preferred(with_extra(shape(2048, 16)), kH200));
  const auto mixed = [](DecodeShape s) {
    s.extra_format = KvFormat::kModel1;
    return s;
  };
  for (int64_t entries : {int64_t{512}, int64_t{1024}, int64_t{8192}}) {
    EXPECT_TRUE(kSm90Record.preferred(with_extra(shape(8, 128), entries), kH200)) << entries;
    EXPECT_FALSE(kSm90Record.preferred(with_extra(shape(7, 128), entries), kH200)) << entries;
    EXPECT_TRUE(kSm90Record.preferred(mixed(with_extra(shape(20, 128), entries)), kH200)) << entries;
    EXPECT_FALSE(kSm90Record.preferred(mixed(with_extra(shape(19, 128), entries)), kH200)) << entries;
    for (const DecodeShape& s : {with_extra(shape(48, 64), entries), mixed(with_extra(shape(48, 64), entries))}) {
      EXPECT_TRUE(kSm90Record.preferred(s, kH200)) << entries;
    }
    for (const DecodeShape& s : {with_extra(shape(47, 64), entries), mixed(with_extra(shape(47, 64), entries))}) {
      EXPECT_FALSE(kSm90Record.preferred(s, kH200)) << entries;
    }
  }
  EXPECT_FALSE(kSm90Record.preferred(with_extra(shape(32, 128), 511), kH200));  // fewer entries: 64
  EXPECT_FALSE(kSm90Record.preferred(shape(32, 128), kH200));                   // the window alone: 64
}

// The layer kernel's key split (sm90_record.cpp, key_splits): 2, 4 or 8 CTAs (pairs) a token while
// the grid stays within one wave of the H200's 132 SMs and the cluster within 8 CTAs, with a
// subtile of columns a share; none without an extra source or over two row formats.
TEST(SelectKernel, TheLayerKernelSplitsATokensKeysWhileTheGridFitsOneWave) {
  const auto splits = [](DecodeShape s) { return std::get<Sm90Launch>(kSm90Record.plan(s, kH200).config).key_splits; };
  const std::pair<int64_t, int> pairs[] = {{1, 4}, {16, 4}, {17, 2}, {33, 2}, {34, 1}, {128, 1}};
  for (const auto& [tokens, expected] : pairs) EXPECT_EQ(splits(with_extra(shape(tokens, 128))), expected) << tokens;
  const std::pair<int64_t, int> lone[] = {{1, 8}, {16, 8}, {17, 4}, {33, 4}, {34, 2}, {66, 2}, {67, 1}};
  for (const auto& [tokens, expected] : lone) EXPECT_EQ(splits(with_extra(shape(tokens, 64))), expected) << tokens;
  EXPECT_EQ(splits(with_extra(shape(1, 64), 64)), 2);  // 128 + 64 columns: 3 subtiles
  EXPECT_EQ(splits(shape(1, 128)), 1);                 // the window alone: the window kernel
  DecodeShape mixed = with_extra(shape(1, 128));
  mixed.extra_format = KvFormat::kModel1;
  EXPECT_EQ(splits(mixed), 1);
  EXPECT_EQ(kSm90Record.plan(with_extra(shape(8, 128)), kH200).name, "sm90_wgmma_layer_split4");
  EXPECT_EQ(kSm90Record.plan(with_extra(shape(128, 128)), kH200).name, "sm90_wgmma_layer");
}

TEST(SelectKernel, AnExtraSourceMeetsTheSharedChecksOfItsOwn) {
  const KernelChoice misaligned = select_kernel(with_extra(shape(128, 64), 512, 2), kH200);
  EXPECT_EQ(misaligned.kernel, nullptr);
  EXPECT_TRUE(contains(misaligned.why_not, "extra.kv_cache address, extra.stride_kv_block and extra.stride_kv_token "
                                           "must be multiples of 4 bytes on the GPU, got alignment 2"))
      << misaligned.why_not;
  EXPECT_TRUE(gpu_why_not(with_extra(shape(128, 64), 512, 4), kH200).empty());
  for (const int64_t entries : {int64_t{0}, kMaxExtraEntries + 1}) {
    EXPECT_EQ(gpu_why_not(with_extra(shape(128, 64), entries), kH200),
              "extra.max_entries must be in [1, " + std::to_string(kMaxExtraEntries) + "], got " +
                  std::to_string(entries));
  }
  // The window's checks still come first, and without an extra source its fields are not looked at.
  EXPECT_TRUE(contains(gpu_why_not(with_extra(shape(8, 128, 256), 0), kH200), "head_dim")) << "head_dim first";
  DecodeShape none = shape(128, 64);
  none.extra_max_entries = -3;
  none.extra_kv_row_alignment = 1;
  EXPECT_TRUE(gpu_why_not(none, kH200).empty());
}

TEST(SelectKernel, SelectionIsPure) {
  // W = 256: a portable shape (the sm90 and few-heads kernels hold at most 128 keys).
  const KernelChoice a = select_kernel(shape(32, 64, 512, 256), kH200);
  const KernelChoice b = select_kernel(shape(32, 64, 512, 256), kH200);
  EXPECT_EQ(a.id(), b.id());
  EXPECT_EQ(a.plan.name, b.plan.name);
  EXPECT_EQ(a.plan.head_groups_per_cta, b.plan.head_groups_per_cta);
  EXPECT_EQ(portable_of(a).window_splits, portable_of(b).window_splits);
}

TEST(SelectKernel, UnsupportedShapesSayWhy) {
  struct Case {
    DecodeShape shape;
    DeviceInfo device;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {shape(8, 128), kT4, {"compute capability", "8.0", "7.5"}},
      {shape(8, 128, 256), kH200, {"head_dim", "512", "256"}},
      {shape(8, 129), kH200, {"num_heads", "128", "129"}},
      {shape(8, 0), kH200, {"num_heads", "got 0"}},
      {shape(8, 128, 512, 2048), kH200, {"window_size", "1024", "2048"}},
      {shape(8, 128, 512, 128, 2), kH200, {"kv_cache", "4 bytes", "got alignment 2"}},
      {shape(8, 128, 512, 128, 16, false), kH200, {"q and out", "16 bytes"}},
  };
  for (const Case& c : cases) {
    const KernelChoice choice = select_kernel(c.shape, c.device);
    EXPECT_EQ(choice.id(), KernelId::kNone);
    for (const std::string& part : c.parts) EXPECT_TRUE(contains(choice.why_not, part)) << choice.why_not;
  }
}

TEST(SelectKernel, SharedLimitsComeFromLimitsH) {
  // The messages state the bounds of swa_decode/limits.h and sm90_plan.h, whatever their values.
  const auto why = [](const DecodeShape& s) { return select_kernel(s, kH200).why_not; };
  EXPECT_TRUE(contains(why(shape(8, 16, kGpuHeadDim / 2)), "head_dim must be " + std::to_string(kGpuHeadDim)));
  EXPECT_TRUE(contains(why(shape(8, kMaxGpuHeads + 1)), "[1, " + std::to_string(kMaxGpuHeads) + "], got " +
                                                            std::to_string(kMaxGpuHeads + 1)));
  EXPECT_TRUE(contains(why(shape(8, 16, kGpuHeadDim, kMaxWindow + 1)), "[1, " + std::to_string(kMaxWindow) + "]"));
  EXPECT_NE(select_kernel(shape(8, kMaxGpuHeads, kGpuHeadDim, kMaxWindow), kH200).id(), KernelId::kNone);
  if (sm90_kernel_built()) {
    const DecodeShape widest = shape(512, 128, kGpuHeadDim, sm90::kKeys);
    EXPECT_EQ(select_kernel(widest, kH200, KernelId::kSm90Wgmma).id(), KernelId::kSm90Wgmma);
    const KernelChoice wider =
        select_kernel(shape(512, 128, kGpuHeadDim, sm90::kKeys + 1), kH200, KernelId::kSm90Wgmma);
    EXPECT_TRUE(contains(wider.why_not, "window_size must be <= " + std::to_string(sm90::kKeys))) << wider.why_not;
    DeviceInfo small = kH200;
    small.smem_optin_bytes = sm90::kSmemBytes - 1;
    EXPECT_TRUE(contains(select_kernel(widest, small, KernelId::kSm90Wgmma).why_not,
                         "needs " + std::to_string(sm90::kSmemBytes) + " bytes"));
  }
}

TEST(SelectKernel, AnUnknownKernelIdIsRefused) {
  const KernelChoice choice = select_kernel(shape(512, 128), kH200, static_cast<KernelId>(7));
  EXPECT_EQ(choice.kernel, nullptr);
  EXPECT_TRUE(contains(choice.why_not, "KernelId(7)")) << choice.why_not;
}

// A device no record runs anything on: sm_80 with too little shared memory for the portable ring.
constexpr DeviceInfo kTinySmem{.cc_major = 8, .cc_minor = 0, .num_sms = 16, .smem_optin_bytes = 48 * 1024};

TEST(SelectKernel, WhenNoKernelRunsTheShapeEveryFamilySaysWhy) {
  const KernelChoice choice = select_kernel(shape(512, 128), kTinySmem);
  EXPECT_EQ(choice.kernel, nullptr);
  for (const KernelRecord* record : kernel_records()) {
    const std::string own = record->why_not(shape(512, 128), kTinySmem);
    ASSERT_FALSE(own.empty()) << record->family;
    EXPECT_TRUE(contains(choice.why_not, own)) << choice.why_not;
  }
}

// Shapes and devices the record tests walk: each record runs some and refuses some for a reason of
// its own (window, alignment, cache size, compute capability, shared memory).
std::vector<DecodeShape> record_sweep_shapes() {
  std::vector<DecodeShape> shapes;
  for (int64_t tokens : {1, 8, 63, 64, 512}) {
    for (int64_t heads : {1, 16, 17, 64, 128, 129}) {
      for (int64_t window : {1, 96, 128, 129, 1024}) {
        for (int32_t alignment : {2, 8, 16}) {
          for (int64_t last_row : {int64_t{0}, int64_t{1} << 36}) {
            DecodeShape s = shape(tokens, heads, kGpuHeadDim, window, alignment);
            s.kv_last_row_offset = last_row;
            shapes.push_back(s);
          }
        }
      }
    }
  }
  shapes.push_back(shape(512, 128, kGpuHeadDim, 128, 16, false));
  shapes.push_back(shape(512, 128, 256));
  for (int64_t tokens : {1, 512}) {  // C4A (512 and 1024 entries) and C128A at 1M (8192)
    for (int64_t entries : {512, 1024, 8192}) {
      for (int32_t alignment : {2, 8, 16}) shapes.push_back(with_extra(shape(tokens, 128), entries, alignment));
    }
  }
  return shapes;
}

constexpr DeviceInfo k99KiBDevice{.cc_major = 8, .cc_minor = 9, .num_sms = 128, .smem_optin_bytes = 101376};
constexpr DeviceInfo kB200{.cc_major = 10, .cc_minor = 0, .num_sms = 148, .smem_optin_bytes = 232448};
constexpr DeviceInfo kRecordSweepDevices[] = {kH200, kA100, kT4, k99KiBDevice, kB200, kTinySmem};

TEST(KernelRecords, IdsFamiliesAndKernelNamesAreUniqueAndStable) {
  std::set<KernelId> ids;
  std::set<std::string> families;
  for (const KernelRecord* record : kernel_records()) {
    EXPECT_NE(record->id, KernelId::kNone) << record->family;
    EXPECT_TRUE(ids.insert(record->id).second) << "two records share id " << static_cast<int>(record->id);
    ASSERT_NE(record->family, nullptr);
    EXPECT_FALSE(std::string(record->family).empty());
    EXPECT_TRUE(families.insert(record->family).second) << "two records share family " << record->family;
    EXPECT_EQ(find_kernel(record->id), record);
    EXPECT_EQ(find_kernel(std::string(record->family)), record);
    EXPECT_NE(record->why_not, nullptr);
    EXPECT_NE(record->preferred, nullptr);
    EXPECT_NE(record->plan, nullptr);
    EXPECT_NE(record->launch, nullptr);
  }
  EXPECT_EQ(families, (std::set<std::string>{"portable", "sm90", "few_heads"}));  // SWA_DECODE_TEST_KERNEL and --kernel
  EXPECT_EQ(find_kernel(KernelId::kNone), nullptr);
  EXPECT_EQ(find_kernel("cpu"), nullptr);

  // Every kernel name comes from one record, every record's plans carry one configuration type of
  // their own (what its launch adapter unpacks), and the names are the stable ones the bench JSON
  // and the tests print.
  std::map<std::string, KernelId> name_owner;
  std::map<KernelId, size_t> config_type;
  for (const DeviceInfo& device : kRecordSweepDevices) {
    for (const DecodeShape& s : record_sweep_shapes()) {
      if (!gpu_why_not(s, device).empty()) continue;
      for (const KernelRecord* record : kernel_records()) {
        if (!record->why_not(s, device).empty()) continue;
        const LaunchPlan plan = record->plan(s, device);
        const auto [owner, fresh] = name_owner.emplace(plan.name, record->id);
        EXPECT_EQ(owner->second, record->id) << plan.name << " comes from two records";
        EXPECT_NE(plan.config.index(), 0u) << plan.name << " has no launch configuration";
        const auto [type, first] = config_type.emplace(record->id, plan.config.index());
        EXPECT_EQ(type->second, plan.config.index()) << record->family << " plans two configuration types";
      }
    }
  }
  std::set<std::string> names;
  for (const auto& [name, owner] : name_owner) names.insert(name);
  std::set<std::string> stable = {"portable_mma_g1", "portable_mma_g2", "portable_mma_g1_split4",
                                  "portable_mma_g1_split8"};
  if (sm90_kernel_built()) {
    stable.insert({"sm90_wgmma", "sm90_wgmma_layer", "sm90_wgmma_layer_split4", "few_heads_n8", "few_heads_n16"});
  }
  EXPECT_EQ(names, stable);
  std::set<size_t> types;
  for (const auto& [id, type] : config_type) {
    EXPECT_TRUE(types.insert(type).second) << "two records plan the same configuration type";
  }
}

TEST(KernelRecords, ForcingAFamilyAnswersWithThatFamilysPlanOrWhyNot) {
  for (const KernelRecord* record : kernel_records()) {
    int runs = 0;
    int refusals = 0;  // shapes the shared checks pass and this record refuses for its own reason
    for (const DeviceInfo& device : kRecordSweepDevices) {
      for (const DecodeShape& s : record_sweep_shapes()) {
        const KernelChoice forced = select_kernel(s, device, record->id);
        const std::string shared = gpu_why_not(s, device);
        const std::string own = record->why_not(s, device);
        if (!shared.empty()) {
          EXPECT_EQ(forced.kernel, nullptr);
          EXPECT_EQ(forced.why_not, shared);
        } else if (!own.empty()) {
          ++refusals;
          EXPECT_EQ(forced.kernel, nullptr) << record->family;
          EXPECT_EQ(forced.why_not, own);
        } else {
          ++runs;
          EXPECT_EQ(forced.kernel, record);
          EXPECT_EQ(forced.plan.name, record->plan(s, device).name);
          EXPECT_TRUE(forced.why_not.empty()) << forced.why_not;
        }
      }
    }
    EXPECT_GT(refusals, 0) << record->family << " refused nothing: the sweep does not test its why_not";
    if (record->id != KernelId::kSm90Wgmma || sm90_kernel_built()) {
      EXPECT_GT(runs, 0) << record->family;
    }
  }
}

TEST(KernelRecords, FreeChoiceIsTheFirstPreferredRecordThatRunsTheShape) {
  int chosen = 0;
  for (const DeviceInfo& device : kRecordSweepDevices) {
    for (const DecodeShape& s : record_sweep_shapes()) {
      const KernelChoice choice = select_kernel(s, device);
      const std::string shared = gpu_why_not(s, device);
      if (!shared.empty()) {
        EXPECT_EQ(choice.kernel, nullptr);
        EXPECT_EQ(choice.why_not, shared);
        continue;
      }
      const KernelRecord* expected = nullptr;
      const KernelRecord* fallback = nullptr;
      for (const KernelRecord* record : kernel_records()) {
        if (!record->why_not(s, device).empty()) continue;
        if (record->preferred(s, device)) {
          expected = record;
          break;
        }
        if (fallback == nullptr) fallback = record;
      }
      if (expected == nullptr) expected = fallback;
      EXPECT_EQ(choice.kernel, expected) << s.num_tokens << " tokens, " << s.num_heads << " heads, window "
                                         << s.window_size << ": " << choice.plan.name << choice.why_not;
      if (expected == nullptr) continue;
      ++chosen;
      EXPECT_EQ(choice.plan.name, expected->plan(s, device).name);
      EXPECT_EQ(choice.plan.head_groups_per_cta, expected->plan(s, device).head_groups_per_cta);
    }
  }
  EXPECT_GT(chosen, 0);
}

DecodeArgs args_for(HostProblem& p, Backend backend) {
  DecodeArgs a = p.args();
  a.backend = backend;
  return a;
}

ProblemShape deepseek_like(int64_t heads, int64_t dim) {
  ProblemShape s;
  s.num_tokens = 2;
  s.num_heads = heads;
  s.head_dim = dim;
  s.num_blocks = 2;
  s.block_size = 4;
  s.window_size = 4;
  s.index_cols = 4;
  return s;
}

TEST(QuerySupport, CpuBackendRunsAnyHeadDim) {
  for (int64_t dim : {1, 96, 256, 512, 700}) {
    HostProblem p(deepseek_like(3, dim), 1);
    const SupportInfo info = query_support(args_for(p, Backend::kCpu));
    EXPECT_TRUE(info.supported) << dim << ": " << info.why_not;
    EXPECT_EQ(info.kernel, "cpu_reference");
    EXPECT_EQ(info.family, "cpu");
    EXPECT_EQ(info.head_groups_per_cta, 1);
    EXPECT_TRUE(info.why_not.empty());
  }
}

ProblemShape with_extra_source(ProblemShape s) {
  s.extra = testing::ExtraShape{.num_blocks = 3, .block_size = 2, .max_entries = 6, .index_cols = 6};
  return s;
}

TEST(QuerySupport, CpuBackendRunsAnExtraSource) {
  HostProblem p(with_extra_source(deepseek_like(128, 512)), 11);
  const SupportInfo info = query_support(args_for(p, Backend::kCpu));
  EXPECT_TRUE(info.supported) << info.why_not;
  EXPECT_EQ(info.kernel, "cpu_reference");
  EXPECT_EQ(info.family, "cpu");
  EXPECT_TRUE(query_support_on(args_for(p, Backend::kCpu), kH200).supported);
  EXPECT_TRUE(decode(args_for(p, Backend::kCpu)).ok());
}

TEST(QuerySupport, CudaWithAnExtraSourceRunsWhereAFamilyReadsIt) {
  HostProblem p(with_extra_source(deepseek_like(128, 512)), 12);
  const DecodeArgs cuda = args_for(p, Backend::kCuda);
  for (const DeviceInfo& device : {kH200, kA100}) {
    const SupportInfo info = query_support_on(cuda, device);
    bool some_family_runs_it = false;
    for (const KernelRecord* record : kernel_records()) {
      const SupportInfo forced = query_support_on(cuda, device, record->id);
      if (reads_extra_source(*record)) {
        some_family_runs_it |= forced.supported;
        continue;
      }
      EXPECT_FALSE(forced.supported) << record->family;
      EXPECT_EQ(forced.why_not, no_extra_source(*record));
      if (!info.supported) {
        EXPECT_TRUE(contains(info.why_not, no_extra_source(*record))) << info.why_not;
      }
    }
    EXPECT_EQ(info.supported, some_family_runs_it) << info.kernel << info.why_not;
    if (info.family == "sm90") {
      EXPECT_EQ(info.kernel, "sm90_wgmma_layer");
    }
    // Forced, the sm90 family runs it on the H200 with its layer kernel (the cache rows of both
    // sources are 16-byte aligned and contiguous here).
    const SupportInfo sm90 = query_support_on(cuda, device, KernelId::kSm90Wgmma);
    if (device.cc_major == 9 && sm90_kernel_built()) {
      EXPECT_TRUE(sm90.supported) << sm90.why_not;
      EXPECT_EQ(sm90.kernel, "sm90_wgmma_layer");
    } else {
      EXPECT_FALSE(sm90.supported) << sm90.kernel;
    }
  }
}

TEST(QuerySupport, DecodeShapeDescribesTheExtraSource) {
  ProblemShape s = with_extra_source(deepseek_like(16, 512));
  s.extra->kv_token_pad = 72;  // 584-byte rows: 8-byte aligned
  s.extra->kv_block_pad = 8;
  HostProblem p(s, 13);
  const DecodeArgs a = args_for(p, Backend::kCuda);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(a.extra.kv_cache) % 16, 0u);
  const DecodeShape described = decode_shape(make_params(a));
  EXPECT_TRUE(described.has_extra);
  EXPECT_EQ(described.extra_max_entries, 6);
  EXPECT_EQ(described.extra_kv_row_alignment, 8);
  EXPECT_EQ(described.extra_kv_last_row_offset, 2 * a.extra.stride_kv_block + 1 * a.extra.stride_kv_token);
  EXPECT_EQ(described.kv_row_alignment, 16);  // the window's own, untouched
  EXPECT_EQ(described.window_size, 4);

  DecodeArgs odd = a;  // a 2-byte aligned extra cache fails the shared check before any family
  odd.extra.kv_cache = static_cast<const uint8_t*>(a.extra.kv_cache) + 2;
  EXPECT_EQ(decode_shape(make_params(odd)).extra_kv_row_alignment, 2);
  EXPECT_TRUE(contains(query_support_on(odd, kH200).why_not, "got alignment 2")) << query_support_on(odd, kH200).why_not;

  DecodeArgs none = a;
  none.extra.kv_cache = nullptr;
  const DecodeShape window_only = decode_shape(make_params(none));
  EXPECT_FALSE(window_only.has_extra);
  EXPECT_EQ(window_only.extra_max_entries, 0);
  EXPECT_EQ(window_only.extra_kv_row_alignment, 0);
  EXPECT_EQ(window_only.extra_kv_last_row_offset, 0);
}

// The sm90 family reads kModel1 rows: a window alone on its window kernel, as seed rows (issue 12:
// each format at the same ratio to its own floor), and beside an extra source on its layer kernel.
TEST(QuerySupport, Model1SourcesRunOnTheSm90Family) {
  for (const bool has_extra : {false, true}) {
    for (const bool extra_model1 : {false, true}) {
      if (extra_model1 && !has_extra) continue;
      ProblemShape s = deepseek_like(128, 512);
      if (has_extra) s = with_extra_source(s);
      (extra_model1 ? s.extra->format : s.kv_format) = KvFormat::kModel1;
      HostProblem p(s, 17);
      const std::string field = extra_model1 ? "extra.format" : "kv_format";
      DecodeShape described = decode_shape(make_params(args_for(p, Backend::kCuda)));
      EXPECT_EQ(described.window_format, extra_model1 ? KvFormat::kE4m3 : KvFormat::kModel1);
      EXPECT_EQ(model1_source(described), field);
      if (!sm90_kernel_built()) continue;
      const std::string kernel = has_extra ? "sm90_wgmma_layer" : "sm90_wgmma";
      EXPECT_EQ(kSm90Record.why_not(described, kH200), "") << field;
      const LaunchPlan plan = kSm90Record.plan(described, kH200);
      EXPECT_EQ(plan.name, kernel) << field;
      const Sm90Launch* config = std::get_if<Sm90Launch>(&plan.config);
      ASSERT_NE(config, nullptr) << field;
      EXPECT_EQ(config->layer, has_extra) << field;
      const SupportInfo forced = query_support_on(args_for(p, Backend::kCuda), kH200, KernelId::kSm90Wgmma);
      EXPECT_TRUE(forced.supported) << field << ": " << forced.why_not;
      EXPECT_EQ(forced.kernel, kernel) << field;
      // Enough tokens for the H200 to prefer the sm90 family (kMinTokens, sm90_record.cpp): the free
      // choice runs the same kernel.
      described.num_tokens = 2048;
      const KernelChoice choice = select_kernel(described, kH200);
      EXPECT_EQ(choice.kernel, &kSm90Record) << field << ": " << choice.why_not;
      EXPECT_EQ(choice.plan.name, kernel) << field;
    }
  }
}

// kModel1 rows (docs/semantics.md, "Row formats") run on the portable kernel in either source or
// both: decode_shape carries each source's format, the portable family takes every combination on
// Hopper and Ampere, forced or by free choice, and the CPU backend runs them too. (A family that
// does not read kModel1 says why in its why_not; which families do is theirs to say.)
TEST(QuerySupport, Model1SourcesRunOnThePortableKernel) {
  struct Formats {
    bool window_model1;
    std::optional<KvFormat> extra;  // none: no extra source
  };
  for (const Formats f : {Formats{true, std::nullopt}, Formats{true, KvFormat::kModel1}, Formats{true, KvFormat::kE4m3},
                          Formats{false, KvFormat::kModel1}}) {
    ProblemShape s = deepseek_like(128, 512);
    if (f.extra) s = with_extra_source(s);
    if (f.window_model1) s.kv_format = KvFormat::kModel1;
    if (f.extra) s.extra->format = *f.extra;
    HostProblem p(s, 17);
    const DecodeArgs cuda = args_for(p, Backend::kCuda);
    const std::string label = std::string("window ") + (f.window_model1 ? "model1" : "e4m3") + ", extra " +
                              (f.extra ? (*f.extra == KvFormat::kModel1 ? "model1" : "e4m3") : "none");
    const DecodeShape described = decode_shape(make_params(cuda));
    EXPECT_EQ(described.window_format, f.window_model1 ? KvFormat::kModel1 : KvFormat::kE4m3) << label;
    EXPECT_EQ(described.extra_format, f.extra.value_or(KvFormat::kE4m3)) << label;
    EXPECT_EQ(model1_source(described), f.window_model1 ? "kv_format" : "extra.format") << label;
    for (const DeviceInfo& device : {kH200, kA100}) {
      EXPECT_EQ(kPortableRecord.why_not(described, device), "") << label;
      const SupportInfo forced = query_support_on(cuda, device, KernelId::kPortableMma);
      EXPECT_TRUE(forced.supported) << label << ": " << forced.why_not;
      EXPECT_EQ(forced.family, "portable") << label;
      const SupportInfo free_choice = query_support_on(cuda, device);
      EXPECT_TRUE(free_choice.supported) << label << ": " << free_choice.why_not;
    }
    EXPECT_TRUE(query_support(args_for(p, Backend::kCpu)).supported) << label;
  }
  DecodeShape no_extra = shape(128, 128);  // extra_format means nothing without an extra source
  no_extra.extra_format = KvFormat::kModel1;
  EXPECT_EQ(model1_source(no_extra), nullptr);
  EXPECT_NE(select_kernel(no_extra, kH200).kernel, nullptr);
}

// `s` with its window (and its extra source, if any) in kModel1 rows.
DecodeShape in_model1(DecodeShape s, bool window, bool extra) {
  if (window) s.window_format = KvFormat::kModel1;
  if (extra) s.extra_format = KvFormat::kModel1;
  return s;
}

// The portable kernel copies kModel1 rows 16 bytes at a time and numbers their blocks in 32 bits
// (portable_record.cpp): a kModel1 cache less aligned, or whose last row starts 2^32 * 1152 bytes
// or more from it, is refused naming the source; the other source's own rules are unchanged.
TEST(SelectKernel, PortableModel1RowsNeedA16ByteAlignedCache) {
  const auto portable = [](const DecodeShape& s) { return select_kernel(s, kH200, KernelId::kPortableMma); };
  for (const int32_t alignment : {4, 8}) {
    const KernelChoice window = portable(in_model1(shape(512, 128, 512, 128, alignment), true, false));
    EXPECT_EQ(window.id(), KernelId::kNone);
    EXPECT_EQ(window.why_not, "the portable kernel copies kModel1 rows 16 bytes at a time: kv_cache must be 16-byte "
                              "aligned, got alignment " + std::to_string(alignment));
    const KernelChoice extra = portable(in_model1(with_extra(shape(512, 128), 512, alignment), false, true));
    EXPECT_EQ(extra.id(), KernelId::kNone);
    EXPECT_EQ(extra.why_not, "the portable kernel copies kModel1 rows 16 bytes at a time: extra.kv_cache must be "
                             "16-byte aligned, got alignment " + std::to_string(alignment));
    // A kE4m3 source keeps the 4-byte rule beside a kModel1 one.
    EXPECT_EQ(portable(in_model1(with_extra(shape(512, 128, 512, 128, alignment)), false, true)).id(),
              KernelId::kPortableMma);
    EXPECT_EQ(portable(in_model1(with_extra(shape(512, 128), 512, alignment), true, false)).id(), KernelId::kPortableMma);
  }
  constexpr int64_t kLimit = (int64_t{1} << 32) * 1152;
  DecodeShape far = in_model1(with_extra(shape(512, 128)), true, true);
  far.kv_last_row_offset = kLimit - 576;
  far.extra_kv_last_row_offset = kLimit - 576;
  EXPECT_EQ(portable(far).id(), KernelId::kPortableMma);
  far.extra_kv_last_row_offset = kLimit;
  EXPECT_EQ(portable(far).why_not, "the portable kernel numbers kModel1 blocks in 32 bits: the last row must start "
                                   "below " + std::to_string(kLimit) + " bytes from extra.kv_cache, got " +
                                       std::to_string(kLimit));
  far.kv_last_row_offset = kLimit;
  EXPECT_TRUE(contains(portable(far).why_not, "bytes from kv_cache, got")) << portable(far).why_not;
  DecodeShape seed_window = in_model1(with_extra(shape(512, 128)), false, true);
  seed_window.kv_last_row_offset = kLimit;  // a kE4m3 window that far is not a kModel1 rule's concern
  EXPECT_EQ(portable(seed_window).id(), KernelId::kPortableMma) << portable(seed_window).why_not;
}

// kModel1 stages are 32 x 584 bytes and list no inv_scale (portable_plan.h): on the H200 every
// layer the engines run (both sources in kModel1, or a kModel1 window alone) keeps the seed
// format's stages and two CTAs per SM, at one and two head groups; a layer with one source of each
// format runs one group a CTA (two copies of the tile loop spill at two groups).
TEST(SelectKernel, PortableModel1PlansKeepTheSeedStagesAndTwoCtasPerSm) {
  const auto plan_of = [](const DecodeShape& s) { return select_kernel(s, kH200, KernelId::kPortableMma); };
  const portable::SourceFormats both{.window_model1 = true, .extra_model1 = true};
  for (const int64_t heads : {16, 128}) {
    const KernelChoice seed = plan_of(with_extra(shape(512, heads), 1024));
    const KernelChoice model1 = plan_of(in_model1(with_extra(shape(512, heads), 1024), true, true));
    ASSERT_EQ(model1.id(), KernelId::kPortableMma) << model1.why_not;
    EXPECT_EQ(model1.plan.head_groups_per_cta, seed.plan.head_groups_per_cta) << heads;
    EXPECT_EQ(portable_of(model1).num_stages, portable_of(seed).num_stages) << heads;
    EXPECT_LE(portable::ring_plan(model1.plan.head_groups_per_cta, portable_of(model1).num_stages,
                                  portable::list_shape(128, true, both))
                  .total_bytes,
              portable::two_ctas_per_sm_budget(kH200.smem_optin_bytes))
        << heads;
    const KernelChoice window_only = plan_of(in_model1(shape(512, heads), true, false));
    EXPECT_EQ(window_only.plan.head_groups_per_cta, plan_of(shape(512, heads)).plan.head_groups_per_cta) << heads;
    EXPECT_EQ(portable_of(window_only).num_stages, portable_of(plan_of(shape(512, heads))).num_stages) << heads;
  }
  EXPECT_EQ(plan_of(in_model1(with_extra(shape(512, 128)), true, true)).plan.head_groups_per_cta, 2);
  EXPECT_EQ(plan_of(in_model1(with_extra(shape(512, 128)), true, false)).plan.head_groups_per_cta, 1);
  EXPECT_EQ(plan_of(in_model1(with_extra(shape(512, 128)), false, true)).plan.head_groups_per_cta, 1);
  // A kModel1 stage is the seed's 16 KiB and 2,304 bytes of RoPE tails and scale rows.
  EXPECT_EQ(portable::list_shape(128, true, both).stage_bytes, 18688);
  EXPECT_EQ(portable::list_shape(128, true, both).scale_entries, 0);
  EXPECT_EQ(portable::list_shape(128, true, {.window_model1 = false, .extra_model1 = true}).scale_entries, 128);
  EXPECT_EQ(portable::list_shape(128, true, {.window_model1 = true, .extra_model1 = false}).scale_entries,
            portable::kExtraChunkColumns);
  EXPECT_EQ(portable::list_shape(100, false).scale_entries, 100);
  EXPECT_EQ(portable::list_shape(100, false).stage_bytes, portable::kStageBytes);
}

TEST(QuerySupport, CudaShapesAgainstADescribedDevice) {
  HostProblem good(deepseek_like(128, 512), 2);
  const SupportInfo info = query_support_on(args_for(good, Backend::kCuda), kH200);
  EXPECT_TRUE(info.supported) << info.why_not;
  const KernelChoice choice = select_kernel(shape(2, 128, 512, 4), kH200);
  EXPECT_EQ(info.kernel, choice.plan.name);
  EXPECT_EQ(info.head_groups_per_cta, choice.plan.head_groups_per_cta);
  ASSERT_NE(choice.kernel, nullptr);
  EXPECT_EQ(info.family, choice.kernel->family);

  const SupportInfo old_gpu = query_support_on(args_for(good, Backend::kCuda), kT4);
  EXPECT_FALSE(old_gpu.supported);
  EXPECT_TRUE(contains(old_gpu.why_not, "7.5")) << old_gpu.why_not;
  EXPECT_TRUE(old_gpu.kernel.empty());

  HostProblem wide(deepseek_like(16, 256), 3);
  const SupportInfo dim256 = query_support_on(args_for(wide, Backend::kCuda), kH200);
  EXPECT_FALSE(dim256.supported);
  EXPECT_TRUE(contains(dim256.why_not, "head_dim")) << dim256.why_not;
  EXPECT_TRUE(query_support_on(args_for(wide, Backend::kCpu), kH200).supported);

  HostProblem many_heads(deepseek_like(129, 512), 4);
  const SupportInfo h129 = query_support_on(args_for(many_heads, Backend::kCuda), kH200);
  EXPECT_FALSE(h129.supported);
  EXPECT_TRUE(contains(h129.why_not, "num_heads")) << h129.why_not;
  EXPECT_TRUE(contains(h129.why_not, "129")) << h129.why_not;

  DecodeArgs window = args_for(good, Backend::kCuda);
  window.window_size = 2048;
  window.index_cols = 2048;
  const SupportInfo w2048 = query_support_on(window, kH200);
  EXPECT_FALSE(w2048.supported);
  EXPECT_TRUE(contains(w2048.why_not, "window_size must be in [1, 1024], got 2048")) << w2048.why_not;
}

TEST(QuerySupport, ForcedFamilyAnswersWithItsOwnKernelOrWhyNot) {
  // What a GPU test forcing SWA_DECODE_TEST_KERNEL reads to run a case or to skip it with why_not.
  HostProblem p(deepseek_like(128, 512), 10);
  const DecodeArgs cuda = args_for(p, Backend::kCuda);
  for (const KernelRecord* record : kernel_records()) {
    for (const DeviceInfo& device : {kH200, kA100}) {
      const SupportInfo info = query_support_on(cuda, device, record->id);
      const KernelChoice forced = select_kernel(decode_shape(make_params(cuda)), device, record->id);
      EXPECT_EQ(info.supported, forced.kernel != nullptr) << record->family;
      if (info.supported) {
        EXPECT_EQ(info.family, record->family);
        EXPECT_EQ(info.kernel, forced.plan.name);
        EXPECT_TRUE(info.why_not.empty()) << info.why_not;
      } else {
        EXPECT_TRUE(info.kernel.empty()) << info.kernel;
        EXPECT_TRUE(info.family.empty()) << info.family;
        EXPECT_EQ(info.why_not, forced.why_not);
        EXPECT_FALSE(info.why_not.empty());
      }
    }
  }
  // The sm90 kernel never runs on an A100; the answer is its own reason, not the portable kernel.
  const SupportInfo sm90_on_a100 = query_support_on(cuda, kA100, KernelId::kSm90Wgmma);
  EXPECT_FALSE(sm90_on_a100.supported);
  EXPECT_TRUE(contains(sm90_on_a100.why_not, sm90_kernel_built() ? "compute capability 9.0" : "no sm_90a kernel"))
      << sm90_on_a100.why_not;
  const SupportInfo portable_on_h200 = query_support_on(cuda, kH200, KernelId::kPortableMma);
  EXPECT_TRUE(portable_on_h200.supported) << portable_on_h200.why_not;
  EXPECT_EQ(portable_on_h200.family, "portable");
  // A forced family needs the CUDA backend.
  const SupportInfo on_cpu = query_support_on(args_for(p, Backend::kCpu), kH200, KernelId::kPortableMma);
  EXPECT_FALSE(on_cpu.supported);
  EXPECT_TRUE(contains(on_cpu.why_not, "backend must be kCuda")) << on_cpu.why_not;
}

TEST(QuerySupport, AlignmentOfRowsReachesTheSelection) {
  // A 584-byte cache row (8-byte aligned) must run; q rows of 513 elements cannot be read 16 bytes
  // at a time, and a size-1 dimension's stride never counts.
  ProblemShape s = deepseek_like(16, 512);
  s.kv_token_pad = 72;
  HostProblem padded(s, 7);
  const DecodeArgs padded_args = args_for(padded, Backend::kCuda);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(padded_args.kv_cache) % 16, 0u);
  EXPECT_EQ(decode_shape(make_params(padded_args)).kv_row_alignment, 8);
  // The last row of the last block: (num_blocks - 1) block strides + (block_size - 1) row strides.
  EXPECT_EQ(decode_shape(make_params(padded_args)).kv_last_row_offset,
            (padded_args.num_blocks - 1) * padded_args.stride_kv_block +
                (padded_args.block_size - 1) * padded_args.stride_kv_token);
  EXPECT_TRUE(query_support_on(padded_args, kH200).supported) << query_support_on(padded_args, kH200).why_not;

  s = deepseek_like(16, 512);
  s.q_head_pad = 1;
  HostProblem odd(s, 8);
  const DecodeArgs odd_args = args_for(odd, Backend::kCuda);
  EXPECT_FALSE(decode_shape(make_params(odd_args)).q_out_aligned_16);
  const SupportInfo info = query_support_on(odd_args, kH200);
  EXPECT_FALSE(info.supported);
  EXPECT_TRUE(contains(info.why_not, "16 bytes")) << info.why_not;
  EXPECT_TRUE(query_support_on(args_for(odd, Backend::kCpu), kH200).supported);

  s = deepseek_like(1, 512);
  s.num_tokens = 1;
  HostProblem single(s, 9);
  DecodeArgs single_args = args_for(single, Backend::kCuda);
  single_args.stride_q_token = 3;
  single_args.stride_q_head = 5;
  EXPECT_TRUE(decode_shape(make_params(single_args)).q_out_aligned_16);
}

TEST(QuerySupport, InvalidArgumentsAreNotSupportedWithTheValidationMessage) {
  HostProblem p(deepseek_like(8, 512), 5);
  DecodeArgs a = args_for(p, Backend::kCpu);
  a.q = nullptr;
  const SupportInfo info = query_support(a);
  EXPECT_FALSE(info.supported);
  EXPECT_TRUE(contains(info.why_not, "q must be non-null")) << info.why_not;
}

TEST(QuerySupport, CurrentDeviceAnswersEitherWay) {
  // Without a GPU the answer names the failed CUDA call; with one it names a kernel.
  HostProblem p(deepseek_like(64, 512), 6);
  const SupportInfo info = query_support(args_for(p, Backend::kCuda));
  if (info.supported) {
    EXPECT_FALSE(info.kernel.empty());
  } else {
    EXPECT_FALSE(info.why_not.empty());
  }
}

// CUDA's rules for which code a device loads: SASS of its major at or below it, PTX at or below it
// (JIT-compiled), arch-specific targets on their own compute capability alone, family targets
// within their major.
TEST(BuiltTargets, ADeviceRunsTheCodeCudaLoadsForIt) {
  using Scope = BuiltTarget::Scope;
  const BuiltTarget plain90{.cc = 90, .sass = true, .ptx = true, .scope = Scope::kAny};
  const BuiltTarget real80{.cc = 80, .sass = true, .ptx = false, .scope = Scope::kAny};
  const BuiltTarget virtual80{.cc = 80, .sass = false, .ptx = true, .scope = Scope::kAny};
  const BuiltTarget arch90a{.cc = 90, .sass = true, .ptx = true, .scope = Scope::kArch};
  const BuiltTarget family100f{.cc = 100, .sass = true, .ptx = true, .scope = Scope::kFamily};
  EXPECT_TRUE(target_runs_on(plain90, 90));
  EXPECT_TRUE(target_runs_on(plain90, 100));   // PTX
  EXPECT_FALSE(target_runs_on(plain90, 80));
  EXPECT_FALSE(target_runs_on(plain90, 89));
  EXPECT_TRUE(target_runs_on(real80, 86));     // SASS within its major
  EXPECT_FALSE(target_runs_on(real80, 90));    // no PTX to compile
  EXPECT_TRUE(target_runs_on(virtual80, 120));
  EXPECT_FALSE(target_runs_on(virtual80, 75));
  EXPECT_TRUE(target_runs_on(arch90a, 90));
  EXPECT_FALSE(target_runs_on(arch90a, 100));
  EXPECT_TRUE(target_runs_on(family100f, 103));
  EXPECT_FALSE(target_runs_on(family100f, 120));
}

// A device the shared checks accept but the build has no portable code for is refused with the
// targets named; the other families (sm_90a alone) and builds whose targets are unknown pass.
TEST(BuiltTargets, TheSelectionSaysWhichTargetsTheBuildHas) {
  using Scope = BuiltTarget::Scope;
  const KernelRecord& portable = *find_kernel(KernelId::kPortableMma);
  const std::vector<BuiltTarget> only90 = {{.cc = 90, .sass = true, .ptx = true, .scope = Scope::kAny}};
  const std::string why = build_why_not(portable, kA100, only90);
  EXPECT_TRUE(contains(why, "this build has no code for compute capability 8.0")) << why;
  EXPECT_TRUE(contains(why, "built for 90 (CMake's SWA_DECODE_PORTABLE_ARCHS)")) << why;
  EXPECT_EQ(build_why_not(portable, kH200, only90), "");
  EXPECT_EQ(build_why_not(portable, kA100, {}), "");
  EXPECT_EQ(build_why_not(*find_kernel(KernelId::kSm90Wgmma), kA100, only90), "");
  const std::vector<BuiltTarget> real_only = {{.cc = 80, .sass = true, .ptx = false, .scope = Scope::kAny},
                                              {.cc = 90, .sass = false, .ptx = true, .scope = Scope::kArch}};
  const std::string both = build_why_not(portable, DeviceInfo{.cc_major = 12, .cc_minor = 0, .num_sms = 1, .smem_optin_bytes = 1},
                                           real_only);
  EXPECT_TRUE(contains(both, "built for 80-real, 90a-virtual")) << both;
}

// This build lists its targets, and every build of the project covers the H200 (sm_90 is always a
// target: scripts/test.sh and the wheel build it alone).
TEST(BuiltTargets, ThisBuildListsItsTargetsAndRunsOnSm90) {
  EXPECT_FALSE(portable_targets().empty());
  EXPECT_EQ(build_why_not(*find_kernel(KernelId::kPortableMma), kH200), "");
}

TEST(Version, IsSemantic) { EXPECT_STREQ(version(), "0.1.0"); }

}  // namespace
}  // namespace swa_decode
