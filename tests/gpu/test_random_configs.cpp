// The random-configuration test of the whole API on the GPU (issue 10): 1000 seeded configurations
// of everything docs/semantics.md allows (testing/random_config.h, gpu_space(); since issue 12 a
// fifth of them with sources in kModel1 rows, which every family is expected to run), each run by the
// free choice (decode) and by every kernel family forced (decode_with_kernel) where
// query_support_for_kernel says that family runs it, on outputs poisoned before every run, and
// every run compared with the float64 reference (check_outputs). Families that skip a
// configuration must say why and write nothing.
//
// It prints "random-configs: ..." lines: per family how many configurations ran and skipped and
// the largest errors, per kernel how many ran, the reference's work; it fails when a family the
// device runs ran fewer configurations than gpu_coverage_minimums() asks. A failure prints the
// seed, the configuration and the line that replays it alone:
//   SWA_DECODE_RANDOM_SEED=<seed> SWA_DECODE_RANDOM_CONFIG=<index> swa_decode_tests --gtest_filter=GpuRandomConfigs.*
// SWA_DECODE_RANDOM_CONFIGS=<count> runs the first <count> (e.g. fewer under compute-sanitizer).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "swa_decode/swa_decode.h"
#include "src/api/decode.h"
#include "src/dispatch/select_kernel.h"
#include "testing/batch.h"
#include "testing/cuda_check.h"
#include "testing/device_batch.h"
#include "testing/device_buffer.h"
#include "testing/random_config.h"

namespace {

namespace st = swa_decode::testing;
using swa_decode::KernelId;

struct Family {
  const char* name;
  KernelId id;            // kNone: the free choice
  const char* kernel_prefix;  // what a forced family's kernel names start with
};
constexpr Family kFamilies[] = {{"free", KernelId::kNone, ""},
                                {"portable", KernelId::kPortableMma, "portable_mma"},
                                {"sm90", KernelId::kSm90Wgmma, "sm90"},
                                {"few_heads", KernelId::kFewHeadsMma, "few_heads"}};

const char* code_name(swa_decode::StatusCode code) {
  switch (code) {
    case swa_decode::StatusCode::kOk: return "kOk";
    case swa_decode::StatusCode::kInvalidArgument: return "kInvalidArgument";
    case swa_decode::StatusCode::kNotSupported: return "kNotSupported";
    case swa_decode::StatusCode::kCudaError: return "kCudaError";
    case swa_decode::StatusCode::kInternal: return "kInternal";
  }
  return "?";
}

// Asks whether `family` runs the arguments, runs it on poisoned outputs either way, and notes any
// disagreement between the answer, the status and what the configuration should get.
st::FamilyRun run_family(const Family& family, const swa_decode::DecodeArgs& args, st::DeviceBatch& device,
                         cudaStream_t stream, bool expected) {
  const swa_decode::SupportInfo support = family.id == KernelId::kNone
                                              ? swa_decode::query_support(args)
                                              : swa_decode::query_support_for_kernel(args, family.id);
  st::poison_outputs(device, stream);
  const swa_decode::Status status =
      family.id == KernelId::kNone ? swa_decode::decode(args) : swa_decode::decode_with_kernel(args, family.id);
  st::FamilyRun run;
  run.outputs = st::download_outputs(device);  // synchronizes the device
  run.ran = support.supported && status.ok();
  run.kernel = support.kernel;
  run.why_not = support.why_not;
  std::string& problem = run.problem;
  if (support.supported != expected) {
    problem += std::string("query_support") + (family.id == KernelId::kNone ? "" : "_for_kernel") + " says " +
               (support.supported ? "it runs (" + support.kernel + ")" : "it does not run (" + support.why_not + ")") +
               ", expected the opposite for this configuration. ";
  }
  if (support.supported && !status.ok()) {
    problem += "query_support named " + support.kernel + " but decode returned " + code_name(status.code) + ": " +
               status.message + ". ";
  }
  if (!support.supported && status.code != swa_decode::StatusCode::kNotSupported) {
    problem += std::string("query_support said not supported but decode returned ") + code_name(status.code) + ". ";
  }
  if (!support.supported && support.why_not.empty()) problem += "not supported without a why_not. ";
  if (support.supported && support.kernel.rfind(family.kernel_prefix, 0) != 0) {
    problem += "forced family " + std::string(family.name) + " ran kernel " + support.kernel + ". ";
  }
  return run;
}

// Whether this device and build run the sm90 kernel at all: asked of the library for a shape the
// kernel is made for (H = 32, W = 128, 16-byte rows), not re-derived from the compute capability.
swa_decode::SupportInfo sm90_on_this_device() {
  st::BatchOptions o;
  o.num_heads = 32;
  o.window_size = 128;
  o.seed = 7;
  const st::HostBatch batch = st::make_batch(o);
  const st::DeviceBatch device = st::upload_batch(batch);
  return swa_decode::query_support_for_kernel(st::device_args(batch, device, 0, batch.num_tokens, nullptr),
                                              KernelId::kSm90Wgmma);
}

class GpuRandomConfigs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!st::cuda_device_available()) GTEST_SKIP() << "no CUDA device: GPU tests skipped";
  }
};

