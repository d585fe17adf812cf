// select_kernel (pure) and query_support: supported shapes name a kernel, unsupported ones say why.
#include <gtest/gtest.h>

#include <string>

#include "src/api/decode.h"
#include "src/api/validate.h"
#include "src/dispatch/select_kernel.h"
#include "src/kernels/portable/portable_plan.h"
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

TEST(SelectKernel, DeepSeekShapesRunOnHopperAndAmpere) {
  for (const DeviceInfo& device : {kH200, kA100}) {
    for (int64_t heads : {1, 8, 16, 17, 32, 64, 128}) {
      for (int64_t tokens : {0, 1, 8, 512, 2048}) {
        for (int64_t window : {1, 128, 1024}) {
          const KernelChoice choice = select_kernel(shape(tokens, heads, 512, window), device);
          EXPECT_NE(choice.id, KernelId::kNone) << heads << " heads, " << choice.why_not;
          EXPECT_FALSE(choice.name.empty());
          EXPECT_TRUE(choice.why_not.empty()) << choice.why_not;
          if (choice.id == KernelId::kSm90Wgmma) {
            EXPECT_EQ(choice.persistent_ctas, device.num_sms);
          } else {
            EXPECT_GE(choice.head_groups_per_cta, 1);
            // A CTA never holds more 16-head groups than the problem has.
            EXPECT_LE(choice.head_groups_per_cta, (heads + 15) / 16 > 1 ? (heads + 15) / 16 : 1);
          }
        }
      }
    }
  }
}

TEST(SelectKernel, HopperFastPathWhereItFits) {
  // The sm90 kernel runs H > 16 with the whole window (<= 128) in shared memory and 16-byte rows;
  // everything else, and every non-Hopper device, runs the portable kernel.
  const bool built = sm90_kernel_built();
  EXPECT_EQ(select_kernel(shape(512, 128, 512, 128), kH200).id, built ? KernelId::kSm90Wgmma : KernelId::kPortableMma);
  EXPECT_EQ(select_kernel(shape(512, 64, 512, 100), kH200).id, built ? KernelId::kSm90Wgmma : KernelId::kPortableMma);
  EXPECT_EQ(select_kernel(shape(512, 16, 512, 128), kH200).id, KernelId::kPortableMma);
  EXPECT_EQ(select_kernel(shape(512, 128, 512, 129), kH200).id, KernelId::kPortableMma);
  EXPECT_EQ(select_kernel(shape(512, 128, 512, 128), kA100).id, KernelId::kPortableMma);
  DecodeShape eight_byte_rows = shape(512, 128, 512, 128);
  eight_byte_rows.kv_row_alignment = 8;  // e.g. 584-byte rows
  EXPECT_EQ(select_kernel(eight_byte_rows, kH200).id, KernelId::kPortableMma);

  // Forcing a kernel family answers whether that kernel could run the shape, and why not.
  const KernelChoice forced = select_kernel(shape(512, 128, 512, 128), kA100, KernelId::kSm90Wgmma);
  EXPECT_EQ(forced.id, KernelId::kNone);
  EXPECT_NE(forced.why_not.find(built ? "compute capability 9.0, got 8.0" : "no sm_90a kernel"), std::string::npos)
      << forced.why_not;
  const KernelChoice wide = select_kernel(shape(512, 128, 512, 256), kH200, KernelId::kSm90Wgmma);
  EXPECT_EQ(wide.id, KernelId::kNone);
  if (built) {
    EXPECT_NE(wide.why_not.find("window_size must be <= 128, got 256"), std::string::npos) << wide.why_not;
  }
  EXPECT_EQ(select_kernel(shape(512, 128, 512, 128), kH200, KernelId::kPortableMma).id, KernelId::kPortableMma);
}

TEST(SelectKernel, Sm90NeedsRowsWithin64GiBOfTheCache) {
  // The sm90 kernel keeps row offsets as 32-bit counts of 16 bytes; a larger cache runs portable.
  DecodeShape huge = shape(512, 128, 512, 128);
  huge.kv_last_row_offset = int64_t{1} << 36;
  EXPECT_EQ(select_kernel(huge, kH200).id, KernelId::kPortableMma);
  const KernelChoice forced = select_kernel(huge, kH200, KernelId::kSm90Wgmma);
  EXPECT_EQ(forced.id, KernelId::kNone);
  if (sm90_kernel_built()) {
    EXPECT_TRUE(contains(forced.why_not, "within 64 GiB of kv_cache, got 68719476736 bytes")) << forced.why_not;
    huge.kv_last_row_offset = (int64_t{1} << 36) - 16;  // the last offset that fits
    EXPECT_EQ(select_kernel(huge, kH200).id, KernelId::kSm90Wgmma);
  }
}

