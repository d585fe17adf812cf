// The fixture of every GPU test file (tests/gpu/): it skips without a device, decides each case on
// the kernel under test (testing/kernel_under_test.h, SWA_DECODE_TEST_KERNEL), and runs a case
// against the float64 reference on outputs poisoned before the run.
#pragma once

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "swa_decode/swa_decode.h"
#include "src/api/validate.h"
#include "testing/batch.h"
#include "testing/check.h"
#include "testing/cuda_check.h"
#include "testing/device_args.h"
#include "testing/device_batch.h"
#include "testing/device_buffer.h"
#include "testing/kernel_under_test.h"

namespace swa_decode::testing {

// One line naming a batch's shape, dtypes and seed, for SCOPED_TRACE.
inline std::string describe(const BatchOptions& o) {
  std::string text = "T=" + std::to_string(o.num_tokens) + " H=" + std::to_string(o.num_heads) +
                     " W=" + std::to_string(o.window_size) + " index_cols=" + std::to_string(o.index_cols) +
                     " indices=" + dtype_name(o.index_dtype) + " lens=" + dtype_name(o.lens_dtype) +
                     " inv_scale=" + dtype_name(o.inv_scale_dtype) + " seed=" + std::to_string(o.seed);
  if (o.kv_format == KvFormat::kModel1) text += " kv_format=kModel1";
  if (o.extra) {
    const ExtraOptions& x = *o.extra;
    text += " extra: top_k=" + std::to_string(x.top_k) + " compress_ratio=" + std::to_string(x.compress_ratio) +
            " X=" + std::to_string(x.max_entries) + " block_size=" + std::to_string(x.block_size) +
            (x.shares_window_cache ? " (the window's cache)" : "") + " indices=" + dtype_name(x.index_dtype) +
            " lens=" + dtype_name(x.lens_dtype) + " inv_scale=" + dtype_name(x.inv_scale_dtype);
    if (x.format == KvFormat::kModel1) text += " format=kModel1";
  }
  return text;
}

// What a run of host-built arguments produced: out as bf16 bits and lse, in the layout of the
// arguments (DeviceArgs::out / lse).
struct Produced {
  std::vector<uint16_t> out;
  std::vector<float> lse;
};

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      kernel_ = kernel_under_test_from_environment();
    } catch (const std::invalid_argument& e) {
      FAIL() << e.what();
    }
    tally_ = CaseTally(kernel_.family);
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device: GPU tests skipped";
  }

  void TearDown() override {
    if (tally_.every_case_skipped()) {
      if (!HasFailure()) GTEST_SKIP() << tally_.skip_message();
    } else if (tally_.skipped() > 0) {
      RecordProperty("kernel_under_test_skipped_cases", static_cast<int>(tally_.skipped()));
      std::printf("%s\n", tally_.partly_skipped_line().c_str());
      std::fflush(stdout);
    }
  }

  // Whether the case with these arguments runs on the kernel under test (then through
  // run_decode); a skipped case is tallied, a case no kernel can run fails the test.
  bool admit(const DecodeArgs& args) {
    const CaseDecision decision = decide_case_on_device(kernel_, args);
    tally_.count(decision);
    if (decision.action == CaseAction::kFail) ADD_FAILURE() << "no kernel can run this case: " << decision.why_not;
    return decision.action == CaseAction::kRun;
  }

  Status run_decode(const DecodeArgs& args) const { return decode_on(kernel_, args); }

  // Mirrors `host` (e.g. a HostProblem's args()) onto the device and runs it on the kernel under
  // test; false if the case was skipped or decode failed (the failure is recorded). `got` holds its
  // out and lse.
  bool run_on_device(const DecodeArgs& host, Produced& got) {
    const DeviceArgs device(host);
    if (!admit(device.args())) return false;
    const Status status = run_decode(device.args());
    EXPECT_TRUE(status.ok()) << status.message;
    SWAD_TESTING_CUDA_CHECK(cudaDeviceSynchronize());
    got.out = device.out();
    got.lse = device.lse();
    return status.ok();
  }

  // One case on `batch`: uploads it, runs decode on pre-poisoned outputs and compares `tokens`
  // (all of them when empty) with the reference, computed on `threads` threads; every token is
  // scanned for NaN, unwritten elements and writes into stride gaps.
  void expect_batch_matches_reference(const HostBatch& batch, std::vector<int64_t> tokens = {}, int threads = 1) {
    DeviceBatch device = upload_batch(batch);
    Stream stream;
    const DecodeArgs args = device_args(batch, device, 0, batch.num_tokens, stream.get());
    if (!admit(args)) return;
    poison_outputs(device, stream.get());
    const Status status = run_decode(args);
    ASSERT_TRUE(status.ok()) << status.message;
    stream.synchronize();
    const CheckReport report = check_outputs(batch, download_outputs(device), std::move(tokens), {}, threads);
    EXPECT_TRUE(report.ok) << report.summary() << "\n" << report.failures;
  }

  // One case: generates the batch, then as above on every token.
  void expect_matches_reference(const BatchOptions& options) {
    SCOPED_TRACE(describe(options));
    expect_batch_matches_reference(make_batch(options));
  }

 private:
  KernelUnderTest kernel_;
  CaseTally tally_{kernel_.family};
};

}  // namespace swa_decode::testing
