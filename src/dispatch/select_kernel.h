// The one place that decides which kernel runs for a shape on a device: the checks every GPU kernel
// shares, then the kernel records (kernel_record.h) walked in priority order. Pure: no CUDA calls,
// so it is unit-tested on machines without a GPU and also answers query_support().
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "src/dispatch/kernel_record.h"

namespace swa_decode {

struct KernelChoice {
  const KernelRecord* kernel = nullptr;  // nullptr: no kernel runs the shape, why_not says why
  LaunchPlan plan;                       // kernel->plan for the shape
  std::string why_not;                   // set when kernel == nullptr
  KernelId id() const { return kernel == nullptr ? KernelId::kNone : kernel->id; }
};

// Every kernel family of the library, in priority order: the free choice takes the first record
// that runs a shape and prefers it, else the first that runs it. A family this build lacks is
// listed too; its why_not says so.
std::span<const KernelRecord* const> kernel_records();

// The record of a family, by id or by KernelRecord::family ("portable", "sm90"); nullptr if none.
const KernelRecord* find_kernel(KernelId id);
const KernelRecord* find_kernel(std::string_view family);

// Why no GPU kernel can run `shape` on `device` whatever its family ("" if these checks pass):
// compute capability >= 8.0, head_dim == kGpuHeadDim, 1..kMaxGpuHeads heads, window 1..kMaxWindow,
// 4-byte kv_cache rows and 16-byte q / out rows; with an extra source, 1..kMaxExtraEntries entries
// and 4-byte extra.kv_cache rows. Whether a family reads an extra source is its record's why_not.
std::string gpu_why_not(const DecodeShape& shape, const DeviceInfo& device);

// The field of the first source of `shape` in KvFormat::kModel1 ("kv_format", "extra.format"), or
// nullptr if neither is: what a record that does not read kModel1 rows names in its why_not.
const char* model1_source(const DecodeShape& shape);

// Whether this build contains the sm_90a fast path (CMake builds it when sm_90 is a target).
bool sm90_kernel_built();

// Why `kernel` ("the sm90 kernel", "the few-heads kernel"), built for sm_90a, cannot run on
// `device` or in this build, or "": the build must hold the sm_90a kernels and the device be
// compute capability 9.0 (an sm_90a binary runs on nothing else).
std::string sm90a_why_not(const char* kernel, const DeviceInfo& device);

// Why `kernel` cannot take `bytes` of shared memory per block on `device`, or "".
std::string shared_memory_why_not(const char* kernel, int64_t bytes, const DeviceInfo& device);

// `only` restricts the choice to one kernel family (KernelId::kNone = free choice): then the
// answer is that family's plan or its why_not, never another family.
KernelChoice select_kernel(const DecodeShape& shape, const DeviceInfo& device, KernelId only = KernelId::kNone);

}  // namespace swa_decode
