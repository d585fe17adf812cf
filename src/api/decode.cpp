// The public entry points: validate once, then run the CPU reference or pick and enqueue a kernel.
#include "swa_decode/swa_decode.h"

#include <array>
#include <atomic>
#include <exception>
#include <mutex>
#include <new>
#include <string>

#include <cuda_runtime_api.h>

#include "src/api/decode.h"
#include "src/api/validate.h"
#include "src/dispatch/built_targets.h"
#include "src/dispatch/launch.h"
#include "src/dispatch/select_kernel.h"
#include "src/reference/reference.h"

namespace swa_decode {
namespace {

constexpr const char* kCpuKernelName = "cpu_reference";
constexpr const char* kCpuFamily = "cpu";

Status cuda_error(const char* call, cudaError_t err) {
  return {StatusCode::kCudaError, std::string(call) + " failed: " + cudaGetErrorString(err)};
}

Status read_device_info(int ordinal, DeviceInfo* info) {
  int cc_major = 0, cc_minor = 0, num_sms = 0, smem_optin = 0;
  cudaError_t err = cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, ordinal);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, ordinal);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, ordinal);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal);
  }
  if (err != cudaSuccess) {
    return cuda_error(("cudaDeviceGetAttribute(device " + std::to_string(ordinal) + ")").c_str(), err);
  }
  *info = DeviceInfo{.cc_major = cc_major, .cc_minor = cc_minor, .num_sms = num_sms,
                     .smem_optin_bytes = smem_optin};
  return {};
}

// Device properties are read once per device and kept: decode() runs on every decode step, and a
// driver query per call would add latency to a path that is otherwise a single launch.
// Double-checked: the fast path is one acquire load; the first reader of a device takes the lock.
class DeviceInfoCache {
 public:
  Status get(int ordinal, DeviceInfo* info) {
    if (ordinal < 0 || ordinal >= kMaxCached) return read_device_info(ordinal, info);  // uncached
    Entry& entry = entries_[ordinal];
    if (!entry.ready.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!entry.ready.load(std::memory_order_relaxed)) {
        Status status = read_device_info(ordinal, &entry.info);
        if (!status.ok()) return status;  // not cached: a later call retries
        entry.ready.store(true, std::memory_order_release);
      }
    }
    *info = entry.info;
    return {};
  }

 private:
  static constexpr int kMaxCached = 64;
  struct Entry {
    std::atomic<bool> ready{false};
    DeviceInfo info{};
  };
  std::mutex mutex_;
  std::array<Entry, kMaxCached> entries_{};
};

Status device_info(int device_ordinal, DeviceInfo* info) {
  static DeviceInfoCache cache;
  int ordinal = device_ordinal;
  if (ordinal < 0) {
    const cudaError_t err = cudaGetDevice(&ordinal);
    if (err != cudaSuccess) return cuda_error("cudaGetDevice", err);
  }
  return cache.get(ordinal, info);
}

SupportInfo not_supported(std::string why) {
  SupportInfo info;
  info.why_not = std::move(why);
  return info;
}

SupportInfo cpu_support() {
  SupportInfo info;
  info.supported = true;
  info.kernel = kCpuKernelName;
  info.head_groups_per_cta = 1;
  info.family = kCpuFamily;
  return info;
}

SupportInfo from_choice(const KernelChoice& choice) {
  if (choice.kernel == nullptr) return not_supported(choice.why_not);
  SupportInfo info;
  info.supported = true;
  info.kernel = choice.plan.name;
  info.head_groups_per_cta = choice.plan.head_groups_per_cta;
  info.family = choice.kernel->family;
  return info;
}

// Largest power of two <= 16 dividing a source's cache address and both its strides (bytes).
// Strides of size-1 dimensions are 0 in params, so they never lower it.
int32_t kv_row_alignment(const KvSourceParams& source) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(source.kv_cache) | static_cast<uint64_t>(source.stride_kv_block) |
                        static_cast<uint64_t>(source.stride_kv_token) | uint64_t{16};
  return static_cast<int32_t>(bits & (~bits + 1));  // lowest set bit
}

// Bytes from a source's cache address to the start of its last row.
int64_t kv_last_row_offset(const KvSourceParams& source) {
  return (source.num_slots / source.block_size - 1) * source.stride_kv_block +
         (source.block_size - 1) * source.stride_kv_token;
}

// Status for an exception escaping the library's own code: bad_alloc (host memory for a message or
// the CPU reference) is the only exception the library can raise itself.
Status from_exception(const char* what) {
  return {StatusCode::kInternal, std::string("swa_decode internal error: ") + what};
}

}  // namespace

