// Calls back to back on one stream, the second reading what the first wrote, as a model's layers
// do (layer l's out, through its projection, is layer l + 1's q). With programmatic dependent
// launch (src/common/dependent_launch.h) the second kernel may start before the first has
// finished; it must still read the first's out as it is once the first is done. The first call's
// out is poisoned with NaN in the stream just before it runs, so a second kernel that read q too
// early would turn NaN out.
#include <cstdint>
#include <algorithm>
#include <array>
#include <cstring>
#include <thread>
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

// Two host threads on one device, each on its own stream, launch the same kernel with two shared
// memory sizes: the portable kernel's ring and entry lists grow with the window (W = 16 against
// 128, both with an extra source, which makes T = 8 the portable kernel's under decode()'s pick).
// A limit set to each launch's own size could drop under the larger launch between its raise and
// its launch, which then fails (src/common/kernel_launch.h, DynamicSmemLimit). Each thread is new,
// so its first call also finds no current context, which the sm90 kernels' q tensor map needs
// (sm90_q_map.h; under SWA_DECODE_TEST_KERNEL=sm90 every call failed before 6f602f4). Every call
// must succeed and both outputs match.
TEST_F(GpuChainedCalls, TwoHostThreadsLaunchOneKernelWithTwoSharedMemorySizes) {
  std::array<HostBatch, 2> batches;
  std::array<DeviceBatch, 2> devices;
  std::array<Stream, 2> streams;
  std::array<DecodeArgs, 2> args;
  const int64_t windows[2] = {16, 128};
  for (int i = 0; i < 2; ++i) {
    BatchOptions options;
    options.num_tokens = 8;
    options.num_heads = 64;
    options.window_size = windows[i];
    options.seed = 77 + i;
    options.extra = ExtraOptions{.compress_ratio = 4, .top_k = 64, .max_entries = 64};
    SCOPED_TRACE(describe(options));
    batches[i] = make_batch(options);
    devices[i] = upload_batch(batches[i]);
    args[i] = device_args(batches[i], devices[i], 0, batches[i].num_tokens, streams[i].get());
    if (!admit(args[i])) return;
  }
  constexpr int kRounds = 300;
  std::array<int, 2> failures = {0, 0};
  std::array<Status, 2> first_failure;
  auto launch_rounds = [&](int i) {
    for (int round = 0; round < kRounds; ++round) {
      const Status status = run_decode(args[i]);
      if (!status.ok() && failures[i]++ == 0) first_failure[i] = status;
    }
  };
  std::thread small(launch_rounds, 0);
  std::thread large(launch_rounds, 1);
  small.join();
  large.join();
  for (int i = 0; i < 2; ++i) {
    streams[i].synchronize();
    EXPECT_EQ(failures[i], 0) << "W = " << windows[i] << ": " << first_failure[i].message;
    const CheckReport report = check_outputs(batches[i], download_outputs(devices[i]));
    EXPECT_TRUE(report.ok) << "W = " << windows[i] << ": " << report.summary() << "\n" << report.failures;
  }
}

}  // namespace
}  // namespace swa_decode::testing
