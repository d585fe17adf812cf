#include "src/dispatch/select_kernel.h"

#include <string>

namespace swa_decode {
namespace {

constexpr int64_t kKernelHeadDim = 512;    // the D-permuted fragment layout is built for 512
constexpr int64_t kMaxHeads = 128;
constexpr int64_t kMaxWindow = 1024;
constexpr int32_t kMinComputeCapability = 80;  // mma.sync bf16 + cp.async

KernelChoice unsupported(std::string why) {
  KernelChoice choice;
  choice.why_not = std::move(why);
  return choice;
}

}  // namespace

KernelChoice select_kernel(const DecodeShape& shape, const DeviceInfo& device) {
  const int32_t cc = device.cc_major * 10 + device.cc_minor;
  if (cc < kMinComputeCapability) {
    return unsupported("device compute capability must be >= 8.0 (mma.sync bf16), got " +
                       std::to_string(device.cc_major) + "." + std::to_string(device.cc_minor));
  }
  if (shape.head_dim != kKernelHeadDim) {
    return unsupported("head_dim must be 512 on the GPU (the CPU backend takes any), got " +
                       std::to_string(shape.head_dim));
  }
  if (shape.num_heads < 1 || shape.num_heads > kMaxHeads) {
    return unsupported("num_heads must be in [1, 128], got " + std::to_string(shape.num_heads));
  }
  if (shape.window_size < 1 || shape.window_size > kMaxWindow) {
    return unsupported("window_size must be in [1, 1024], got " + std::to_string(shape.window_size));
  }

  if (shape.kv_row_alignment < 4) {
    return unsupported("kv_cache address, stride_kv_block and stride_kv_token must be multiples of 4 bytes "
                       "on the GPU, got alignment " + std::to_string(shape.kv_row_alignment));
  }
  if (!shape.q_out_aligned_16) {
    return unsupported("q and out addresses and their token/head strides must be multiples of 8 elements "
                       "(16 bytes) on the GPU");
  }

  KernelChoice choice;
  choice.id = KernelId::kPortableMma;
  // Two 16-head groups per CTA halve the times each KV tile is gathered and dequantized; a single
  // group keeps H <= 16 (tensor parallel) from padding heads it does not have.
  choice.head_groups_per_cta = shape.num_heads > 16 ? 2 : 1;
  choice.name = "portable_mma_g" + std::to_string(choice.head_groups_per_cta);
  return choice;
}

}  // namespace swa_decode
