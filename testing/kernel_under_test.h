// Which kernel family the GPU tests run on (SWA_DECODE_TEST_KERNEL) and, case by case, whether a
// case runs there or is skipped, and why. A forced family never hands a case it cannot run to
// another kernel: before issue 10 it did, so "81/81 on sm90" counted tests the sm90 kernel never ran.
//
// The rule, per case (one decode call on one set of arguments):
//  - no kernel at all can run it (query_support says no): the case FAILS, whatever the variable
//    says; every GPU test is written for a shape the library supports.
//  - auto: it runs through decode(), on the kernel a user's call would get.
//  - a forced family that supports it (query_support_for_kernel): it runs on that family only.
//  - a forced family that does not: it is skipped, with the family's why_not.
// Per test (CaseTally): a test whose every case was skipped is reported SKIPPED with one line
//   kernel under test <family> cannot run this case: <why_not>
// and a test where some cases ran passes or fails on those and prints one line
//   kernel under test <family> skipped <N> of <M> cases: <why_not>
// so a log says, per family, how many tests ran and how many did not (scripts/device_session.sh
// greps both lines; their wording is fixed by tests/cpu/test_kernel_under_test.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "swa_decode/swa_decode.h"
#include "src/dispatch/select_kernel.h"

namespace swa_decode::testing {

inline constexpr const char* kKernelUnderTestVariable = "SWA_DECODE_TEST_KERNEL";

struct KernelUnderTest {
  KernelId id = KernelId::kNone;  // kNone = auto: decode() chooses, as for a user
  std::string family = "auto";    // "auto", "portable" or "sm90", as the variable spells it
};

// A value of SWA_DECODE_TEST_KERNEL: unset (nullptr) or empty = auto; otherwise exactly "auto",
// "portable" or "sm90". Anything else throws std::invalid_argument naming the variable, the
// accepted values and the value got: a typo must not quietly test the default kernel.
KernelUnderTest parse_kernel_under_test(const char* value);
KernelUnderTest kernel_under_test_from_environment();

enum class CaseAction { kRun, kSkip, kFail };

struct CaseDecision {
  CaseAction action = CaseAction::kRun;
  std::string why_not;  // kSkip: the forced family's why_not; kFail: the free choice's
};

// The rule above. `on_family`: query_support_for_kernel(args, kernel.id) (ignored for auto);
// `on_any_kernel`: query_support(args), the free choice. Pure, so it is tested without a GPU.
CaseDecision decide_case(const KernelUnderTest& kernel, const SupportInfo& on_family,
                         const SupportInfo& on_any_kernel);

// decide_case with both answers asked of the current device for `args`.
CaseDecision decide_case_on_device(const KernelUnderTest& kernel, const DecodeArgs& args);

// decode(args) for auto, decode_with_kernel(args, kernel.id) otherwise: never another family.
Status decode_on(const KernelUnderTest& kernel, const DecodeArgs& args);

// "kernel under test <family> cannot run this case: <why_not>"
std::string cannot_run_line(const std::string& family, const std::string& why_not);

// The cases of one test: how many ran, and why the others were skipped.
class CaseTally {
 public:
  explicit CaseTally(std::string family) : family_(std::move(family)) {}

  void count(const CaseDecision& decision);  // kFail counts as neither: the test fails instead
  int64_t ran() const { return ran_; }
  int64_t skipped() const { return static_cast<int64_t>(skip_reasons_.size()); }
  bool every_case_skipped() const { return ran_ == 0 && skipped() > 0; }

  // For GTEST_SKIP when every case was skipped: cannot_run_line with the first case's why_not,
  // then, if the cases had other reasons, " (N cases; also: <why_not>; ...)".
  std::string skip_message() const;
  // For a test where some cases ran and some were skipped:
  // "kernel under test <family> skipped <N> of <M> cases: <why_not>[; <why_not>...]".
  std::string partly_skipped_line() const;

 private:
  std::vector<std::string> distinct_reasons() const;

  std::string family_;
  int64_t ran_ = 0;
  std::vector<std::string> skip_reasons_;
};

}  // namespace swa_decode::testing
