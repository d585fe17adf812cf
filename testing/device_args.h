// A host DecodeArgs (e.g. testing::HostProblem::args()) mirrored onto the device: every input
// tensor it names is copied once per distinct host pointer (both sources may name one cache, so
// the device arguments share it too), and out / lse are fresh device buffers filled with NaN, so
// an element the kernel does not write shows. The host's out / lse are never copied: a caller
// that ran the CPU reference on the host arguments first must not hand its answer to the kernel.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "swa_decode/swa_decode.h"
#include "testing/device_buffer.h"

namespace swa_decode::testing {

class DeviceArgs {
 public:
  // Backend::kCuda on `stream`; everything is uploaded and filled before this returns.
  explicit DeviceArgs(const DecodeArgs& host, cudaStream_t stream = nullptr);

  const DecodeArgs& args() const { return args_; }
  std::vector<uint16_t> out() const { return download_vector<uint16_t>(out_); }
  std::vector<float> lse() const;  // empty when the host arguments had no lse

 private:
  const void* mirror(const void* host, int64_t bytes);

  DecodeArgs args_;
  std::vector<std::pair<const void*, DeviceBuffer>> copies_;
  DeviceBuffer out_, lse_;
};

}  // namespace swa_decode::testing