DecodeShape decode_shape(const DecodeParams& params) {
  // Strides of size-1 dimensions are 0 in params, so they never lower an alignment.
  const uint64_t q_out_bits = reinterpret_cast<uintptr_t>(params.q) | reinterpret_cast<uintptr_t>(params.out) |  // bytes
                              (static_cast<uint64_t>(params.stride_q_token) << 1) |
                              (static_cast<uint64_t>(params.stride_q_head) << 1) |
                              (static_cast<uint64_t>(params.stride_out_token) << 1) |
                              (static_cast<uint64_t>(params.stride_out_head) << 1);
  const bool has_extra = params.extra.kv_cache != nullptr;
  return DecodeShape{.num_tokens = params.num_tokens,
                     .num_heads = params.num_heads,
                     .head_dim = params.head_dim,
                     .window_size = params.window.max_entries,
                     .kv_row_alignment = kv_row_alignment(params.window),
                     .q_out_aligned_16 = q_out_bits % 16 == 0,
                     .kv_last_row_offset = kv_last_row_offset(params.window),
                     .has_extra = has_extra,
                     .extra_max_entries = has_extra ? params.extra.max_entries : 0,
                     .extra_kv_row_alignment = has_extra ? kv_row_alignment(params.extra) : 0,
                     .extra_kv_last_row_offset = has_extra ? kv_last_row_offset(params.extra) : 0,
                     .window_format = params.window.is_model1 != 0 ? KvFormat::kModel1 : KvFormat::kE4m3,
                     .extra_format = has_extra && params.extra.is_model1 != 0 ? KvFormat::kModel1 : KvFormat::kE4m3};
}

namespace {

// select_kernel's answer for the device this process runs on: a kernel the build has no code for
// on it (built_targets.h) is no answer, and its why_not says which targets the build has.
KernelChoice select_on_this_build(const DecodeShape& shape, const DeviceInfo& device, KernelId only) {
  KernelChoice choice = select_kernel(shape, device, only);
  if (choice.kernel == nullptr) return choice;
  std::string missing = build_why_not(*choice.kernel, device);
  if (missing.empty()) return choice;
  return KernelChoice{.kernel = nullptr, .plan = {}, .why_not = std::move(missing)};
}

// Every query: validate, answer kCpu, take `described` or read the device, then ask select_kernel
// restricted to `only` (KernelId::kNone = free choice). Never throws.
SupportInfo support_for(const DecodeArgs& args, int device_ordinal, const DeviceInfo* described, KernelId only,
                        bool cpu_allowed) {
  try {
    const Status status = validate_args(args);
    if (!status.ok()) return not_supported(status.message);
    if (args.backend == Backend::kCpu) {
      return cpu_allowed ? cpu_support() : not_supported("backend must be kCuda, got kCpu");
    }
    DeviceInfo device{};
    if (described != nullptr) {
      device = *described;
    } else {
      const Status probe = device_info(device_ordinal, &device);
      if (!probe.ok()) return not_supported(probe.message);
    }
    const DecodeShape shape = decode_shape(make_params(args));
    // A described device may be any build's; the one this process reads runs this build's code.
    return from_choice(described != nullptr ? select_kernel(shape, device, only)
                                            : select_on_this_build(shape, device, only));
  } catch (const std::exception& e) {
    return not_supported(from_exception(e.what()).message);
  }
}

// decode and decode_with_kernel: the same path, with the kernel choice restricted to `only`.
Status run(const DecodeArgs& args, KernelId only, bool cpu_allowed) noexcept {
  try {
    const Status status = validate_args(args);
    if (!status.ok()) return status;
    if (args.backend == Backend::kCpu) {
      return cpu_allowed ? reference::run(args) : Status{StatusCode::kInvalidArgument, "backend must be kCuda, got kCpu"};
    }
    DeviceInfo device{};
    const Status probe = device_info(-1, &device);
    if (!probe.ok()) return probe;
    const DecodeParams params = make_params(args);
    const KernelChoice choice = select_on_this_build(decode_shape(params), device, only);
    if (choice.kernel == nullptr) return {StatusCode::kNotSupported, choice.why_not};
    return launch_decode(params, *choice.kernel, choice.plan, args.stream);
  } catch (const std::exception& e) {
    try {
      return from_exception(e.what());
    } catch (...) {
      return {StatusCode::kInternal, {}};
    }
  } catch (...) {
    return {StatusCode::kInternal, {}};
  }
}

}  // namespace

SupportInfo query_support(const DecodeArgs& args, int device_ordinal) {
  return support_for(args, device_ordinal, nullptr, KernelId::kNone, /*cpu_allowed=*/true);
}

Status decode(const DecodeArgs& args) noexcept { return run(args, KernelId::kNone, /*cpu_allowed=*/true); }

SupportInfo query_support_for_kernel(const DecodeArgs& args, KernelId kernel) {
  return support_for(args, -1, nullptr, kernel, /*cpu_allowed=*/false);
}

SupportInfo query_support_on(const DecodeArgs& args, const DeviceInfo& device, KernelId kernel) {
  return support_for(args, -1, &device, kernel, /*cpu_allowed=*/kernel == KernelId::kNone);
}

Status decode_with_kernel(const DecodeArgs& args, KernelId kernel) noexcept {
  return run(args, kernel, /*cpu_allowed=*/false);
}

const char* version() noexcept { return "0.1.0"; }

}  // namespace swa_decode