TEST(SelectKernel, PortableStagingRingFitsTheDevice) {
  // A 128-entry window is 4 tiles of 32 rows: with room, all of them are in flight at once.
  EXPECT_EQ(select_kernel(shape(512, 128, 512, 128), kA100).num_stages, 4);
  // Never more stages than the window has tiles.
  EXPECT_EQ(select_kernel(shape(512, 128, 512, 64), kA100).num_stages, 2);
  EXPECT_EQ(select_kernel(shape(512, 128, 512, 96), kA100).num_stages, 3);
  // Where two CTAs can share an SM (H200: 2 x 113 KiB), the ring stops at what lets them: at two
  // head groups that is 2 stages, at one group 3.
  const KernelChoice shared = select_kernel(shape(512, 128, 512, 128), kH200, KernelId::kPortableMma);
  EXPECT_EQ(shared.head_groups_per_cta, 2);
  EXPECT_EQ(shared.num_stages, 2);
  EXPECT_LE(portable::ring_plan(2, shared.num_stages, 128).total_bytes,
            portable::two_ctas_per_sm_budget(kH200.smem_optin_bytes));
  EXPECT_EQ(select_kernel(shape(512, 16, 512, 128), kH200, KernelId::kPortableMma).num_stages, 3);
  // A 99 KiB device (sm_86/89/120) still runs the longest window, with the minimum ring and one
  // head group (two would need 16 KiB more for q than it has).
  constexpr DeviceInfo k99KiB{.cc_major = 8, .cc_minor = 9, .num_sms = 128, .smem_optin_bytes = 101376};
  const KernelChoice wide = select_kernel(shape(512, 128, 512, 1024), k99KiB);
  ASSERT_EQ(wide.id, KernelId::kPortableMma);
  EXPECT_EQ(wide.num_stages, portable::kMinStages);
  EXPECT_EQ(wide.head_groups_per_cta, 1);
  EXPECT_LE(portable::ring_plan(wide.head_groups_per_cta, wide.num_stages, 1024).total_bytes, 101376);
  for (const int64_t window : {1, 31, 128, 500, 1024}) {
    for (const DeviceInfo& device : {kH200, kA100, k99KiB}) {
      const KernelChoice choice = select_kernel(shape(2048, 16, 512, window), device, KernelId::kPortableMma);
      ASSERT_EQ(choice.id, KernelId::kPortableMma);
      EXPECT_LE(portable::ring_plan(choice.head_groups_per_cta, choice.num_stages, static_cast<int>(window)).total_bytes,
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
  EXPECT_EQ(portable(1, 128, 128, kH200).window_splits, 4);  // 8 one-group CTAs -> 32
  EXPECT_EQ(portable(1, 128, 128, kH200).name, "portable_mma_g1_split4");
  EXPECT_EQ(portable(8, 16, 128, kH200).window_splits, 4);   // 8 CTAs
  EXPECT_EQ(portable(9, 16, 128, kH200).window_splits, 1);   // 9 CTAs
  EXPECT_EQ(portable(2, 64, 128, kH200).window_splits, 4);
  EXPECT_EQ(portable(8, 128, 128, kH200).window_splits, 1);  // 64 CTAs
  EXPECT_EQ(portable(8, 128, 128, kH200).name, "portable_mma_g1");
  EXPECT_EQ(portable(1, 128, 96, kH200).window_splits, 1);   // fewer than 4 tiles of 32 keys
  EXPECT_EQ(portable(1, 16, 1024, kH200).window_splits, 4);
  // Clusters need sm_90: Ampere never splits.
  for (int64_t tokens : {1, 2, 8}) EXPECT_EQ(portable(tokens, 16, 128, kA100).window_splits, 1);
  for (int64_t tokens : {1, 2, 5, 16, 33, 100, 1000}) {
    for (int64_t heads : {1, 16, 64, 128}) {
      const KernelChoice choice = portable(tokens, heads, 128, kH200);
      const int64_t heads_per_cta = 16 * choice.head_groups_per_cta;
      const int64_t ctas = tokens * ((heads + heads_per_cta - 1) / heads_per_cta);
      EXPECT_TRUE(choice.window_splits == 1 || (choice.window_splits == 4 && ctas * 4 <= kH200.num_sms / 4))
          << tokens << " tokens, " << heads << " heads";
    }
  }
}

TEST(SelectKernel, SelectionIsPure) {
  const KernelChoice a = select_kernel(shape(32, 64), kH200);
  const KernelChoice b = select_kernel(shape(32, 64), kH200);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.head_groups_per_cta, b.head_groups_per_cta);
  EXPECT_EQ(a.window_splits, b.window_splits);
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
    EXPECT_EQ(choice.id, KernelId::kNone);
    for (const std::string& part : c.parts) EXPECT_TRUE(contains(choice.why_not, part)) << choice.why_not;
  }
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
    EXPECT_EQ(info.head_groups_per_cta, 1);
    EXPECT_TRUE(info.why_not.empty());
  }
}

TEST(QuerySupport, CudaShapesAgainstADescribedDevice) {
  HostProblem good(deepseek_like(128, 512), 2);
  const SupportInfo info = query_support_on(args_for(good, Backend::kCuda), kH200);
  EXPECT_TRUE(info.supported) << info.why_not;
  const KernelChoice choice = select_kernel(shape(2, 128, 512, 4), kH200);
  EXPECT_EQ(info.kernel, choice.name);
  EXPECT_EQ(info.head_groups_per_cta, choice.head_groups_per_cta);

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

TEST(Version, IsSemantic) { EXPECT_STREQ(version(), "0.1.0"); }

}  // namespace
}  // namespace swa_decode
