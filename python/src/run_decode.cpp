// run_decode (run_decode.h): every check of a call's arrays against each other and the Python
// arguments' names, DecodeArgs built from them, and swa_decode::decode's Status as an exception.
#include "run_decode.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "swa_decode/limits.h"
#include "swa_decode/swa_decode.h"

namespace nb = nanobind;

namespace swa_decode_py {
namespace {

// DLPack 1.1 float8 codes, spelled as numbers: nanobind 2.0's dtype_code enum predates them.
constexpr uint8_t kDLFloat8E4M3FN = 10, kDLFloat8E5M2 = 12;

std::string dtype_name(nb::dlpack::dtype dt) {
  using Code = nb::dlpack::dtype_code;
  const std::string bits = std::to_string(dt.bits);
  switch (static_cast<Code>(dt.code)) {
    case Code::Int: return "int" + bits;
    case Code::UInt: return "uint" + bits;
    case Code::Float: return "float" + bits;
    case Code::Bfloat: return dt.bits == 16 ? "bfloat16" : "bfloat" + bits;
    case Code::Bool: return "bool";
    default: break;
  }
  switch (dt.code) {
    case kDLFloat8E4M3FN: return "float8_e4m3fn";
    case kDLFloat8E5M2: return "float8_e5m2";
    default: return "dlpack(code=" + std::to_string(dt.code) + ", bits=" + bits + ")";
  }
}

bool is(nb::dlpack::dtype dt, nb::dlpack::dtype_code code, int bits) {
  return dt.code == static_cast<uint8_t>(code) && dt.bits == bits && dt.lanes == 1;
}
bool is_bf16(nb::dlpack::dtype dt, bool viewed) {
  using Code = nb::dlpack::dtype_code;
  return is(dt, Code::Bfloat, 16) || (viewed && is(dt, Code::UInt, 16));
}
bool is_f32(nb::dlpack::dtype dt) { return is(dt, nb::dlpack::dtype_code::Float, 32); }

[[noreturn]] void type_error(const std::string& msg) { throw nb::type_error(msg.c_str()); }
[[noreturn]] void value_error(const std::string& msg) { throw nb::value_error(msg.c_str()); }

void check_ndim(const ArrayView& a, const char* name, size_t ndim, const char* layout) {
  if (a.ndim() != ndim) {
    value_error(std::string(name) + " must be " + std::to_string(ndim) + "-D " + layout + ", got " +
                std::to_string(a.ndim()) + "-D");
  }
}

void check_dim(const ArrayView& a, const char* name, size_t dim, int64_t expected, const char* what) {
  const int64_t actual = a.shape(dim);
  if (actual != expected) {
    value_error(std::string(name) + ".shape[" + std::to_string(dim) + "] must equal " + what +
                " = " + std::to_string(expected) + ", got " + std::to_string(actual));
  }
}

void check_dim_at_least(const ArrayView& a, const char* name, size_t dim, int64_t minimum,
                        const char* what) {
  const int64_t actual = a.shape(dim);
  if (actual < minimum) {
    value_error(std::string(name) + ".shape[" + std::to_string(dim) + "] must be >= " + what +
                " = " + std::to_string(minimum) + ", got " + std::to_string(actual));
  }
}

// DecodeArgs has no field for the innermost stride: it is 1 by contract. A size-1 dimension's
// stride is never used, so any value is fine there.
void check_unit_stride(const ArrayView& a, const char* name, size_t dim) {
  if (a.shape(dim) > 1 && a.stride(dim) != 1) {
    value_error(std::string(name) + ".stride(" + std::to_string(dim) +
                ") must be 1 (contiguous in that dimension), got " + std::to_string(a.stride(dim)));
  }
}

std::string device_name(int32_t type, int32_t id) {
  if (type == kDLCPU) return "cpu";
  if (type == kDLCUDA) return "cuda:" + std::to_string(id);
  return "dlpack device (type=" + std::to_string(type) + ", id=" + std::to_string(id) + ")";
}

void check_same_device(const ArrayView& a, const char* name, const ArrayView& q) {
  if (a.device_type() != q.device_type() || a.device_id() != q.device_id()) {
    value_error(std::string(name) + " must be on q's device " +
                device_name(q.device_type(), q.device_id()) + ", got " +
                device_name(a.device_type(), a.device_id()));
  }
}

// Makes `device` current for the duration of the call: swa_decode::decode launches on the current
// device, and a tensor on cuda:1 with cuda:0 current would otherwise fail inside the launch.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      throw std::runtime_error("cudaGetDevice failed: " +
                               std::string(cudaGetErrorString(cudaGetLastError())));
    }
    if (previous_ != device) {
      const cudaError_t err = cudaSetDevice(device);
      if (err != cudaSuccess) {
        throw std::runtime_error("cudaSetDevice(" + std::to_string(device) +
                                 ") failed: " + cudaGetErrorString(err));
      }
      switched_ = true;
    }
  }
  ~CudaDeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

