#include "src/dispatch/built_targets.h"

#include <array>

namespace swa_decode {
namespace {

// SWA_DECODE_PORTABLE_TARGETS (src/CMakeLists.txt): four numbers a target, cc, sass, ptx, scope.
#if defined(SWA_DECODE_PORTABLE_TARGETS)
constexpr int32_t kTargetNumbers[] = {SWA_DECODE_PORTABLE_TARGETS};
constexpr size_t kTargets = sizeof(kTargetNumbers) / sizeof(kTargetNumbers[0]) / 4;
static_assert(sizeof(kTargetNumbers) / sizeof(kTargetNumbers[0]) % 4 == 0, "four numbers a target");
constexpr std::array<BuiltTarget, kTargets> kPortableTargets = [] {
  std::array<BuiltTarget, kTargets> targets{};
  for (size_t i = 0; i < kTargets; ++i) {
    targets[i] = BuiltTarget{.cc = kTargetNumbers[4 * i], .sass = kTargetNumbers[4 * i + 1] != 0,
                             .ptx = kTargetNumbers[4 * i + 2] != 0,
                             .scope = static_cast<BuiltTarget::Scope>(kTargetNumbers[4 * i + 3])};
  }
  return targets;
}();
#else
constexpr std::array<BuiltTarget, 0> kPortableTargets{};
#endif

std::string cc_string(int32_t cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

std::string target_name(const BuiltTarget& t) {
  const char* scope = t.scope == BuiltTarget::Scope::kArch ? "a" : t.scope == BuiltTarget::Scope::kFamily ? "f" : "";
  const char* kind = t.sass && t.ptx ? "" : t.sass ? "-real" : "-virtual";
  return std::to_string(t.cc) + scope + kind;
}

}  // namespace

bool target_runs_on(const BuiltTarget& target, int32_t cc) {
  const bool same_major = target.cc / 10 == cc / 10;
  switch (target.scope) {
    case BuiltTarget::Scope::kArch:
      return (target.sass || target.ptx) && target.cc == cc;
    case BuiltTarget::Scope::kFamily:
      return (target.sass || target.ptx) && same_major && target.cc <= cc;
    case BuiltTarget::Scope::kAny:
      break;
  }
  return (target.sass && same_major && target.cc <= cc) || (target.ptx && target.cc <= cc);
}

std::span<const BuiltTarget> portable_targets() { return kPortableTargets; }

std::string build_why_not(const KernelRecord& kernel, const DeviceInfo& device, std::span<const BuiltTarget> targets) {
  if (kernel.id != KernelId::kPortableMma || targets.empty()) return {};
  const int32_t cc = device.cc_major * 10 + device.cc_minor;
  std::string built;
  for (const BuiltTarget& target : targets) {
    if (target_runs_on(target, cc)) return {};
    built += (built.empty() ? "" : ", ") + target_name(target);
  }
  return "this build has no code for compute capability " + cc_string(cc) + ": the portable kernel is built for " +
         built + " (CMake's SWA_DECODE_PORTABLE_ARCHS)";
}

}  // namespace swa_decode
