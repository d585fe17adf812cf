#include "src/api/validate.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <string>

namespace swa_decode {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// Messages are concatenated with std::to_string, not streamed through an ostringstream: the text
// must not depend on the caller's global locale (digit grouping), and a validation failure should
// not need iostreams initialised in the host process.
struct Hex {
  uintptr_t value;
};

void append(std::string& out, const char* part) { out += part; }
void append(std::string& out, const std::string& part) { out += part; }
void append(std::string& out, Hex part) {
  char digits[2 * sizeof(uintptr_t)];
  const auto end = std::to_chars(digits, digits + sizeof(digits), part.value, 16).ptr;
  out.append("0x").append(digits, end);
}
template <class T>
  requires std::is_arithmetic_v<T>
void append(std::string& out, T part) {
  out += std::to_string(part);
}

// Builds a message only on the failure path, so a valid call formats nothing.
template <class... Parts>
Status invalid(const Parts&... parts) {
  std::string message;
  (append(message, parts), ...);
  return {StatusCode::kInvalidArgument, std::move(message)};
}

Status check_range(const char* field, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return {};
  return invalid(field, " must be in [", lo, ", ", hi, "], got ", value);
}

Status check_pointer(const char* field, const void* ptr, bool required, const char* when,
                     int64_t alignment, const char* element) {
  if (ptr == nullptr) {
    if (!required) return {};
    return invalid(field, " must be non-null", when, ", got nullptr");
  }
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  if (address % static_cast<uintptr_t>(alignment) != 0) {
    return invalid(field, " must be aligned to ", alignment, " bytes (", element, "), got address ",
                   Hex{address});
  }
  return {};
}

const char* known_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return "bf16";
    case DType::kFloat32: return "fp32";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat8E4M3: return "e4m3";
  }
  return nullptr;
}

int64_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return 2;
    case DType::kFloat32: return 4;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kFloat8E4M3: return 1;
  }
  return 1;
}

Status check_dtype(const char* field, DType dtype, DType a, DType b) {
  if (dtype == a || dtype == b) return {};
  return invalid(field, " must be ", dtype_name(a), " or ", dtype_name(b), ", got ", dtype_name(dtype));
}

// One dimension of a tensor whose innermost dimension is contiguous.
struct StridedDim {
  const char* stride_field;
  int64_t size;
  int64_t stride;
};

// A tensor must not overlap itself (docs/semantics.md, "Argument rules"): ordering its dimensions
// of size > 1 by stride, each stride is >= the span of the ones before it, starting from the
// contiguous innermost extent. Dimensions of size 1 are ignored, as PyTorch does. This accepts
// token-major and head-major layouts alike and rejects e.g. stride_q_head < head_dim with H > 1.
template <size_t N>
Status check_no_overlap(const char* tensor, const char* inner_field, int64_t inner_extent,
                        std::array<StridedDim, N> dims) {
  std::stable_sort(dims.begin(), dims.end(),
                   [](const StridedDim& a, const StridedDim& b) { return a.stride < b.stride; });
  int64_t span = inner_extent;
  for (size_t i = 0; i < N; ++i) {
    const StridedDim& dim = dims[i];
    if (dim.size <= 1) continue;
    if (dim.stride < span) {
      std::string span_of = inner_field;  // built on the failure path only
      for (size_t j = 0; j < i; ++j) {
        if (dims[j].size > 1) span_of += std::string(" x ") + dims[j].stride_field;
      }
      return invalid(dim.stride_field, " must be >= ", span, " (so that ", tensor,
                     " does not overlap itself: the span of ", span_of, "), got ", dim.stride);
    }
    if (dim.stride > (kInt64Max - span) / (dim.size - 1)) {
      return invalid(dim.stride_field, " * (size - 1) must fit in int64 for ", tensor, ", got stride ",
                     dim.stride, " with size ", dim.size);
    }
    span += (dim.size - 1) * dim.stride;
  }
  return {};
}

// A dimension of size <= 1 never moves an address, so its stride is set to 0: kernels then see
// neither an arbitrary caller value nor one that breaks an alignment test, and nothing overflows.
int64_t normalised(int64_t size, int64_t stride) { return size <= 1 ? 0 : stride; }

}  // namespace

std::string dtype_name(DType dtype) {
  const char* name = known_dtype_name(dtype);
  return name != nullptr ? name : "DType(" + std::to_string(static_cast<int32_t>(dtype)) + ")";
}