using Code = nb::dlpack::dtype_code;

swa_decode::DType int_dtype(const ArrayView& a, const char* name) {
  if (is(a.dtype(), Code::Int, 32)) return swa_decode::DType::kInt32;
  if (is(a.dtype(), Code::Int, 64)) return swa_decode::DType::kInt64;
  type_error(std::string(name) + " must have dtype int32 or int64, got " + dtype_name(a.dtype()));
}

// The Python names of one KV source's arguments: one function checks the window and the extra
// source, and each message names the argument the caller passed.
struct SourceNames {
  const char* kv_cache;
  const char* inv_scale;
  const char* indices;
  const char* lens;
  const char* lens_rows_per_entry;  // the argument that says how many tokens one lens entry covers
  const char* block_size;
  const char* max_entries;  // the argument that says how many index columns are read
  const char* num_slots;    // the slot count as the scale-count message spells it
  int inv_scale_view;       // this source's bit of bf16_views
  const char* format;       // the argument naming the source's row format
};

constexpr SourceNames kWindowNames{
    "kv_cache", "inv_scale",  "indices",
    "lens",     "lens_rows_per_entry", "block_size", "window_size",
    "kv_cache.shape[0] * block_size (num_slots)", kViewInvScale, "kv_format"};
constexpr SourceNames kExtraNames{
    "extra_kv_cache", "extra_inv_scale",  "extra_indices",
    "extra_lens",     "extra_lens_rows_per_entry", "extra_block_size", "extra_window",
    "extra_kv_cache.shape[0] * extra_block_size (num_slots)", kViewExtraInvScale,
    "extra_kv_format"};


swa_decode::KvFormat parsed_format(const std::string& value, const char* name) {
  if (value == kE4m3Name) return swa_decode::KvFormat::kE4m3;
  if (value == kModel1Name) return swa_decode::KvFormat::kModel1;
  value_error(std::string(name) + " must be '" + kE4m3Name + "' or '" + kModel1Name + "', got '" +
              value + "'");
}

// A kModel1 cache as the engines hold it (FlashMLA's k_cache): (num_blocks, block_size, 1, 584)
// or (num_blocks, block_size, 584) bytes, a view whose last dimension is one row with its scale
// row. Only its block stride says where rows are: a block is block_size rows of 576 bytes and then
// block_size 8-byte scale rows, so the view's token stride (584) is not the rows' (576).
constexpr int64_t kModel1ViewBytes = swa_decode::kModel1RowBytes + swa_decode::kModel1ScaleRowBytes;

void check_model1_cache(const ArrayView& kv_cache, const SourceNames& names) {
  if (kv_cache.ndim() != 3 && kv_cache.ndim() != 4) {
    value_error(std::string(names.kv_cache) + " must be 4-D (num_blocks, block_size, 1, 584) or " +
                "3-D (num_blocks, block_size, 584) for " + names.format + " 'model1', got " +
                std::to_string(kv_cache.ndim()) + "-D");
  }
  if (kv_cache.ndim() == 4) {
    check_dim(kv_cache, names.kv_cache, 2, 1, "1 (one KV head)");
  }
  check_dim(kv_cache, names.kv_cache, kv_cache.ndim() - 1, kModel1ViewBytes,
            "a 'model1' row with its scale row (576 + 8 bytes)");
}