TEST_F(GpuRandomConfigs, EveryKernelFamilyMatchesTheReference) {
  const st::RunPlan plan = st::plan_from_env(st::kGpuRandomConfigs);
  cudaDeviceProp props{};
  int ordinal = 0;
  SWAD_TESTING_CUDA_CHECK(cudaGetDevice(&ordinal));
  SWAD_TESTING_CUDA_CHECK(cudaGetDeviceProperties(&props, ordinal));
  const swa_decode::SupportInfo sm90 = sm90_on_this_device();
  std::printf("random-configs: device=\"%s\" cc=%d.%d sms=%d sm90=%s\n", props.name, props.major, props.minor,
              props.multiProcessorCount, sm90.supported ? "runs" : ("does not run: " + sm90.why_not).c_str());

  st::Stream stream;
  const auto run_families = [&](const st::RandomConfig& config, const st::HostBatch& batch) {
    st::DeviceBatch device = st::upload_batch(batch);
    // The upload runs on the legacy stream (a memset and pageable copies that may still be in
    // flight when they return), the decodes on a non-blocking stream that does not wait for it.
    SWAD_TESTING_CUDA_CHECK(cudaDeviceSynchronize());
    const swa_decode::DecodeArgs args = st::device_args(batch, device, 0, batch.num_tokens, stream.get());
    std::vector<st::FamilyRun> runs;
    for (const Family& family : kFamilies) {
      // The few-heads kernel (sm_90a, as the sm90 kernels) takes the sm90 kernel's shapes (W <= 128,
      // 16-byte rows), a window alone in the seed format.
      const bool few_heads_reads = !batch.extra && batch.format == swa_decode::KvFormat::kE4m3;
      const bool expected = family.id == KernelId::kSm90Wgmma     ? sm90.supported && config.sm90_shaped
                            : family.id == KernelId::kFewHeadsMma ? sm90.supported && config.sm90_shaped && few_heads_reads
                                                                  : config.kernel_aligned;
      runs.push_back(run_family(family, args, device, stream.get(), expected));
    }
    return runs;
  };
  std::vector<std::string> names;
  for (const Family& family : kFamilies) names.push_back(family.name);
  const st::RandomRunResult result = st::run_random_configs(
      st::gpu_space(), plan, names, run_families, {}, "swa_decode_tests --gtest_filter=GpuRandomConfigs.*");
  st::print_result(result, plan);

  for (size_t i = 0; i < result.failures.size() && i < 10; ++i) ADD_FAILURE() << result.failures[i];
  EXPECT_EQ(result.failed_configs, 0) << result.failures.size() << " failing (configuration, family) pairs";
  if (plan.single || plan.count < st::kMinConfigsForCoverage) {
    std::printf("random-configs: %lld configurations: coverage minimums not applied (they need %lld)\n",
                static_cast<long long>(plan.count), static_cast<long long>(st::kMinConfigsForCoverage));
    return;
  }
  // The per-kernel minimums were set for the H200's 132 SMs (which portable variant runs depends
  // on the SM count); the per-family ones hold on every device that runs the family.
  const bool h200_like = props.major == 9 && props.minor == 0 && props.multiProcessorCount == 132;
  for (const st::FamilyTally& tally : result.families) {
    if ((tally.family == "sm90" || tally.family == "few_heads") && !sm90.supported) {
      std::printf("random-configs: family=%s not run on this device: no minimum\n", tally.family.c_str());
      continue;
    }
    const bool per_kernel = h200_like && (tally.family != "free" || sm90.supported);
    EXPECT_EQ(st::coverage_shortfall(tally, plan.count, per_kernel), "");
  }
}

}  // namespace
