#include "testing/kernel_under_test.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "src/api/decode.h"
#include "src/dispatch/select_kernel.h"

namespace swa_decode::testing {
namespace {

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string text;
  for (const std::string& part : parts) text += (text.empty() ? "" : separator) + part;
  return text;
}

}  // namespace

KernelUnderTest parse_kernel_under_test(const char* value) {
  const std::string name = value == nullptr ? "" : value;
  if (name.empty() || name == "auto") return {};
  if (const KernelRecord* record = find_kernel(name)) return {.id = record->id, .family = record->family};
  std::string families;
  for (const KernelRecord* record : kernel_records()) families += std::string(", ") + record->family;
  throw std::invalid_argument(std::string(kKernelUnderTestVariable) + " must be unset, empty or one of auto" +
                              families + ", got \"" + name + "\"");
}

KernelUnderTest kernel_under_test_from_environment() {
  return parse_kernel_under_test(std::getenv(kKernelUnderTestVariable));
}

CaseDecision decide_case(const KernelUnderTest& kernel, const SupportInfo& on_family,
                         const SupportInfo& on_any_kernel) {
  if (!on_any_kernel.supported) return {.action = CaseAction::kFail, .why_not = on_any_kernel.why_not};
  if (kernel.id == KernelId::kNone || on_family.supported) return {.action = CaseAction::kRun, .why_not = {}};
  return {.action = CaseAction::kSkip, .why_not = on_family.why_not};
}

CaseDecision decide_case_on_device(const KernelUnderTest& kernel, const DecodeArgs& args) {
  const SupportInfo on_any_kernel = query_support(args);
  const SupportInfo on_family = kernel.id == KernelId::kNone ? on_any_kernel : query_support_for_kernel(args, kernel.id);
  return decide_case(kernel, on_family, on_any_kernel);
}

Status decode_on(const KernelUnderTest& kernel, const DecodeArgs& args) {
  return kernel.id == KernelId::kNone ? decode(args) : decode_with_kernel(args, kernel.id);
}

std::string cannot_run_line(const std::string& family, const std::string& why_not) {
  return "kernel under test " + family + " cannot run this case: " + why_not;
}

void CaseTally::count(const CaseDecision& decision) {
  if (decision.action == CaseAction::kRun) ran_ += 1;
  if (decision.action == CaseAction::kSkip) skip_reasons_.push_back(decision.why_not);
}

std::vector<std::string> CaseTally::distinct_reasons() const {
  std::vector<std::string> reasons;
  for (const std::string& reason : skip_reasons_) {
    if (std::find(reasons.begin(), reasons.end(), reason) == reasons.end()) reasons.push_back(reason);
  }
  return reasons;
}

std::string CaseTally::skip_message() const {
  const std::string line = cannot_run_line(family_, join(distinct_reasons(), "; "));
  return skipped() > 1 ? line + " (all " + std::to_string(skipped()) + " cases of the test)" : line;
}

std::string CaseTally::partly_skipped_line() const {
  return "kernel under test " + family_ + " skipped " + std::to_string(skipped()) + " of " +
         std::to_string(ran_ + skipped()) + " cases: " + join(distinct_reasons(), "; ");
}

}  // namespace swa_decode::testing
