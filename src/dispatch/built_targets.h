// Whether this build holds code for a device: the CUDA targets the portable kernel was compiled for
// (CMake's SWA_DECODE_PORTABLE_ARCHS) against the device's compute capability. select_kernel is
// pure and build-independent (it answers for any described device); decode() and query_support()
// ask this after it, on the device they run on, so that a build without code for the GPU (e.g. a
// wheel built for sm_90 only, on an sm_80 GPU) says kNotSupported rather than failing at launch.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "src/dispatch/kernel_record.h"

namespace swa_decode {

// One entry of CMAKE_CUDA_ARCHITECTURES: "90" (SASS and PTX), "90-real" (SASS), "90-virtual"
// (PTX), "90a" (arch-specific: SASS and PTX for 9.0 alone), "100f" (family: for 10.x).
struct BuiltTarget {
  int32_t cc;  // 10 * major + minor: 80, 90, 100, 120
  bool sass;
  bool ptx;
  enum class Scope : int32_t { kAny = 0, kArch = 1, kFamily = 2 } scope;
};

// The device of compute capability cc (10 * major + minor) runs code of `target`: SASS of its
// major at or below cc (an arch-specific target only on its own cc), or PTX at or below cc, which
// the driver compiles (an arch-specific or family target only within its own cc or major).
bool target_runs_on(const BuiltTarget& target, int32_t cc);

// The portable kernel's targets in this build; empty when CMake could not list them ("native",
// "all"): then every device the shared checks accept is taken to run it, and a device without code
// fails at launch with kCudaError.
std::span<const BuiltTarget> portable_targets();

// Why `kernel` cannot run on `device` in this build, "" if it can (or the build's targets are not
// known). Only the portable family is built for a list of targets; the sm90 and few-heads families
// are sm_90a alone, which their records' compute-capability checks already say.
std::string build_why_not(const KernelRecord& kernel, const DeviceInfo& device,
                          std::span<const BuiltTarget> targets = portable_targets());

}  // namespace swa_decode
