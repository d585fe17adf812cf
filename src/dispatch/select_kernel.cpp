#include "src/dispatch/select_kernel.h"

#include <array>
#include <string>

#include "swa_decode/limits.h"

namespace swa_decode {
namespace {

constexpr int32_t kMinComputeCapability = 80;  // mma.sync bf16 + cp.async

// Priority order. sm90 first: where it runs and is preferred (enough heads and tokens) it is the
// fastest; the few-heads kernel next, for the windows of few heads it is built for; the portable
// kernel runs everything else.
constexpr std::array<const KernelRecord*, 3> kRecords = {&kSm90Record, &kFewHeadsRecord, &kPortableRecord};

KernelChoice unsupported(std::string why) {
  KernelChoice choice;
  choice.why_not = std::move(why);
  return choice;
}

KernelChoice chosen(const KernelRecord& kernel, const DecodeShape& shape, const DeviceInfo& device) {
  KernelChoice choice;
  choice.kernel = &kernel;
  choice.plan = kernel.plan(shape, device);
  choice.plan.dependent_launch = device.cc_major >= 9;
  return choice;
}

}  // namespace

std::span<const KernelRecord* const> kernel_records() { return kRecords; }

const KernelRecord* find_kernel(KernelId id) {
  for (const KernelRecord* record : kRecords) {
    if (record->id == id) return record;
  }
  return nullptr;
}

const KernelRecord* find_kernel(std::string_view family) {
  for (const KernelRecord* record : kRecords) {
    if (family == record->family) return record;
  }
  return nullptr;
}

std::string gpu_why_not(const DecodeShape& shape, const DeviceInfo& device) {
  const int32_t cc = device.cc_major * 10 + device.cc_minor;
  if (cc < kMinComputeCapability) {
    return "device compute capability must be >= 8.0 (mma.sync bf16), got " + std::to_string(device.cc_major) + "." +
           std::to_string(device.cc_minor);
  }
  if (shape.head_dim != kGpuHeadDim) {
    return "head_dim must be " + std::to_string(kGpuHeadDim) + " on the GPU (the CPU backend takes any), got " +
           std::to_string(shape.head_dim);
  }
  if (shape.num_heads < 1 || shape.num_heads > kMaxGpuHeads) {
    return "num_heads must be in [1, " + std::to_string(kMaxGpuHeads) + "], got " + std::to_string(shape.num_heads);
  }
  if (shape.window_size < 1 || shape.window_size > kMaxWindow) {
    return "window_size must be in [1, " + std::to_string(kMaxWindow) + "], got " + std::to_string(shape.window_size);
  }
  if (shape.kv_row_alignment < 4) {
    return "kv_cache address, stride_kv_block and stride_kv_token must be multiples of 4 bytes on the GPU, got "
           "alignment " + std::to_string(shape.kv_row_alignment);
  }
  if (!shape.q_out_aligned_16) {
    return "q and out addresses and their token/head strides must be multiples of 8 elements (16 bytes) on the GPU";
  }
  if (!shape.has_extra) return {};
  if (shape.extra_max_entries < 1 || shape.extra_max_entries > kMaxExtraEntries) {
    return "extra.max_entries must be in [1, " + std::to_string(kMaxExtraEntries) + "], got " +
           std::to_string(shape.extra_max_entries);
  }
  if (shape.extra_kv_row_alignment < 4) {
    return "extra.kv_cache address, extra.stride_kv_block and extra.stride_kv_token must be multiples of 4 bytes on "
           "the GPU, got alignment " + std::to_string(shape.extra_kv_row_alignment);
  }
  return {};
}

const char* model1_source(const DecodeShape& shape) {
  if (shape.window_format == KvFormat::kModel1) return "kv_format";
  if (shape.has_extra && shape.extra_format == KvFormat::kModel1) return "extra.format";
  return nullptr;
}

KernelChoice select_kernel(const DecodeShape& shape, const DeviceInfo& device, KernelId only) {
  std::string shared_problem = gpu_why_not(shape, device);
  if (!shared_problem.empty()) return unsupported(std::move(shared_problem));

  if (only != KernelId::kNone) {
    const KernelRecord* kernel = find_kernel(only);
    if (kernel == nullptr) {
      return unsupported("kernel must name a kernel family of this library, got KernelId(" +
                         std::to_string(static_cast<int32_t>(only)) + ")");
    }
    std::string problem = kernel->why_not(shape, device);
    if (!problem.empty()) return unsupported(std::move(problem));
    return chosen(*kernel, shape, device);
  }

  const KernelRecord* fallback = nullptr;  // the first that runs the shape without preferring it
  std::string problems;                    // every family's why_not, said when none runs it
  for (const KernelRecord* kernel : kRecords) {
    const std::string problem = kernel->why_not(shape, device);
    if (!problem.empty()) {
      if (!problems.empty()) problems += "; ";
      problems += problem;
      continue;
    }
    if (kernel->preferred(shape, device)) return chosen(*kernel, shape, device);
    if (fallback == nullptr) fallback = kernel;
  }
  if (fallback != nullptr) return chosen(*fallback, shape, device);
  return unsupported("no GPU kernel of this build runs the shape: " + problems);
}

}  // namespace swa_decode