// lens holds one length per lens_rows_per_entry tokens: lens.shape[0] * n = T. An n out of range
// is validate_args' to report (so is an n that does not divide T when there are no lens).
void check_lens_rows(const ArrayView& lens, int64_t lens_rows_per_entry, int64_t num_tokens,
                     const SourceNames& names) {
  if (lens_rows_per_entry == 1) {
    check_dim(lens, names.lens, 0, num_tokens, "q.shape[0] (num_tokens)");
    return;
  }
  int64_t rows = 0;
  if (lens_rows_per_entry < 1 || lens_rows_per_entry > INT32_MAX ||
      (!__builtin_mul_overflow(lens.shape(0), lens_rows_per_entry, &rows) && rows == num_tokens)) {
    return;
  }
  value_error(std::string(names.lens) + ".shape[0] * " + names.lens_rows_per_entry +
              " must equal q.shape[0] (num_tokens) = " + std::to_string(num_tokens) + ", got " +
              std::to_string(lens.shape(0)) + " * " + std::to_string(lens_rows_per_entry));
}

// One KV source as a swa_decode::KvSource, once everything its tensors carry agrees with q (T, D,
// device), with block_size, max_entries and lens_rows_per_entry, and each tensor has a dtype the
// source takes. A kModel1 source keeps its scales in the cache: its inv_scale is not read (may be
// absent). Without lens every index column counts.
swa_decode::KvSource checked_source(const ArrayView& kv_cache,
                                    const std::optional<ArrayView>& inv_scale_arg,
                                    const ArrayView& indices, const std::optional<ArrayView>& lens,
                                    int64_t lens_rows_per_entry, int64_t block_size,
                                    int64_t max_entries, swa_decode::KvFormat format,
                                    const SourceNames& names, const ArrayView& q,
                                    int bf16_views) {
  const bool model1 = format == swa_decode::KvFormat::kModel1;
  if (!model1 && !inv_scale_arg) {
    value_error(std::string(names.inv_scale) + " is required for " + names.format + " '" +
                kE4m3Name + "' (only '" + kModel1Name + "' keeps its scales in the cache)");
  }
  // ---- ranks and shapes ----
  if (model1) {
    check_model1_cache(kv_cache, names);  // head_dim = 512 is validate_args' rule for the format
  } else {
    check_ndim(kv_cache, names.kv_cache, 3, "(num_blocks, block_size, head_dim)");
    check_dim(kv_cache, names.kv_cache, 2, q.shape(2), "q.shape[2] (head_dim)");
    const ArrayView& inv_scale = *inv_scale_arg;
    if (inv_scale.ndim() == 2) {
      if (inv_scale.shape(1) != 1) {
        value_error(std::string(names.inv_scale) +
                    ".shape[1] must equal 1 (a (num_slots, 1) scale), got " +
                    std::to_string(inv_scale.shape(1)));
      }
    } else if (inv_scale.ndim() != 1) {
      value_error(std::string(names.inv_scale) +
                  " must be 1-D (num_slots,) or 2-D (num_slots, 1), got " +
                  std::to_string(inv_scale.ndim()) + "-D");
    }
  }
  check_ndim(indices, names.indices, 2, "(num_tokens, index_cols)");
  if (lens) check_ndim(*lens, names.lens, 1, "(num_tokens / lens_rows_per_entry,)");

  const auto num_tokens = q.shape(0);
  // DecodeArgs has one block_size per source, so the argument and the view must agree: a larger
  // block_size maps slot b * block_size + o to row o >= kv_cache.shape[1] of block b, outside the
  // view (in the last block, past the allocation); a smaller one maps slots to rows the caller did
  // not mean.
  check_dim(kv_cache, names.kv_cache, 1, block_size, names.block_size);
  const auto num_blocks = kv_cache.shape(0);
  int64_t num_slots = 0;
  // An S that overflows int64 is validate_args' to report ("num_blocks * block_size must fit").
  if (!model1 && !__builtin_mul_overflow(num_blocks, block_size, &num_slots)) {
    check_dim_at_least(*inv_scale_arg, names.inv_scale, 0, num_slots, names.num_slots);
  }
  check_dim_at_least(indices, names.indices, 1, max_entries, names.max_entries);
  check_dim(indices, names.indices, 0, num_tokens, "q.shape[0] (num_tokens)");
  if (lens) check_lens_rows(*lens, lens_rows_per_entry, num_tokens, names);

  // ---- unit innermost strides ----
  check_unit_stride(kv_cache, names.kv_cache, kv_cache.ndim() - 1);
  if (!model1) check_unit_stride(*inv_scale_arg, names.inv_scale, 0);
  check_unit_stride(indices, names.indices, 1);
  if (lens) check_unit_stride(*lens, names.lens, 0);

  // ---- q's device ----
  check_same_device(kv_cache, names.kv_cache, q);
  if (!model1) check_same_device(*inv_scale_arg, names.inv_scale, q);
  check_same_device(indices, names.indices, q);
  if (lens) check_same_device(*lens, names.lens, q);

  // ---- DLPack dtypes -> DecodeArgs dtypes ----
  const bool bytes = is(kv_cache.dtype(), Code::UInt, 8) ||
                     is(kv_cache.dtype(), static_cast<Code>(kDLFloat8E4M3FN), 8);
  if (model1 && !bytes && !is(kv_cache.dtype(), Code::Int, 8)) {
    // FlashMLA's k_cache: vLLM allocates uint8, SGLang int8 or float8_e4m3fn.
    type_error(std::string(names.kv_cache) + " must have dtype uint8, int8 or float8_e4m3fn " +
               "(the bytes of 'model1' rows) for " + names.format + " 'model1', got " +
               dtype_name(kv_cache.dtype()));
  }
  if (!model1 && !bytes) {
    type_error(std::string(names.kv_cache) +
               " must have dtype uint8 or float8_e4m3fn (e4m3 bytes), got " +
               dtype_name(kv_cache.dtype()));
  }
  swa_decode::KvSource source{
      .kv_cache = kv_cache.data(),
      .num_blocks = num_blocks,
      .block_size = block_size,
      .stride_kv_block = kv_cache.stride(0),
      .stride_kv_token = model1 ? swa_decode::kModel1RowBytes : kv_cache.stride(1),
      .indices = indices.data(),
      .index_dtype = int_dtype(indices, names.indices),
      .index_cols = indices.shape(1),
      .stride_indices_token = indices.stride(0),
      .lens = lens ? lens->data() : nullptr,
      .lens_dtype = lens ? int_dtype(*lens, names.lens) : swa_decode::DType::kInt32,
      .lens_rows_per_entry = lens_rows_per_entry,
      .max_entries = max_entries,
      .format = format,
  };
  if (model1) return source;
  const ArrayView& inv_scale = *inv_scale_arg;
  if (is_bf16(inv_scale.dtype(), bf16_views & names.inv_scale_view)) {
    source.inv_scale_dtype = swa_decode::DType::kBFloat16;
  } else if (is_f32(inv_scale.dtype())) {
    source.inv_scale_dtype = swa_decode::DType::kFloat32;
  } else {
    type_error(std::string(names.inv_scale) + " must have dtype bfloat16 or float32, got " +
               dtype_name(inv_scale.dtype()));
  }
  source.inv_scale = inv_scale.data();
  source.num_scales = inv_scale.shape(0);
  return source;
}

