// The sm90 kernels' shared-memory layouts for every base CUDA may hand them. Dynamic shared memory
// is only promised 16-byte alignment; the swizzled tiles need 1024. The kernel used to trap (and so
// kill the caller's context) unless the base was 1024-aligned; now smem_layout places the plan and
// the barriers for any 16-aligned base, and this test checks every member for every such base, for
// the window kernel (SmemPlan, SmemSync) and the layer kernel (LayerSmemPlan, LayerSmemSync).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/kernels/sm90/sm90_layer_plan.h"
#include "src/kernels/sm90/sm90_plan.h"

namespace swa_decode::sm90 {
namespace {

struct Region {
  std::string name;
  uint64_t begin;  // bytes from the dynamic shared-memory base
  uint64_t bytes;
  uint64_t align;  // what the shared-state-space address must be a multiple of
};

// The members both kernels' plans (SmemPlan, LayerSmemPlan) and barrier blocks (SmemSync,
// LayerSmemSync) have, under `layout`; the tiles split into the pieces one wgmma descriptor
// starts at.
template <typename Plan, typename Sync>
std::vector<Region> shared_member_regions(const SmemLayout& layout) {
  const uint64_t plan = layout.plan_offset;
  const uint64_t sync = layout.sync_offset;
  std::vector<Region> regions;
  // 128-byte swizzle atoms are 1024 B; TMA's SW128 writes and the descriptors (base offset 0) need
  // each to start 1024-aligned.
  // The window kernel's tile is [half][block] (8 blocks of 128 keys), the layer kernel's ring
  // [stage][block] (16 blocks of 64 keys).
  constexpr uint64_t kBlocks = sizeof(Plan::kv) / sizeof(Plan::kv[0][0]);
  constexpr uint64_t kBlocksPerOuter = sizeof(Plan::kv[0]) / sizeof(Plan::kv[0][0]);
  for (uint64_t index = 0; index < kBlocks; ++index) {
    regions.push_back({"kv[" + std::to_string(index / kBlocksPerOuter) + "][" + std::to_string(index % kBlocksPerOuter) + "]",
                       plan + offsetof(Plan, kv) + index * sizeof(Plan::kv[0][0]), sizeof(Plan::kv[0][0]), 1024});
  }
  // staging: 16-byte cp.async destinations, its XOR swizzle laid out for 128-byte bank rows.
  regions.push_back({"staging", plan + offsetof(Plan, staging), sizeof(Plan::staging), 128});
  regions.push_back({"row_offset", plan + offsetof(Plan, row_offset), sizeof(Plan::row_offset), 4});
  regions.push_back({"inv_scale", plan + offsetof(Plan, inv_scale), sizeof(Plan::inv_scale), 4});
  regions.push_back({"warp_counts", sync + offsetof(Sync, warp_counts), sizeof(Sync::warp_counts), 4});
  // mbarrier objects are 8 bytes, 8-aligned.
  regions.push_back({"q_full", sync + offsetof(Sync, q_full), sizeof(Sync::q_full), 8});
  regions.push_back({"kv_full", sync + offsetof(Sync, kv_full), sizeof(Sync::kv_full), 8});
  regions.push_back({"kv_empty", sync + offsetof(Sync, kv_empty), sizeof(Sync::kv_empty), 8});
  regions.push_back({"meta_full", sync + offsetof(Sync, meta_full), sizeof(Sync::meta_full), 8});
  regions.push_back({"meta_empty", sync + offsetof(Sync, meta_empty), sizeof(Sync::meta_empty), 8});
  return regions;
}

// Every member of SmemPlan and SmemSync under `layout`, the q ring split into its TMA boxes: all
// disjoint, together the whole of both blocks.
std::vector<Region> member_regions(const SmemLayout& layout) {
  std::vector<Region> regions = shared_member_regions<SmemPlan, SmemSync>(layout);
  for (int consumer = 0; consumer < 2; ++consumer) {
    for (int stage = 0; stage < kQStages; ++stage) {
      const uint64_t index = static_cast<uint64_t>(consumer * kQStages + stage);
      regions.push_back({"q[" + std::to_string(consumer) + "][" + std::to_string(stage) + "]",
                         layout.plan_offset + offsetof(SmemPlan, q) + index * sizeof(SmemPlan::q[0][0]),
                         sizeof(SmemPlan::q[0][0]), 1024});
    }
  }
  regions.push_back({"num_valid", layout.sync_offset + offsetof(SmemSync, num_valid), sizeof(SmemSync::num_valid), 4});
  return regions;
}

// The same for LayerSmemPlan and LayerSmemSync: the item's q in its 8 TMA boxes, the tile records,
// and q's empty barriers.
std::vector<Region> layer_member_regions(const SmemLayout& layout) {
  std::vector<Region> regions = shared_member_regions<LayerSmemPlan, LayerSmemSync>(layout);
  for (int chunk = 0; chunk < kQChunks; ++chunk) {
    regions.push_back({"q[" + std::to_string(chunk) + "]",
                       layout.plan_offset + offsetof(LayerSmemPlan, q) + chunk * sizeof(LayerSmemPlan::q[0]),
                       sizeof(LayerSmemPlan::q[0]), 1024});
  }
  regions.push_back({"record", layout.sync_offset + offsetof(LayerSmemSync, record), sizeof(LayerSmemSync::record), 4});
  regions.push_back({"q_empty", layout.sync_offset + offsetof(LayerSmemSync, q_empty), sizeof(LayerSmemSync::q_empty), 8});
  regions.push_back({"staged_full", layout.sync_offset + offsetof(LayerSmemSync, staged_full),
                     sizeof(LayerSmemSync::staged_full), 8});
  regions.push_back({"staged_empty", layout.sync_offset + offsetof(LayerSmemSync, staged_empty),
                     sizeof(LayerSmemSync::staged_empty), 8});
  return regions;
}

// What is wrong with `regions` (laid out by `layout`) for a base at `residue` modulo 1024:
// misaligned members, members past the smem_bytes the launch asks for or past layout.end,
// overlapping members. Empty if nothing.
std::vector<std::string> region_problems(uint32_t residue, const SmemLayout& layout, const std::vector<Region>& regions,
                                         int smem_bytes) {
  std::vector<std::string> problems;
  for (const Region& r : regions) {
    if ((residue + r.begin) % r.align != 0) {
      problems.push_back(r.name + " at base + " + std::to_string(r.begin) + " is not " + std::to_string(r.align) +
                         "-aligned");
    }
    if (r.begin + r.bytes > static_cast<uint64_t>(smem_bytes)) {
      problems.push_back(r.name + " ends at base + " + std::to_string(r.begin + r.bytes) + ", past kSmemBytes = " +
                         std::to_string(smem_bytes));
    }
    if (r.begin + r.bytes > layout.end) {
      problems.push_back(r.name + " ends at base + " + std::to_string(r.begin + r.bytes) + ", past layout.end = " +
                         std::to_string(layout.end));
    }
  }
  for (size_t i = 0; i < regions.size(); ++i) {
    for (size_t j = i + 1; j < regions.size(); ++j) {
      const Region& a = regions[i];
      const Region& b = regions[j];
      if (a.begin < b.begin + b.bytes && b.begin < a.begin + a.bytes) {
        problems.push_back(a.name + " [" + std::to_string(a.begin) + ", " + std::to_string(a.begin + a.bytes) +
                           ") overlaps " + b.name + " [" + std::to_string(b.begin) + ", " +
                           std::to_string(b.begin + b.bytes) + ")");
      }
    }
  }
  return problems;
}

// region_problems of the window kernel's plan.
std::vector<std::string> layout_problems(uint32_t residue, const SmemLayout& layout) {
  return region_problems(residue, layout, member_regions(layout), kSmemBytes);
}

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

TEST(Sm90SmemLayout, EverySixteenAlignedBaseFits) {
  int residues = 0;
  for (uint32_t residue = 0; residue < kSwizzleAtomBytes; residue += kDynamicSmemAlign, ++residues) {
    const std::vector<std::string> problems = layout_problems(residue, smem_layout(residue));
    EXPECT_TRUE(problems.empty()) << "base address = " << residue << " mod 1024:\n" << joined(problems);
  }
  EXPECT_EQ(residues, 64);
}

TEST(Sm90SmemLayout, RegionsCoverBothBlocks) {
  // A member added to SmemPlan or SmemSync but not to member_regions would go unchecked.
  uint64_t plan_bytes = 0;
  uint64_t sync_bytes = 0;
  const SmemLayout apart{0, 1u << 20, 1u << 21};  // any layout with the blocks apart
  for (const Region& r : member_regions(apart)) (r.begin < apart.sync_offset ? plan_bytes : sync_bytes) += r.bytes;
  EXPECT_EQ(plan_bytes, sizeof(SmemPlan));
  EXPECT_LT(sizeof(SmemSync) - sync_bytes, alignof(SmemSync)) << "only padding may be left out";
}

TEST(Sm90SmemLayout, FitsSm90AndWastesNothingOnAnAlignedBase) {
  EXPECT_LE(kSmemBytes, 227 * 1024) << "sm_90's opt-in shared memory per block";
  const SmemLayout aligned = smem_layout(0);
  EXPECT_EQ(aligned.plan_offset, 0u);
  EXPECT_EQ(aligned.sync_offset, sizeof(SmemPlan));
  // A base 16 bytes past a 1024 boundary needs the most: 1008 bytes of gap, the barriers inside it.
  const SmemLayout worst = smem_layout(16);
  EXPECT_EQ(worst.plan_offset, 1008u);
  EXPECT_EQ(worst.sync_offset, 0u);
  EXPECT_EQ(worst.end, static_cast<uint32_t>(kSmemBytes));
  // A gap smaller than SmemSync puts the barriers after the plan.
  const SmemLayout small_gap = smem_layout(1024 - 128);
  EXPECT_EQ(small_gap.plan_offset, 128u);
  EXPECT_EQ(small_gap.sync_offset, 128u + sizeof(SmemPlan));
}

TEST(Sm90SmemLayout, CheckerRejectsLayoutsThatAssumeAnAlignedBase) {
  // The layout before this fix: the plan at the base, the barriers right after it. On a base 16
  // bytes past a 1024 boundary every swizzled tile is misaligned.
  const SmemLayout at_base{0, static_cast<uint32_t>(sizeof(SmemPlan)),
                           static_cast<uint32_t>(sizeof(SmemPlan) + sizeof(SmemSync))};
  EXPECT_TRUE(layout_problems(0, at_base).empty());
  const std::vector<std::string> misaligned = layout_problems(16, at_base);
  EXPECT_EQ(misaligned.size(), 17u) << joined(misaligned);  // 8 kv blocks, 8 q stages, staging
  // The barriers in a gap too small for them overlap the plan.
  const SmemLayout cramped{16, 0, 16 + static_cast<uint32_t>(sizeof(SmemPlan))};
  const std::vector<std::string> overlapping = layout_problems(1008, cramped);
  EXPECT_FALSE(overlapping.empty());
  EXPECT_NE(joined(overlapping).find("overlaps"), std::string::npos) << joined(overlapping);
  // The plan pushed past what the launch asks for.
  const SmemLayout too_far{1024, 0, 1024 + static_cast<uint32_t>(sizeof(SmemPlan))};
  EXPECT_NE(joined(layout_problems(0, too_far)).find("past kSmemBytes"), std::string::npos);
}

TEST(Sm90LayerSmemLayout, EverySixteenAlignedBaseFits) {
  int residues = 0;
  for (uint32_t residue = 0; residue < kSwizzleAtomBytes; residue += kDynamicSmemAlign, ++residues) {
    const SmemLayout layout = smem_layout_of<LayerSmemPlan, LayerSmemSync>(residue);
    const std::vector<std::string> problems =
        region_problems(residue, layout, layer_member_regions(layout), kLayerSmemBytes);
    EXPECT_TRUE(problems.empty()) << "base address = " << residue << " mod 1024:\n" << joined(problems);
  }
  EXPECT_EQ(residues, 64);
  EXPECT_LE(kLayerSmemBytes, 227 * 1024) << "sm_90's opt-in shared memory per block";
  // Gaps of 144 to 256 B held SmemSync but not the layer kernel's 264 B: those go after the plan.
  const SmemLayout gap_256 = smem_layout_of<LayerSmemPlan, LayerSmemSync>(1024 - 256);
  EXPECT_EQ(gap_256.sync_offset, 256u + sizeof(LayerSmemPlan));
  const SmemLayout gap_272 = smem_layout_of<LayerSmemPlan, LayerSmemSync>(1024 - 272);
  EXPECT_EQ(gap_272.sync_offset, 0u);
  EXPECT_EQ(gap_272.plan_offset, 272u);
}

TEST(Sm90LayerSmemLayout, RegionsCoverBothBlocks) {
  uint64_t plan_bytes = 0;
  uint64_t sync_bytes = 0;
  const SmemLayout apart{0, 1u << 20, 1u << 21};
  for (const Region& r : layer_member_regions(apart)) (r.begin < apart.sync_offset ? plan_bytes : sync_bytes) += r.bytes;
  EXPECT_EQ(plan_bytes, sizeof(LayerSmemPlan));
  EXPECT_LT(sizeof(LayerSmemSync) - sync_bytes, alignof(LayerSmemSync)) << "only padding may be left out";
}

}  // namespace
}  // namespace swa_decode::sm90
