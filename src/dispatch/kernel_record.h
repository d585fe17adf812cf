// What the dispatch knows about one kernel family: whether it runs a shape (and why not), whether
// it is the better choice where it can, how it would be launched, and the function that launches
// it. src/dispatch/select_kernel.cpp walks these records in priority order. Adding a kernel is its
// files under src/kernels/, one record file (src/dispatch/<family>_record.cpp, listed in
// src/CMakeLists.txt), its launch configuration in LaunchPlan::config, its launch adapter in
// launch.cu and its place in select_kernel.cpp's list; nothing else names a kernel.
//
// Plain C++17 (launch.cu includes it): the selection functions make no CUDA calls, so the CPU
// tests reach every record without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <variant>

#include <cuda_runtime_api.h>

#include "src/common/params.h"
#include "swa_decode/swa_decode.h"

namespace swa_decode {

// A kernel family; kNone asks for the free choice where a family may be named.
enum class KernelId : int32_t { kNone = 0, kPortableMma = 1, kSm90Wgmma = 2, kFewHeadsMma = 3 };

// What the selection needs to know about the problem (already validated by src/api/).
struct DecodeShape {
  int64_t num_tokens;
  int64_t num_heads;
  int64_t head_dim;
  int64_t window_size;
  // Largest power of two <= 16 dividing the kv_cache address and both its strides (bytes): rows
  // are copied in pieces of this width, and below 4 bytes no GPU kernel runs.
  int32_t kv_row_alignment;
  // q and out rows are read and written 16 bytes at a time: their addresses and token/head strides
  // must be multiples of 8 elements (16 bytes).
  bool q_out_aligned_16;
  // Bytes from the kv_cache address to the start of its last row (the sm90 kernel keeps row
  // offsets as 32-bit counts of 16 bytes, so it needs this below 64 GiB).
  int64_t kv_last_row_offset = 0;
  // The extra source (docs/semantics.md, "The extra source"): whether there is one and, if so, its
  // entry limit and its cache's row alignment and last row offset, as the window's above. All 0
  // without one.
  bool has_extra = false;
  int64_t extra_max_entries = 0;  // extra.max_entries: 1..kMaxExtraEntries index columns a token
  int32_t extra_kv_row_alignment = 0;
  int64_t extra_kv_last_row_offset = 0;
  // Each source's row layout (docs/semantics.md, "Row formats"); extra_format is kE4m3 without an
  // extra source. A record that does not read a format says so in its why_not.
  KvFormat window_format = KvFormat::kE4m3;
  KvFormat extra_format = KvFormat::kE4m3;
};

// What the selection needs to know about the GPU (read once by the caller via cudaGetDeviceProperties).
struct DeviceInfo {
  int32_t cc_major;
  int32_t cc_minor;
  int32_t num_sms;
  int64_t smem_optin_bytes;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
};

// Launch configuration of the portable kernel (src/kernels/portable/launch_portable.h).
struct PortableLaunch {
  int32_t head_groups_per_cta;  // 16-head groups one CTA holds: 1 or 2
  int32_t num_stages;           // staging buffers of 32 cache rows
  int32_t window_splits;        // CTAs (one cluster, sm_90+) sharing each window; 1 = no split
};

// Launch configuration of the sm90 kernels (src/kernels/sm90/launch_sm90.h).
struct Sm90Launch {
  int32_t persistent_ctas;  // one per SM
  // The layer kernel (decode_sm90_layer.cuh), which reads the extra source too; else the
  // window-only kernel (decode_sm90.cuh).
  bool layer = false;
  // The layer kernel's key split (sm90_layer_plan.h, KeySplit): CTAs (or pairs) a token; 1: none.
  int32_t key_splits = 1;
};

// Launch configuration of the few-heads kernel (src/kernels/few_heads/launch_few_heads.h).
struct FewHeadsLaunch {
  int32_t head_tiles;  // 8-head mma N tiles one CTA holds: 1 or 2
};

// What a record's plan() decides for a shape it runs.
struct LaunchPlan {
  std::string name;                 // stable kernel name: the bench JSON, query_support and tests use it
  int32_t head_groups_per_cta = 0;  // reported by query_support: 16-head groups one CTA holds, 0 for sm90
  std::variant<std::monostate, PortableLaunch, Sm90Launch, FewHeadsLaunch> config;
  // Launched with programmatic dependent launch (src/common/kernel_launch.h): on compute
  // capability 9.0 and newer, where griddepcontrol exists; select_kernel.cpp sets it for every record.
  bool dependent_launch = false;
};

struct KernelRecord {
  KernelId id;
  // Short family name: SWA_DECODE_TEST_KERNEL, the CLI's --kernel and SupportInfo::family use it.
  const char* family;
  // Why this kernel cannot run `shape` on `device` ("" if it can). Called only for shapes that
  // passed the checks every GPU kernel shares (select_kernel.h, gpu_why_not), so it says only what
  // is particular to this kernel.
  std::string (*why_not)(const DecodeShape& shape, const DeviceInfo& device);
  // Whether the free choice takes this kernel for a shape it runs; where it does not, a later
  // record is tried (and this one is kept as the fallback).
  bool (*preferred)(const DecodeShape& shape, const DeviceInfo& device);
  // The launch configuration, for a shape why_not accepted.
  LaunchPlan (*plan)(const DecodeShape& shape, const DeviceInfo& device);
  // Enqueues the kernel on `stream` with a plan this record made; defined in launch.cu.
  cudaError_t (*launch)(const DecodeParams& params, const LaunchPlan& plan, cudaStream_t stream);
};

// The records, one file each (src/dispatch/<family>_record.cpp); select_kernel.cpp lists them in
// priority order.
extern const KernelRecord kSm90Record;
extern const KernelRecord kPortableRecord;
extern const KernelRecord kFewHeadsRecord;

}  // namespace swa_decode