// The extra source's arguments as the caller gave them: all the required ones, or none. Optional:
// extra_lens (without it every index column counts), extra_lens_rows_per_entry (default 1) and
// extra_window (default extra_indices.shape[1]); each of them alone still asks for the rest.
struct ExtraArgs {
  const std::optional<ArrayView>& kv_cache;
  const std::optional<ArrayView>& inv_scale;
  const std::optional<ArrayView>& indices;
  const std::optional<ArrayView>& lens;
  std::optional<int64_t> lens_rows_per_entry;
  std::optional<int64_t> block_size;
  std::optional<int64_t> window;
  swa_decode::KvFormat format;

  bool any() const {
    return kv_cache || inv_scale || indices || lens || lens_rows_per_entry || block_size || window;
  }
};

// DecodeArgs::extra for the extra arguments: none given, no extra source (kv_cache == nullptr).
swa_decode::KvSource checked_extra(const ExtraArgs& extra, const ArrayView& q, int bf16_views) {
  if (!extra.any()) return {};
  // A 'model1' source keeps its scales in the cache: extra_inv_scale is optional there.
  const bool needs_scales = extra.format != swa_decode::KvFormat::kModel1;
  // In the order of decode()'s arguments; an optional one is listed only when given.
  struct Arg {
    const char* name;
    bool present, required;
  };
  const Arg args[] = {{kExtraNames.kv_cache, extra.kv_cache.has_value(), true},
                      {kExtraNames.inv_scale, extra.inv_scale.has_value(), needs_scales},
                      {kExtraNames.indices, extra.indices.has_value(), true},
                      {kExtraNames.lens, extra.lens.has_value(), false},
                      {kExtraNames.block_size, extra.block_size.has_value(), true},
                      {kExtraNames.max_entries, extra.window.has_value(), false},
                      {kExtraNames.lens_rows_per_entry, extra.lens_rows_per_entry.has_value(), false}};
  std::string missing, given;
  for (const Arg& arg : args) {
    if (!arg.present && !arg.required) continue;
    std::string& list = arg.present ? given : missing;
    list += (list.empty() ? "" : ", ") + std::string(arg.name);
  }
  if (!missing.empty()) {
    value_error(std::string("an extra source needs extra_kv_cache, ") +
                (needs_scales ? "extra_inv_scale, " : "") +
                "extra_indices and extra_block_size (extra_lens, extra_window and "
                "extra_lens_rows_per_entry are optional); missing " + missing + " (given: " + given + ")");
  }
  // A rank other than 2 is checked_source's to report; the default is not read then.
  const int64_t window =
      extra.window.value_or(extra.indices->ndim() == 2 ? extra.indices->shape(1) : 0);
  swa_decode::KvSource source =
      checked_source(*extra.kv_cache, extra.inv_scale, *extra.indices, extra.lens,
                     extra.lens_rows_per_entry.value_or(1), *extra.block_size, window,
                     extra.format, kExtraNames, q, bf16_views);
  // An empty tensor may carry a null data pointer, and a null extra.kv_cache means "no extra
  // source" to the library: an extra cache without blocks would be dropped silently, not refused
  // by validate_args (for the window, num_blocks >= 1 is validate_args' to report).
  if (source.num_blocks < 1) {
    value_error("extra_kv_cache.shape[0] (num_blocks) must be >= 1, got " +
                std::to_string(source.num_blocks));
  }
  return source;
}

