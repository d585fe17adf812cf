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

// A field's name as messages print it: the call's own fields and the window's are bare
// ("kv_cache"), the extra source's carry its prefix ("extra.kv_cache"). Kept in two parts so that
// a valid call concatenates nothing.
struct Name {
  constexpr Name(const char* bare) : prefix(""), field(bare) {}  // implicit: most names are bare
  constexpr Name(const char* source_prefix, const char* source_field) : prefix(source_prefix), field(source_field) {}
  const char* prefix;
  const char* field;
};

void append(std::string& out, const char* part) { out += part; }
void append(std::string& out, const std::string& part) { out += part; }
void append(std::string& out, Name part) { out.append(part.prefix).append(part.field); }
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

Status check_range(Name field, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return {};
  return invalid(field, " must be in [", lo, ", ", hi, "], got ", value);
}

Status check_pointer(Name field, const void* ptr, bool required, const char* when,
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

Status check_dtype(Name field, DType dtype, DType a, DType b) {
  if (dtype == a || dtype == b) return {};
  return invalid(field, " must be ", dtype_name(a), " or ", dtype_name(b), ", got ", dtype_name(dtype));
}

// One dimension of a tensor whose innermost dimension is contiguous.
struct StridedDim {
  Name stride_field;
  int64_t size;
  int64_t stride;
};

// A tensor must not overlap itself (docs/semantics.md, "Argument rules"): ordering its dimensions
// of size > 1 by stride, each stride is >= the span of the ones before it, starting from the
// contiguous innermost extent. Dimensions of size 1 are ignored, as PyTorch does. This accepts
// token-major and head-major layouts alike and rejects e.g. stride_q_head < head_dim with H > 1.
template <size_t N>
Status check_no_overlap(Name tensor, Name inner_field, int64_t inner_extent,
                        std::array<StridedDim, N> dims) {
  std::stable_sort(dims.begin(), dims.end(),
                   [](const StridedDim& a, const StridedDim& b) { return a.stride < b.stride; });
  int64_t span = inner_extent;
  for (size_t i = 0; i < N; ++i) {
    const StridedDim& dim = dims[i];
    if (dim.size <= 1) continue;
    if (dim.stride < span) {
      std::string span_of;  // built on the failure path only
      append(span_of, inner_field);
      for (size_t j = 0; j < i; ++j) {
        if (dims[j].size <= 1) continue;
        span_of += " x ";
        append(span_of, dims[j].stride_field);
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

// How messages name one KV source's fields (docs/semantics.md, "Argument rules" and "The extra
// source"), and the limit of its entries.
struct SourceNames {
  const char* prefix;         // "" for the window, "extra." for the extra source
  Name max_entries;           // the field holding the source's entry limit
  int64_t max_entries_limit;  // from swa_decode/limits.h
  Name format;                // the field holding the source's row format
};

constexpr SourceNames kWindowNames{"", "window_size", kMaxWindow, "kv_format"};
constexpr SourceNames kExtraNames{"extra.", Name("extra.", "max_entries"), kMaxExtraEntries, Name("extra.", "format")};

// The cache strides of a kModel1 source (docs/semantics.md, "Row formats"): rows of exactly 576
// bytes, and blocks of B rows plus B 8-byte scale rows, padded as FlashMLA pads them to a multiple
// of 576 bytes (149,760 at B = 256). These fix the layout whatever num_blocks and block_size are,
// so no row or scale row of one block overlaps another's.
Status check_model1_strides(const KvSource& src, const SourceNames& names) {
  const auto name = [&names](const char* field) { return Name(names.prefix, field); };
  if (src.stride_kv_token != kModel1RowBytes) {
    return invalid(name("stride_kv_token"), " must be ", kModel1RowBytes, " when ", names.format, " is kModel1 (",
                   kModel1E4m3Dims, " e4m3 bytes and ", kModel1HeadDim - kModel1E4m3Dims, " bf16 values a row), got ",
                   src.stride_kv_token);
  }
  const int64_t block_bytes = src.block_size * (kModel1RowBytes + kModel1ScaleRowBytes);
  if (src.stride_kv_block < block_bytes) {
    return invalid(name("stride_kv_block"), " must be >= ", name("block_size"), " * ",
                   kModel1RowBytes + kModel1ScaleRowBytes, " = ", block_bytes, " when ", names.format,
                   " is kModel1 (", kModel1RowBytes, "-byte rows, then ", kModel1ScaleRowBytes,
                   "-byte scale rows), got ", src.stride_kv_block);
  }
  if (src.stride_kv_block % kModel1RowBytes != 0) {
    return invalid(name("stride_kv_block"), " must be a multiple of ", kModel1RowBytes, " when ", names.format,
                   " is kModel1 (FlashMLA pads each block to a multiple of ", kModel1RowBytes, " bytes), got ",
                   src.stride_kv_block);
  }
  if (src.num_blocks > 1 && src.stride_kv_block > kInt64Max / (src.num_blocks - 1)) {
    return invalid(name("stride_kv_block"), " * (size - 1) must fit in int64 for ", name("kv_cache"),
                   ", got stride ", src.stride_kv_block, " with size ", src.num_blocks);
  }
  return {};
}

// The window's fields of DecodeArgs as a KvSource, so that one check and one translation serve
// both sources.
KvSource window_source(const DecodeArgs& a) {
  return KvSource{.kv_cache = a.kv_cache, .num_blocks = a.num_blocks, .block_size = a.block_size,
                  .stride_kv_block = a.stride_kv_block, .stride_kv_token = a.stride_kv_token,
                  .inv_scale = a.inv_scale, .inv_scale_dtype = a.inv_scale_dtype, .num_scales = a.num_scales,
                  .indices = a.indices, .index_dtype = a.index_dtype, .index_cols = a.index_cols,
                  .stride_indices_token = a.stride_indices_token, .lens = a.lens, .lens_dtype = a.lens_dtype,
                  .lens_rows_per_entry = a.lens_rows_per_entry, .max_entries = a.window_size, .format = a.kv_format};
}

// Every rule of one source: shapes (block_size and max_entries fit the int32 fields of
// KvSourceParams), dtypes, pointers and strides, for its row format. head_dim and num_tokens are
// the call's, already checked.
Status check_source(const KvSource& src, const SourceNames& names, int64_t head_dim, int64_t num_tokens) {
  const auto name = [&names](const char* field) { return Name(names.prefix, field); };
  Status s;
  if (src.format != KvFormat::kE4m3 && src.format != KvFormat::kModel1) {
    return invalid(names.format, " must be KvFormat::kE4m3 (0) or KvFormat::kModel1 (1), got ",
                   static_cast<int32_t>(src.format));
  }
  const bool model1 = src.format == KvFormat::kModel1;
  if (model1 && head_dim != kModel1HeadDim) {
    return invalid("head_dim must be ", kModel1HeadDim, " when ", names.format, " is kModel1 (", kModel1E4m3Dims,
                   " e4m3 dims and ", kModel1HeadDim - kModel1E4m3Dims, " bf16 RoPE dims a row), got ", head_dim);
  }
  if (!(s = check_range(name("num_blocks"), src.num_blocks, 1, kInt64Max)).ok()) return s;
  if (!(s = check_range(name("block_size"), src.block_size, 1, kInt32Max)).ok()) return s;
  if (!(s = check_range(names.max_entries, src.max_entries, 1, names.max_entries_limit)).ok()) return s;
  if (!(s = check_range(name("lens_rows_per_entry"), src.lens_rows_per_entry, 1, kInt32Max)).ok()) return s;
  if (num_tokens % src.lens_rows_per_entry != 0) {
    return invalid(name("lens_rows_per_entry"), " must divide num_tokens = ", num_tokens, " (",
                   name("lens"), " holds one length per ", name("lens_rows_per_entry"),
                   " consecutive tokens), got ", src.lens_rows_per_entry);
  }
  if (src.num_blocks > kInt64Max / src.block_size) {
    return invalid(name("num_blocks"), " * ", name("block_size"), " must fit in int64, got ", name("num_blocks"),
                   " = ", src.num_blocks, " and ", name("block_size"), " = ", src.block_size);
  }
  const int64_t num_slots = src.num_blocks * src.block_size;
  if (src.index_cols < src.max_entries) {
    return invalid(name("index_cols"), " must be >= ", names.max_entries, " = ", src.max_entries, ", got ",
                   src.index_cols);
  }
  // kModel1 keeps its scales in the cache: inv_scale, its dtype and num_scales are not read.
  if (!model1 && src.num_scales < num_slots) {
    return invalid(name("num_scales"), " must be >= ", name("num_blocks"), " * ", name("block_size"), " = ",
                   num_slots, ", got ", src.num_scales);
  }

  if (!model1 &&
      !(s = check_dtype(name("inv_scale_dtype"), src.inv_scale_dtype, DType::kBFloat16, DType::kFloat32)).ok()) {
    return s;
  }
  if (!(s = check_dtype(name("index_dtype"), src.index_dtype, DType::kInt32, DType::kInt64)).ok()) return s;
  if (!(s = check_dtype(name("lens_dtype"), src.lens_dtype, DType::kInt32, DType::kInt64)).ok()) return s;

  const bool has_tokens = num_tokens > 0;
  const char* per_token = " when num_tokens > 0";
  // A kModel1 row starts on a multiple of 576 bytes and holds bf16 values from its byte 448.
  if (!(s = check_pointer(name("kv_cache"), src.kv_cache, true, "", model1 ? 2 : 1,
                          model1 ? "the bf16 RoPE values of kModel1 rows" : "e4m3")).ok()) return s;
  if (!model1 && !(s = check_pointer(name("inv_scale"), src.inv_scale, true, "", dtype_bytes(src.inv_scale_dtype),
                                     known_dtype_name(src.inv_scale_dtype))).ok()) return s;
  if (!(s = check_pointer(name("indices"), src.indices, has_tokens, per_token, dtype_bytes(src.index_dtype),
                          known_dtype_name(src.index_dtype))).ok()) return s;
  // lens may be null (every index column counts), for any num_tokens.
  if (!(s = check_pointer(name("lens"), src.lens, false, "", dtype_bytes(src.lens_dtype),
                          known_dtype_name(src.lens_dtype))).ok()) return s;

  const std::array<StridedDim, 2> cache_dims{{{name("stride_kv_block"), src.num_blocks, src.stride_kv_block},
                                               {name("stride_kv_token"), src.block_size, src.stride_kv_token}}};
  s = model1 ? check_model1_strides(src, names) : check_no_overlap(name("kv_cache"), "head_dim", head_dim, cache_dims);
  if (!s.ok() || !has_tokens) return s;
  return check_no_overlap(name("indices"), name("index_cols"), src.index_cols,
                          std::array<StridedDim, 1>{{{name("stride_indices_token"), num_tokens,
                                                      src.stride_indices_token}}});
}

// The kernels' view of a source that passed check_source: strides of size-1 dimensions become 0.
KvSourceParams source_params(const KvSource& src, int64_t num_tokens) {
  return KvSourceParams{
      .kv_cache = static_cast<const uint8_t*>(src.kv_cache),
      .inv_scale = src.inv_scale,
      .indices = src.indices,
      .lens = src.lens,
      .stride_kv_block = normalised(src.num_blocks, src.stride_kv_block),
      .stride_kv_token = normalised(src.block_size, src.stride_kv_token),
      .stride_indices_token = normalised(num_tokens, src.stride_indices_token),
      .num_slots = src.num_blocks * src.block_size,
      .block_size = static_cast<int32_t>(src.block_size),
      .max_entries = static_cast<int32_t>(src.max_entries),
      .lens_rows_per_entry = static_cast<int32_t>(src.lens_rows_per_entry),
      .inv_scale_is_f32 = src.inv_scale_dtype == DType::kFloat32 ? 1 : 0,
      .index_is_i64 = src.index_dtype == DType::kInt64 ? 1 : 0,
      .lens_is_i64 = src.lens_dtype == DType::kInt64 ? 1 : 0,
      .is_model1 = src.format == KvFormat::kModel1 ? 1 : 0,
  };
}

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
  if (!std::isfinite(a.scale)) return invalid("scale must be finite, got ", a.scale);

  // ---- the sources: the window always, the extra source when it has a cache ----
  if (!(s = check_source(window_source(a), kWindowNames, a.head_dim, a.num_tokens)).ok()) return s;
  if (a.extra.kv_cache != nullptr) {
    if (!(s = check_source(a.extra, kExtraNames, a.head_dim, a.num_tokens)).ok()) return s;
  }

  // ---- the per-token tensors: required ones non-null, every one aligned to its element ----
  const bool has_tokens = a.num_tokens > 0;
  const char* per_token = " when num_tokens > 0";
  if (!(s = check_pointer("q", a.q, has_tokens, per_token, 2, "bf16")).ok()) return s;
  if (!(s = check_pointer("out", a.out, has_tokens, per_token, 2, "bf16")).ok()) return s;
  if (!(s = check_pointer("attn_sink", a.attn_sink, false, "", 4, "fp32")).ok()) return s;
  if (!(s = check_pointer("lse", a.lse, false, "", 4, "fp32")).ok()) return s;
  if (a.empty_token_lse != EmptyTokenLse::kNegativeInfinity && a.empty_token_lse != EmptyTokenLse::kPositiveInfinity) {
    return invalid("empty_token_lse must be EmptyTokenLse::kNegativeInfinity (0) or kPositiveInfinity (1), got ",
                   static_cast<int32_t>(a.empty_token_lse));
  }
  if (!has_tokens) return {};

  // ---- strides: no tensor overlaps itself ----
  s = check_no_overlap("q", "head_dim", a.head_dim,
                       std::array<StridedDim, 2>{{{"stride_q_token", a.num_tokens, a.stride_q_token},
                                                  {"stride_q_head", a.num_heads, a.stride_q_head}}});
  if (!s.ok()) return s;
  s = check_no_overlap("out", "head_dim", a.head_dim,
                       std::array<StridedDim, 2>{{{"stride_out_token", a.num_tokens, a.stride_out_token},
                                                  {"stride_out_head", a.num_heads, a.stride_out_head}}});
  if (!s.ok()) return s;
  if (a.lse != nullptr) {
    s = check_no_overlap("lse", "num_heads", a.num_heads,
                         std::array<StridedDim, 1>{{{"stride_lse_token", a.num_tokens, a.stride_lse_token}}});
    if (!s.ok()) return s;
  }
  return {};
}

namespace {
float empty_token_lse_value(EmptyTokenLse convention) {
  return convention == EmptyTokenLse::kPositiveInfinity ? std::numeric_limits<float>::infinity()
                                                        : -std::numeric_limits<float>::infinity();
}
}  // namespace

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
      .window = source_params(window_source(a), a.num_tokens),
      .extra = a.extra.kv_cache != nullptr ? source_params(a.extra, a.num_tokens) : KvSourceParams{},
      .num_tokens = static_cast<int32_t>(a.num_tokens),
      .num_heads = static_cast<int32_t>(a.num_heads),
      .head_dim = static_cast<int32_t>(a.head_dim),
      .scale = a.scale,
      .empty_token_lse = empty_token_lse_value(a.empty_token_lse),
  };
}

}  // namespace swa_decode
