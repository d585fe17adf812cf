#include "testing/device_args.h"

#include "testing/cuda_check.h"

namespace swa_decode::testing {
namespace {

int64_t dtype_bytes(DType dtype) { return dtype == DType::kBFloat16 ? 2 : dtype == DType::kInt64 ? 8 : 4; }

}  // namespace

DeviceArgs::DeviceArgs(const DecodeArgs& host, cudaStream_t stream) : args_(host) {
  const int64_t T = host.num_tokens, H = host.num_heads;
  args_.backend = Backend::kCuda;
  args_.stream = stream;
  args_.q = mirror(host.q, ((T - 1) * host.stride_q_token + (H - 1) * host.stride_q_head + host.head_dim) * 2);
  args_.kv_cache = mirror(host.kv_cache, host.num_blocks * host.stride_kv_block);
  args_.inv_scale = mirror(host.inv_scale, host.num_scales * dtype_bytes(host.inv_scale_dtype));
  args_.indices = mirror(host.indices, T * host.stride_indices_token * dtype_bytes(host.index_dtype));
  args_.lens = mirror(host.lens, T / host.lens_rows_per_entry * dtype_bytes(host.lens_dtype));
  if (host.extra.kv_cache != nullptr) {
    const KvSource& x = host.extra;
    args_.extra.kv_cache = mirror(x.kv_cache, x.num_blocks * x.stride_kv_block);
    args_.extra.inv_scale = mirror(x.inv_scale, x.num_scales * dtype_bytes(x.inv_scale_dtype));
    args_.extra.indices = mirror(x.indices, T * x.stride_indices_token * dtype_bytes(x.index_dtype));
    args_.extra.lens = mirror(x.lens, T / x.lens_rows_per_entry * dtype_bytes(x.lens_dtype));
  }
  if (host.attn_sink != nullptr) args_.attn_sink = static_cast<const float*>(mirror(host.attn_sink, H * 4));
  out_ = DeviceBuffer(static_cast<size_t>(T * host.stride_out_token * 2));
  out_.fill_bytes(0xFF);  // bf16 NaN
  args_.out = out_.get();
  if (host.lse != nullptr) {
    lse_ = DeviceBuffer(static_cast<size_t>(T * host.stride_lse_token * 4));
    lse_.fill_bytes(0xFF);  // fp32 NaN
    args_.lse = lse_.as<float>();
  }
  SWAD_TESTING_CUDA_CHECK(cudaDeviceSynchronize());
}

std::vector<float> DeviceArgs::lse() const {
  return args_.lse == nullptr ? std::vector<float>{} : download_vector<float>(lse_);
}

const void* DeviceArgs::mirror(const void* host, int64_t bytes) {
  if (host == nullptr) return nullptr;
  for (const auto& [from, buffer] : copies_) {
    if (from == host) return buffer.get();
  }
  copies_.emplace_back(host, DeviceBuffer(static_cast<size_t>(bytes)));
  copies_.back().second.upload(host, static_cast<size_t>(bytes));
  return copies_.back().second.get();
}

}  // namespace swa_decode::testing