std::string shape_string(const ArrayView& a) {  // as Python prints tuple(shape)
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

}  // namespace

// out[t, h, :] = attention of q[t, h, :] over token t's window entries and, with an extra
// source, its extra entries, in one softmax; see docs/semantics.md.
void run_decode(const DecodeArrays& a, const DecodeScalars& s, uintptr_t stream, int bf16_views) {
  const ArrayView& q = a.q;
  ArrayView indices = a.indices;
  if (indices.ndim() == 3) {
    if (indices.shape(0) != 1) {
      value_error(std::string("indices must be ") + kIndicesLayout + ", got shape " +
                  shape_string(indices));
    }
    indices = indices.without_leading_dim();
  }

  // ---- q: its own rank, stride, device and dtype; everything else is checked against it ----
  check_ndim(q, "q", 3, "(num_tokens, num_heads, head_dim)");
  check_unit_stride(q, "q", 2);
  if (q.device_type() != kDLCPU && q.device_type() != kDLCUDA) {
    value_error("q must be on a CPU or CUDA device, got " +
                device_name(q.device_type(), q.device_id()));
  }
  if (!is_bf16(q.dtype(), bf16_views & kViewQ)) {
    type_error("q must have dtype bfloat16, got " + dtype_name(q.dtype()));
  }
  const int64_t num_tokens = q.shape(0);
  const int64_t num_heads = q.shape(1);
  const int64_t head_dim = q.shape(2);
  // pow, as Python's head_dim ** -0.5 computes it. A head_dim < 1 is validate_args' to report,
  // before scale is used, so any finite placeholder serves there.
  const double scale = s.scale.value_or(head_dim > 0 ? std::pow(static_cast<double>(head_dim), -0.5)
                                                     : 1.0);
  // A rank other than 2 is checked_source's to report; the default is not read then.
  const int64_t window_size = s.window_size.value_or(indices.ndim() == 2 ? indices.shape(1) : 0);

  // ---- the KV sources ----
  const swa_decode::KvSource window = checked_source(
      a.kv_cache, a.inv_scale, indices, a.lens, s.lens_rows_per_entry, s.block_size, window_size,
      parsed_format(s.kv_format, kWindowNames.format), kWindowNames, q, bf16_views);
  const swa_decode::KvSource extra = checked_extra(
      ExtraArgs{a.extra_kv_cache, a.extra_inv_scale, a.extra_indices, a.extra_lens,
                s.extra_lens_rows_per_entry, s.extra_block_size, s.extra_window,
                parsed_format(s.extra_kv_format, kExtraNames.format)},
      q, bf16_views);

  // ---- out, attn_sink, lse ----
  const ArrayView& out = a.out;
  const std::optional<ArrayView>& attn_sink = a.attn_sink;
  const std::optional<ArrayView>& lse = a.lse;
  check_ndim(out, "out", 3, "(num_tokens, num_heads, head_dim)");
  check_dim(out, "out", 0, num_tokens, "q.shape[0] (num_tokens)");
  check_dim(out, "out", 1, num_heads, "q.shape[1] (num_heads)");
  check_dim(out, "out", 2, head_dim, "q.shape[2] (head_dim)");
  if (attn_sink) {
    check_ndim(*attn_sink, "attn_sink", 1, "(num_heads,)");
    check_dim(*attn_sink, "attn_sink", 0, num_heads, "q.shape[1] (num_heads)");
  }
  if (lse) {
    check_ndim(*lse, "lse", 2, "(num_tokens, num_heads)");
    check_dim(*lse, "lse", 0, num_tokens, "q.shape[0] (num_tokens)");
    check_dim(*lse, "lse", 1, num_heads, "q.shape[1] (num_heads)");
  }
  check_unit_stride(out, "out", 2);
  if (attn_sink) check_unit_stride(*attn_sink, "attn_sink", 0);
  if (lse) check_unit_stride(*lse, "lse", 1);
  check_same_device(out, "out", q);
  if (attn_sink) check_same_device(*attn_sink, "attn_sink", q);
  if (lse) check_same_device(*lse, "lse", q);
  if (attn_sink && !is_f32(attn_sink->dtype())) {
    type_error("attn_sink must have dtype float32, got " + dtype_name(attn_sink->dtype()));
  }
  if (!is_bf16(out.dtype(), bf16_views & kViewOut)) {
    type_error("out must have dtype bfloat16, got " + dtype_name(out.dtype()));
  }
  if (lse && !is_f32(lse->dtype())) {
    type_error("lse must have dtype float32, got " + dtype_name(lse->dtype()));
  }

  const bool on_cuda = q.device_type() == kDLCUDA;
  const swa_decode::DecodeArgs args{
      .num_tokens = num_tokens,
      .num_heads = num_heads,
      .head_dim = head_dim,
      .num_blocks = window.num_blocks,
      .block_size = window.block_size,
      .window_size = window.max_entries,
      .scale = static_cast<float>(scale),
      .q = q.data(),
      .stride_q_token = q.stride(0),
      .stride_q_head = q.stride(1),
      .kv_cache = window.kv_cache,
      .stride_kv_block = window.stride_kv_block,
      .stride_kv_token = window.stride_kv_token,
      .kv_format = window.format,
      .inv_scale = window.inv_scale,
      .inv_scale_dtype = window.inv_scale_dtype,
      .num_scales = window.num_scales,
      .indices = window.indices,
      .index_dtype = window.index_dtype,
      .index_cols = window.index_cols,
      .stride_indices_token = window.stride_indices_token,
      .lens = window.lens,
      .lens_dtype = window.lens_dtype,
      .lens_rows_per_entry = window.lens_rows_per_entry,
      .extra = extra,
      .attn_sink = attn_sink ? static_cast<const float*>(attn_sink->data()) : nullptr,
      .lse = lse ? static_cast<float*>(lse->data()) : nullptr,
      .stride_lse_token = lse ? lse->stride(0) : 0,
      .empty_token_lse = s.empty_token_lse,
      .out = out.data(),
      .stride_out_token = out.stride(0),
      .stride_out_head = out.stride(1),
      .backend = on_cuda ? swa_decode::Backend::kCuda : swa_decode::Backend::kCpu,
      .stream = reinterpret_cast<CUstream_st*>(stream),
  };

  swa_decode::Status status;
  if (on_cuda) {
    CudaDeviceGuard guard(q.device_id());
    status = swa_decode::decode(args);  // enqueues and returns: no need to drop the GIL
  } else {
    nb::gil_scoped_release no_gil;  // the float64 reference may take seconds
    status = swa_decode::decode(args);
  }
  switch (status.code) {
    case swa_decode::StatusCode::kOk: return;
    case swa_decode::StatusCode::kInvalidArgument:
    case swa_decode::StatusCode::kNotSupported: value_error(status.message);
    case swa_decode::StatusCode::kCudaError:
    case swa_decode::StatusCode::kInternal: throw std::runtime_error(status.message);
  }
  throw std::runtime_error("swa_decode::decode returned an unknown status code " +
                           std::to_string(static_cast<int>(status.code)) + ": " + status.message);
}

