// Calls back to back on one stream, the second reading what the first wrote, as a model's layers
// do (layer l's out, through its projection, is layer l + 1's q). With programmatic dependent
// launch (src/common/dependent_launch.h) the second kernel may start before the first has
// finished; it must still read the first's out as it is once the first is done. The first call's
// out is poisoned with NaN in the stream just before it runs, so a second kernel that read q too
// early would turn NaN out.
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "tests/gpu/gpu_test.h"

namespace swa_decode::testing {
namespace {

class GpuChainedCalls : public GpuTest {};

TEST_F(GpuChainedCalls, EachCallReadsTheOutputOfTheCallBeforeIt) {
  // Small T, so the first kernel leaves most SMs free for the second one's CTAs to start early.
  for (const int64_t heads : {16, 64, 128}) {
    BatchOptions options;
    options.num_tokens = 8;
    options.num_heads = heads;
    options.seed = 2026 + heads;
    SCOPED_TRACE(describe(options));
    const HostBatch first = make_batch(options);
    options.seed += 1;
    HostBatch second = make_batch(options);
    ASSERT_EQ(second.q_token_stride, first.out_token_stride);
    ASSERT_EQ(second.q_head_stride, first.out_head_stride);

    DeviceBatch first_device = upload_batch(first);
    DeviceBatch second_device = upload_batch(second);
    Stream stream;
    const DecodeArgs first_args = device_args(first, first_device, 0, first.num_tokens, stream.get());
    DecodeArgs second_args = device_args(second, second_device, 0, second.num_tokens, stream.get());
    second_args.q = first_device.out.get();  // the second call's q is the first call's out
    if (!admit(first_args) || !admit(second_args)) continue;
    constexpr int kRounds = 20;  // each round poisons the first out again, then runs both calls
    for (int round = 0; round < kRounds; ++round) {
      poison_outputs(first_device, stream.get());
      poison_outputs(second_device, stream.get());
      ASSERT_TRUE(run_decode(first_args).ok());
      ASSERT_TRUE(run_decode(second_args).ok());
    }
    stream.synchronize();

    const Outputs first_out = download_outputs(first_device);
    const CheckReport first_report = check_outputs(first, first_out);
    EXPECT_TRUE(first_report.ok) << first_report.summary() << "\n" << first_report.failures;
    // The reference of the second call runs on the q it was given: the first call's out.
    std::vector<uint16_t> q(second.q.size(), 0);
    std::memcpy(q.data(), first_out.out.data(), std::min(q.size(), first_out.out.size()) * sizeof(uint16_t));
    second.q = q;
    const CheckReport second_report = check_outputs(second, download_outputs(second_device));
    EXPECT_TRUE(second_report.ok) << second_report.summary() << "\n" << second_report.failures;
  }
}

}  // namespace
}  // namespace swa_decode::testing