Status validate_args(const DecodeArgs& a) {
  Status s;
  const bool cuda = a.backend == Backend::kCuda;
  if (!cuda && a.backend != Backend::kCpu) {
    return invalid("backend must be kCuda or kCpu, got Backend(", static_cast<int32_t>(a.backend), ")");
  }

  // ---- shapes ----
  if (!(s = check_range("num_tokens", a.num_tokens, 0, kInt32Max)).ok()) return s;
  if (!(s = check_range("num_heads", a.num_heads, 1, cuda ? kMaxGpuHeads : kInt32Max)).ok()) return s;
  if (!(s = check_range("head_dim", a.head_dim, 1, kInt32Max)).ok()) return s;
  if (!(s = check_range("num_blocks", a.num_blocks, 1, kInt64Max)).ok()) return s;
  if (!(s = check_range("block_size", a.block_size, 1, kInt32Max)).ok()) return s;
  if (!(s = check_range("window_size", a.window_size, 1, kMaxWindow)).ok()) return s;
  if (a.num_blocks > kInt64Max / a.block_size) {
    return invalid("num_blocks * block_size must fit in int64, got num_blocks = ", a.num_blocks,
                   " and block_size = ", a.block_size);
  }
  const int64_t num_slots = a.num_blocks * a.block_size;
  if (a.index_cols < a.window_size) {
    return invalid("index_cols must be >= window_size = ", a.window_size, ", got ", a.index_cols);
  }
  if (a.num_scales < num_slots) {
    return invalid("num_scales must be >= num_blocks * block_size = ", num_slots, ", got ", a.num_scales);
  }
  if (!std::isfinite(a.scale)) return invalid("scale must be finite, got ", a.scale);

  // ---- dtypes ----
  if (!(s = check_dtype("inv_scale_dtype", a.inv_scale_dtype, DType::kBFloat16, DType::kFloat32)).ok()) return s;
  if (!(s = check_dtype("index_dtype", a.index_dtype, DType::kInt32, DType::kInt64)).ok()) return s;
  if (!(s = check_dtype("lens_dtype", a.lens_dtype, DType::kInt32, DType::kInt64)).ok()) return s;

  // ---- pointers: required ones non-null, every one aligned to its element ----
  const bool has_tokens = a.num_tokens > 0;
  const char* per_token = " when num_tokens > 0";
  if (!(s = check_pointer("kv_cache", a.kv_cache, true, "", 1, "e4m3")).ok()) return s;
  if (!(s = check_pointer("inv_scale", a.inv_scale, true, "", dtype_bytes(a.inv_scale_dtype),
                          known_dtype_name(a.inv_scale_dtype))).ok()) return s;
  if (!(s = check_pointer("q", a.q, has_tokens, per_token, 2, "bf16")).ok()) return s;
  if (!(s = check_pointer("indices", a.indices, has_tokens, per_token, dtype_bytes(a.index_dtype),
                          known_dtype_name(a.index_dtype))).ok()) return s;
  if (!(s = check_pointer("lens", a.lens, has_tokens, per_token, dtype_bytes(a.lens_dtype),
                          known_dtype_name(a.lens_dtype))).ok()) return s;
  if (!(s = check_pointer("out", a.out, has_tokens, per_token, 2, "bf16")).ok()) return s;
  if (!(s = check_pointer("attn_sink", a.attn_sink, false, "", 4, "fp32")).ok()) return s;
  if (!(s = check_pointer("lse", a.lse, false, "", 4, "fp32")).ok()) return s;

  // ---- strides: no tensor overlaps itself ----
  s = check_no_overlap("kv_cache", "head_dim", a.head_dim,
                       std::array<StridedDim, 2>{{{"stride_kv_block", a.num_blocks, a.stride_kv_block},
                                                  {"stride_kv_token", a.block_size, a.stride_kv_token}}});
  if (!s.ok()) return s;
  if (!has_tokens) return {};
  s = check_no_overlap("q", "head_dim", a.head_dim,
                       std::array<StridedDim, 2>{{{"stride_q_token", a.num_tokens, a.stride_q_token},
                                                  {"stride_q_head", a.num_heads, a.stride_q_head}}});
  if (!s.ok()) return s;
  s = check_no_overlap("out", "head_dim", a.head_dim,
                       std::array<StridedDim, 2>{{{"stride_out_token", a.num_tokens, a.stride_out_token},
                                                  {"stride_out_head", a.num_heads, a.stride_out_head}}});
  if (!s.ok()) return s;
  s = check_no_overlap("indices", "index_cols", a.index_cols,
                       std::array<StridedDim, 1>{{{"stride_indices_token", a.num_tokens,
                                                   a.stride_indices_token}}});
  if (!s.ok()) return s;
  if (a.lse != nullptr) {
    s = check_no_overlap("lse", "num_heads", a.num_heads,
                         std::array<StridedDim, 1>{{{"stride_lse_token", a.num_tokens, a.stride_lse_token}}});
    if (!s.ok()) return s;
  }
  return {};
}

DecodeParams make_params(const DecodeArgs& a) {
  return DecodeParams{
      .q = static_cast<const __nv_bfloat16*>(a.q),
      .attn_sink = a.attn_sink,
      .lse = a.lse,
      .out = static_cast<__nv_bfloat16*>(a.out),
      .stride_q_token = normalised(a.num_tokens, a.stride_q_token),
      .stride_q_head = normalised(a.num_heads, a.stride_q_head),
      .stride_lse_token = normalised(a.num_tokens, a.stride_lse_token),
      .stride_out_token = normalised(a.num_tokens, a.stride_out_token),
      .stride_out_head = normalised(a.num_heads, a.stride_out_head),
      .window =
          KvSourceParams{
              .kv_cache = static_cast<const uint8_t*>(a.kv_cache),
              .inv_scale = a.inv_scale,
              .indices = a.indices,
              .lens = a.lens,
              .stride_kv_block = normalised(a.num_blocks, a.stride_kv_block),
              .stride_kv_token = normalised(a.block_size, a.stride_kv_token),
              .stride_indices_token = normalised(a.num_tokens, a.stride_indices_token),
              .num_slots = a.num_blocks * a.block_size,
              .block_size = static_cast<int32_t>(a.block_size),
              .max_entries = static_cast<int32_t>(a.window_size),
              .inv_scale_is_f32 = a.inv_scale_dtype == DType::kFloat32 ? 1 : 0,
              .index_is_i64 = a.index_dtype == DType::kInt64 ? 1 : 0,
              .lens_is_i64 = a.lens_dtype == DType::kInt64 ? 1 : 0,
          },
      .extra = KvSourceParams{},
      .num_tokens = static_cast<int32_t>(a.num_tokens),
      .num_heads = static_cast<int32_t>(a.num_heads),
      .head_dim = static_cast<int32_t>(a.head_dim),
      .scale = a.scale,
  };
}

}  // namespace swa_decode