// The scalar arguments of the entry points, in their order. empty_lse_positive: +inf (FlashMLA's)
// rather than -inf for a token without entries. A flag, not decode()'s float empty_token_lse: the
// Python layer checks that float in one place and maps it to the flag, which cannot name a third
// value (and the custom ops take the flag too: torch.library's schema parser refuses a float
// default of -inf).
DecodeScalars scalars_of(int64_t block_size, std::optional<double> scale,
                         std::optional<int64_t> window_size, std::optional<int64_t> extra_block_size,
                         std::optional<int64_t> extra_window, std::string kv_format,
                         std::string extra_kv_format, int64_t lens_rows_per_entry,
                         std::optional<int64_t> extra_lens_rows_per_entry,
                         bool empty_lse_positive) {
  return DecodeScalars{.block_size = block_size,
                       .scale = scale,
                       .window_size = window_size,
                       .extra_block_size = extra_block_size,
                       .extra_window = extra_window,
                       .kv_format = std::move(kv_format),
                       .extra_kv_format = std::move(extra_kv_format),
                       .lens_rows_per_entry = lens_rows_per_entry,
                       .extra_lens_rows_per_entry = extra_lens_rows_per_entry,
                       .empty_token_lse = empty_lse_positive
                                              ? swa_decode::EmptyTokenLse::kPositiveInfinity
                                              : swa_decode::EmptyTokenLse::kNegativeInfinity};
}

}  // namespace swa_decode_py
