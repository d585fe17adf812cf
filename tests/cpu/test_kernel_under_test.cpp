// testing/kernel_under_test.h without a GPU: the variable's values, the run-or-skip rule and the
// exact wording of the lines scripts/device_session.sh counts.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "testing/kernel_under_test.h"

namespace swa_decode::testing {
namespace {

SupportInfo supported(const std::string& kernel) {
  return SupportInfo{.supported = true, .kernel = kernel, .head_groups_per_cta = 1, .why_not = {},
                     .family = "portable"};
}
SupportInfo not_supported(const std::string& why_not) {
  return SupportInfo{.supported = false, .kernel = {}, .head_groups_per_cta = 0, .why_not = why_not,
                     .family = {}};
}

const std::string kSm90WhyNot =
    "the sm90 kernel holds the whole window in shared memory: window_size must be <= 128, got 512";

TEST(KernelUnderTest, UnsetEmptyAndAutoMeanTheFreeChoice) {
  for (const char* value : {static_cast<const char*>(nullptr), "", "auto"}) {
    const KernelUnderTest kernel = parse_kernel_under_test(value);
    EXPECT_EQ(kernel.id, KernelId::kNone);
    EXPECT_EQ(kernel.family, "auto");
  }
}

TEST(KernelUnderTest, EachFamilyByItsName) {
  EXPECT_EQ(parse_kernel_under_test("portable").id, KernelId::kPortableMma);
  EXPECT_EQ(parse_kernel_under_test("portable").family, "portable");
  EXPECT_EQ(parse_kernel_under_test("sm90").id, KernelId::kSm90Wgmma);
  EXPECT_EQ(parse_kernel_under_test("sm90").family, "sm90");
}

// A typo must not quietly test the default kernel.
TEST(KernelUnderTest, UnknownValuesThrowNamingVariableAcceptedAndGot) {
  for (const char* value : {"sm9", "SM90", "sm90 ", "portable_mma_g1", "default", "none"}) {
    try {
      parse_kernel_under_test(value);
      ADD_FAILURE() << "\"" << value << "\" was accepted";
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("SWA_DECODE_TEST_KERNEL"), std::string::npos) << message;
      EXPECT_NE(message.find("auto, sm90, few_heads, portable"), std::string::npos) << message;
      EXPECT_NE(message.find(std::string("got \"") + value + "\""), std::string::npos) << message;
    }
  }
}

// The bug of issue 10: sm90 forced, sm90 cannot run the case, the default kernel can. The case
// must be skipped with sm90's reason, not run on the default kernel and counted as an sm90 pass.
TEST(KernelUnderTest, ForcedFamilyThatCannotRunTheCaseSkipsItWithItsWhyNot) {
  const CaseDecision decision = decide_case(parse_kernel_under_test("sm90"), not_supported(kSm90WhyNot),
                                            supported("portable_mma_g1"));
  EXPECT_EQ(decision.action, CaseAction::kSkip);
  EXPECT_EQ(decision.why_not, kSm90WhyNot);
  EXPECT_EQ(cannot_run_line("sm90", decision.why_not),
            "kernel under test sm90 cannot run this case: " + kSm90WhyNot);
}

TEST(KernelUnderTest, ForcedFamilyThatCanRunTheCaseRunsIt) {
  const CaseDecision decision =
      decide_case(parse_kernel_under_test("portable"), supported("portable_mma_g2"), supported("sm90_wgmma"));
  EXPECT_EQ(decision.action, CaseAction::kRun);
  EXPECT_TRUE(decision.why_not.empty());
}

TEST(KernelUnderTest, AutoRunsWhateverAFamilySays) {
  const CaseDecision decision =
      decide_case(parse_kernel_under_test("auto"), not_supported(kSm90WhyNot), supported("portable_mma_g1"));
  EXPECT_EQ(decision.action, CaseAction::kRun);
}

// A case no kernel runs (bad arguments, an unsupported shape) is a broken test, never a skip.
TEST(KernelUnderTest, ACaseNoKernelRunsFailsEvenWhenForced) {
  const std::string invalid = "q must be non-null when num_tokens > 0, got nullptr";
  for (const char* family : {"auto", "portable", "sm90"}) {
    const CaseDecision decision =
        decide_case(parse_kernel_under_test(family), not_supported(invalid), not_supported(invalid));
    EXPECT_EQ(decision.action, CaseAction::kFail) << family;
    EXPECT_EQ(decision.why_not, invalid) << family;
  }
}

TEST(KernelUnderTest, TallyOfATestWhereEveryCaseWasSkipped) {
  CaseTally one("sm90");
  one.count({.action = CaseAction::kSkip, .why_not = "reason a"});
  EXPECT_TRUE(one.every_case_skipped());
  EXPECT_EQ(one.skip_message(), "kernel under test sm90 cannot run this case: reason a");

  CaseTally several("sm90");
  for (const char* reason : {"reason a", "reason b", "reason a"}) {
    several.count({.action = CaseAction::kSkip, .why_not = reason});
  }
  EXPECT_TRUE(several.every_case_skipped());
  EXPECT_EQ(several.skipped(), 3);
  EXPECT_EQ(several.skip_message(),
            "kernel under test sm90 cannot run this case: reason a; reason b (all 3 cases of the test)");
}

TEST(KernelUnderTest, TallyOfATestWhereSomeCasesRan) {
  CaseTally tally("sm90");
  tally.count({.action = CaseAction::kRun, .why_not = {}});
  tally.count({.action = CaseAction::kSkip, .why_not = "reason a"});
  tally.count({.action = CaseAction::kRun, .why_not = {}});
  tally.count({.action = CaseAction::kSkip, .why_not = "reason b"});
  tally.count({.action = CaseAction::kFail, .why_not = "broken"});
  EXPECT_FALSE(tally.every_case_skipped());
  EXPECT_EQ(tally.ran(), 2);
  EXPECT_EQ(tally.skipped(), 2);
  EXPECT_EQ(tally.partly_skipped_line(), "kernel under test sm90 skipped 2 of 4 cases: reason a; reason b");

  CaseTally none("portable");
  EXPECT_FALSE(none.every_case_skipped());  // a test with no case (no GPU) is not a kernel skip
  none.count({.action = CaseAction::kRun, .why_not = {}});
  EXPECT_FALSE(none.every_case_skipped());
  EXPECT_EQ(none.skipped(), 0);
}

}  // namespace
}  // namespace swa_decode::testing
