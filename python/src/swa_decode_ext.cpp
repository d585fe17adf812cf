// The Python binding: arrays in, one swa_decode::DecodeArgs out, one call to swa_decode::decode.
// Three ways in, one set of checks: decode() imports DLPack arrays (any framework) through
// nanobind; decode_exchange() reads the arrays of a framework with the DLPack C exchange API
// (torch tensors) in place, for the eager torch call (docs/perf-notes.md, "Eager Python call"),
// and flash_mla_exchange() reads FlashMLA's shapes the same way for flash_mla's eager call.
// All hand ArrayViews to run_decode, which checks what DecodeArgs cannot express (rank, the unit
// stride in D, one device for all, the DLPack dtype of each tensor) and every shape a tensor
// carries that another tensor or an argument can contradict (T, H, D across tensors;
// kv_cache.shape[1] against block_size; inv_scale.shape[0] against the slots; indices.shape[1]
// against window_size), so that DecodeArgs never describes more than the tensors hold and
// messages name the Python argument. It also owns the defaults (scale = D ** -0.5, window_size =
// the index columns) and the (1, T, W) layout of indices. The window and the optional extra source
// (DecodeArgs::extra) are checked by one function, so each rule holds for both under the source's
// own names. Every other rule (ranges, strides, limits, what the GPU supports) is the C++ layer's,
// and its Status comes back as an exception with the message intact: ValueError for
// kInvalidArgument and kNotSupported, RuntimeError for kCudaError and kInternal.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "array_view.h"
#include "dlpack_exchange.h"
#include "swa_decode/limits.h"
#include "swa_decode/swa_decode.h"

namespace nb = nanobind;

namespace {

using swa_decode_py::ArrayView;

using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

// DLPack device types (dlpack.h): the only two a decode can run on.
constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;

// DLPack 1.1 float8 codes, spelled as numbers: nanobind 2.0's dtype_code enum predates them.
constexpr uint8_t kDLFloat8E4M3FN = 10, kDLFloat8E5M2 = 12;

// Bits of `bf16_views`: which of q / inv_scale / out / extra_inv_scale the Python layer re-viewed
// from a bfloat16 dtype DLPack cannot carry (numpy's ml_dtypes) as uint16. Only those may arrive as
// uint16.
constexpr int kViewQ = 1, kViewInvScale = 2, kViewOut = 4, kViewExtraInvScale = 8;

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

// The Python spellings of swa_decode::KvFormat.
constexpr const char* kE4m3Name = "e4m3";
constexpr const char* kModel1Name = "model1";

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

// The layouts the window's indices may have: the seed's batch dimension of one is dropped.
constexpr const char* kIndicesLayout = "2-D (T, W) or 3-D (1, T, W)";

std::string shape_string(const ArrayView& a) {  // as Python prints tuple(shape)
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// The arrays of one call, however they arrived; the optional ones are empty when not given.
struct DecodeArrays {
  ArrayView q, kv_cache, indices, out;
  std::optional<ArrayView> lens;       // absent: every index column counts
  std::optional<ArrayView> inv_scale;  // absent: only for kv_format 'model1'
  std::optional<ArrayView> attn_sink, lse;
  std::optional<ArrayView> extra_kv_cache, extra_inv_scale, extra_indices, extra_lens;
};

// The scalar arguments; an empty one takes its default.
struct DecodeScalars {
  int64_t block_size;
  std::optional<double> scale;         // default: head_dim ** -0.5
  std::optional<int64_t> window_size;  // default: indices.shape[-1]
  std::optional<int64_t> extra_block_size;
  std::optional<int64_t> extra_window;  // default: extra_indices.shape[1] (checked_extra)
  std::string kv_format;                // the Python spelling, parsed_format's to check
  std::string extra_kv_format;
  int64_t lens_rows_per_entry;          // tokens one lens entry covers; validate_args' range
  std::optional<int64_t> extra_lens_rows_per_entry;  // default 1 (checked_extra)
  // -inf (decode's default) or +inf (FlashMLA's, flash_mla_exchange's) for a token without entries.
  swa_decode::EmptyTokenLse empty_token_lse = swa_decode::EmptyTokenLse::kNegativeInfinity;
};

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

template <class Array>
std::optional<ArrayView> optional_view(const std::optional<Array>& a) {
  if (!a) return std::nullopt;
  return swa_decode_py::view_of(*a);
}

// run_decode on DLPack arrays of any framework, imported by nanobind (versioned or legacy
// capsules, objects with __dlpack__, the buffer protocol).
void decode(const InArray& q, const InArray& kv_cache, const std::optional<InArray>& inv_scale,
            const InArray& indices, const std::optional<InArray>& lens,
            const std::optional<InArray>& attn_sink,
            OutArray out, std::optional<OutArray> lse, int64_t block_size,
            std::optional<double> scale, std::optional<int64_t> window_size, uintptr_t stream,
            int bf16_views, const std::optional<InArray>& extra_kv_cache,
            const std::optional<InArray>& extra_inv_scale,
            const std::optional<InArray>& extra_indices, const std::optional<InArray>& extra_lens,
            std::optional<int64_t> extra_block_size, std::optional<int64_t> extra_window,
            std::string kv_format, std::string extra_kv_format, int64_t lens_rows_per_entry,
            std::optional<int64_t> extra_lens_rows_per_entry, bool empty_lse_positive) {
  using swa_decode_py::view_of;
  const DecodeArrays arrays{.q = view_of(q),
                            .kv_cache = view_of(kv_cache),
                            .indices = view_of(indices),
                            .out = view_of(out),
                            .lens = optional_view(lens),
                            .inv_scale = optional_view(inv_scale),
                            .attn_sink = optional_view(attn_sink),
                            .lse = optional_view(lse),
                            .extra_kv_cache = optional_view(extra_kv_cache),
                            .extra_inv_scale = optional_view(extra_inv_scale),
                            .extra_indices = optional_view(extra_indices),
                            .extra_lens = optional_view(extra_lens)};
  run_decode(arrays,
             scalars_of(block_size, scale, window_size, extra_block_size, extra_window,
                        std::move(kv_format), std::move(extra_kv_format), lens_rows_per_entry,
                        extra_lens_rows_per_entry, empty_lse_positive),
             stream, bf16_views);
}

// Views of the first T = q.shape[0] rows of the seed's indices ((T', W) or (1, T', W)) and lens
// ((T',), or absent as in decode()), T' >= T, with their new shapes in index_dims and lens_rows.
// False for any other layout.
bool first_rows(const ArrayView& q, ArrayView* indices, std::optional<ArrayView>* lens,
                int64_t (&index_dims)[2], int64_t (&lens_rows)[1]) {
  if (q.ndim() != 3) return false;  // the general path leaves the rows alone and reports q
  if (indices->ndim() == 3 && indices->shape(0) == 1) *indices = indices->without_leading_dim();
  const int64_t num_tokens = q.shape(0);
  if (indices->ndim() != 2 || indices->shape(0) < num_tokens ||
      (*lens && ((*lens)->ndim() != 1 || (*lens)->shape(0) < num_tokens))) {
    return false;
  }
  index_dims[0] = num_tokens;
  index_dims[1] = indices->shape(1);
  indices->dims = index_dims;
  lens_rows[0] = num_tokens;
  if (*lens) (*lens)->dims = lens_rows;
  return true;
}

// The arrays of one call through the DLPack C exchange API, read in place: q's, and each other
// argument's when it is an array of q's type (or a subtype) that the API can describe, on q's
// device. Every step says false, having read nothing it cannot vouch for, and the caller then
// takes its general path, which reports what is wrong in its own words.
class ExchangeViews {
 public:
  // q's view; false when q's type has no usable exchange API or q is on neither the CPU nor a
  // CUDA device.
  bool begin(nb::handle q, ArrayView* q_view) {
    api_ = swa_decode_py::exchange_api_of(q.ptr());
    if (api_ == nullptr || !swa_decode_py::exchange_view(api_, q.ptr(), q_view)) return false;
    if (q_view->device_type() != kDLCPU && q_view->device_type() != kDLCUDA) return false;
    type_ = Py_TYPE(q.ptr());
    q_ = *q_view;
    return true;
  }
  bool view(nb::handle h, ArrayView* v) const {
    return PyObject_TypeCheck(h.ptr(), type_) && swa_decode_py::exchange_view(api_, h.ptr(), v) &&
           v->device_type() == q_.device_type() && v->device_id() == q_.device_id();
  }
  bool view_if_given(nb::handle h, std::optional<ArrayView>* v) const {
    if (h.is_none()) return true;
    ArrayView given;
    if (!view(h, &given)) return false;
    *v = given;
    return true;
  }
  // The framework's current stream on q's device (0 for CPU arrays).
  bool stream(uintptr_t* stream) const {
    *stream = 0;
    return q_.device_type() != kDLCUDA ||
           swa_decode_py::exchange_current_stream(api_, q_.device_id(), stream);
  }

 private:
  const swa_decode_py::ExchangeApi* api_ = nullptr;
  PyTypeObject* type_ = nullptr;
  ArrayView q_{};
};

// run_decode on the arrays of a framework with the DLPack C exchange API (torch tensors), read in
// place and run on the framework's current stream of q's device. Returns false, having run
// nothing, when ExchangeViews cannot vouch for an argument; everything else raises here as from
// decode().
//
// seed_rows: native_swa_decode_attention's convention, indices (T', W) or (1, T', W) and lens (T',)
// with T' >= T = q.shape[0], of which the first T rows are read; any other layout is refused, and
// the general path reports it in the seed's argument names.
bool decode_exchange(nb::handle q, nb::handle kv_cache, nb::handle inv_scale, nb::handle indices,
                     nb::handle lens, nb::handle attn_sink, nb::handle out, nb::handle lse,
                     int64_t block_size, std::optional<double> scale,
                     std::optional<int64_t> window_size, nb::handle extra_kv_cache,
                     nb::handle extra_inv_scale, nb::handle extra_indices, nb::handle extra_lens,
                     std::optional<int64_t> extra_block_size, std::optional<int64_t> extra_window,
                     std::string kv_format, std::string extra_kv_format,
                     int64_t lens_rows_per_entry,
                     std::optional<int64_t> extra_lens_rows_per_entry, bool seed_rows,
                     bool empty_lse_positive) {
  ExchangeViews views;
  DecodeArrays a{};
  if (!views.begin(q, &a.q)) return false;
  if (!views.view(kv_cache, &a.kv_cache) || !views.view_if_given(inv_scale, &a.inv_scale) ||
      !views.view(indices, &a.indices) || !views.view_if_given(lens, &a.lens) ||
      !views.view(out, &a.out) || !views.view_if_given(attn_sink, &a.attn_sink) ||
      !views.view_if_given(lse, &a.lse) || !views.view_if_given(extra_kv_cache, &a.extra_kv_cache) ||
      !views.view_if_given(extra_inv_scale, &a.extra_inv_scale) ||
      !views.view_if_given(extra_indices, &a.extra_indices) ||
      !views.view_if_given(extra_lens, &a.extra_lens)) {
    return false;
  }
  // The first T rows' shapes, for views of the seed's longer tensors; they outlive run_decode.
  int64_t index_dims[2], lens_rows[1];
  if (seed_rows && !first_rows(a.q, &a.indices, &a.lens, index_dims, lens_rows)) return false;
  uintptr_t stream = 0;
  if (!views.stream(&stream)) return false;
  run_decode(a,
             scalars_of(block_size, scale, window_size, extra_block_size, extra_window,
                        std::move(kv_format), std::move(extra_kv_format), lens_rows_per_entry,
                        extra_lens_rows_per_entry, empty_lse_positive),
             stream, /*bf16_views=*/0);
  return true;
}

// The shape and strides of a view whose dimensions were regrouped (FlashMLA's arrays read as the
// library's rows); it must outlive the view.
struct RegroupedDims {
  int64_t dims[3];
  int64_t strides[3];
};

// `a` with its two leading dimensions as one (FlashMLA's (b, s_q, ...) as b * s_q rows), when one
// stride walks them: the batch stride is s_q times the row stride, or either dimension has one
// element. Rank 2 to 4.
bool merge_leading_dims(ArrayView* a, RegroupedDims* storage) {
  if (a->ndim() < 2 || a->ndim() > 4) return false;
  const int64_t batch = a->shape(0), rows = a->shape(1);
  int64_t stride = a->stride(1);
  if (rows == 1) {
    stride = a->stride(0);
  } else if (batch > 1 && a->stride(0) != rows * a->stride(1)) {
    return false;
  }
  storage->dims[0] = batch * rows;
  storage->strides[0] = stride;
  for (size_t i = 2; i < a->ndim(); ++i) {
    storage->dims[i - 1] = a->shape(i);
    storage->strides[i - 1] = a->stride(i);
  }
  a->rank -= 1;
  a->dims = storage->dims;
  a->strides_ = storage->strides;
  return true;
}

// FlashMLA's lse (b, h_q, s_q) as the library's (b * s_q, h_q) rows: its last two dimensions
// swapped, then merged.
bool lse_rows(ArrayView* lse, RegroupedDims* storage) {
  if (lse->ndim() != 3) return false;
  RegroupedDims swapped{.dims = {lse->shape(0), lse->shape(2), lse->shape(1)},
                        .strides = {lse->stride(0), lse->stride(2), lse->stride(1)}};
  lse->dims = swapped.dims;
  lse->strides_ = swapped.strides;
  return merge_leading_dims(lse, storage);
}

// Whether a has `rank` dimensions whose leading ones are (batch, s_q) (FlashMLA's per-row arrays).
bool has_rows(const ArrayView& a, size_t rank, int64_t batch, int64_t s_q) {
  return a.ndim() == rank && a.shape(0) == batch && a.shape(1) == s_q;
}

// swa_decode.flash_mla.flash_mla_with_kvcache on torch tensors outside any trace, with FlashMLA's
// shapes read in place: q and out (b, s_q, h_q, 512), indices and extra_indices (b, s_q, topk),
// topk_length and extra_topk_length (b,) (one length for the s_q rows of a batch row), lse
// (b, h_q, s_q) (the caller's, any strides that swap and merge into rows), both caches kModel1
// (their block size is their shape[1]). The kernel writes +inf for a row without entries, FlashMLA's
// convention. False, having run nothing, for anything else (an argument ExchangeViews refuses, a
// shape that is not FlashMLA's, strides that do not merge): the caller's general path reshapes
// and reports. Everything the library checks raises as from decode().
bool flash_mla_exchange(nb::handle q, nb::handle k_cache, nb::handle indices, nb::handle topk_length,
                        nb::handle attn_sink, nb::handle out, nb::handle lse,
                        std::optional<double> scale, nb::handle extra_k_cache,
                        nb::handle extra_indices, nb::handle extra_topk_length) {
  ExchangeViews views;
  DecodeArrays a{};
  if (!views.begin(q, &a.q)) return false;
  ArrayView lse_view;
  if (!views.view(k_cache, &a.kv_cache) || !views.view(indices, &a.indices) ||
      !views.view_if_given(topk_length, &a.lens) || !views.view(out, &a.out) ||
      !views.view_if_given(attn_sink, &a.attn_sink) || !views.view(lse, &lse_view) ||
      !views.view_if_given(extra_k_cache, &a.extra_kv_cache) ||
      !views.view_if_given(extra_indices, &a.extra_indices) ||
      !views.view_if_given(extra_topk_length, &a.extra_lens)) {
    return false;
  }
  const bool has_extra = a.extra_kv_cache.has_value();
  if (has_extra != a.extra_indices.has_value() || (!has_extra && a.extra_lens)) return false;
  if (a.q.ndim() != 4 || a.kv_cache.ndim() < 2 || (has_extra && a.extra_kv_cache->ndim() < 2)) {
    return false;
  }
  const int64_t batch = a.q.shape(0), s_q = a.q.shape(1), h_q = a.q.shape(2);
  const auto is_batch_lengths = [&](const std::optional<ArrayView>& lens) {
    return !lens || (lens->ndim() == 1 && lens->shape(0) == batch);
  };
  if (!has_rows(a.indices, 3, batch, s_q) || !is_batch_lengths(a.lens) ||
      (has_extra && !has_rows(*a.extra_indices, 3, batch, s_q)) || !is_batch_lengths(a.extra_lens) ||
      !has_rows(a.out, 4, batch, s_q) || a.out.shape(2) != h_q || a.out.shape(3) != a.q.shape(3) ||
      lse_view.ndim() != 3 || lse_view.shape(0) != batch || lse_view.shape(1) != h_q ||
      lse_view.shape(2) != s_q) {
    return false;
  }
  RegroupedDims q_rows, out_rows, index_rows, extra_index_rows, lse_storage;
  if (!merge_leading_dims(&a.q, &q_rows) || !merge_leading_dims(&a.out, &out_rows) ||
      !merge_leading_dims(&a.indices, &index_rows) ||
      (has_extra && !merge_leading_dims(&*a.extra_indices, &extra_index_rows)) ||
      !lse_rows(&lse_view, &lse_storage)) {
    return false;
  }
  a.lse = lse_view;
  uintptr_t stream = 0;
  if (!views.stream(&stream)) return false;
  const auto extra_block_size =
      has_extra ? std::optional<int64_t>(a.extra_kv_cache->shape(1)) : std::nullopt;
  run_decode(a,
             scalars_of(a.kv_cache.shape(1), scale, std::nullopt, extra_block_size, std::nullopt,
                        kModel1Name, kModel1Name, s_q,
                        has_extra ? std::optional<int64_t>(s_q) : std::nullopt,
                        /*empty_lse_positive=*/true),
             stream, /*bf16_views=*/0);
  return true;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "swa_decode's native binding; use the functions of the swa_decode package instead.";
  m.def("decode", &decode, nb::arg("q"), nb::arg("kv_cache"), nb::arg("inv_scale").none(),
        nb::arg("indices"), nb::arg("lens").none(), nb::arg("attn_sink").none(), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("block_size"), nb::arg("scale").none(),
        nb::arg("window_size").none(), nb::arg("stream"), nb::arg("bf16_views") = 0,
        nb::arg("extra_kv_cache").none() = nb::none(),
        nb::arg("extra_inv_scale").none() = nb::none(),
        nb::arg("extra_indices").none() = nb::none(), nb::arg("extra_lens").none() = nb::none(),
        nb::arg("extra_block_size").none() = nb::none(),
        nb::arg("extra_window").none() = nb::none(), nb::arg("kv_format") = kE4m3Name,
        nb::arg("extra_kv_format") = kE4m3Name, nb::arg("lens_rows_per_entry") = 1,
        nb::arg("extra_lens_rows_per_entry").none() = nb::none(),
        nb::arg("empty_lse_positive") = false,
        "Runs swa_decode::decode on DLPack tensors. CUDA work is enqueued on `stream` (a "
        "cudaStream_t as an integer, 0 = legacy default stream) and not waited for. scale and "
        "window_size default (None) to head_dim ** -0.5 and indices.shape[-1]; indices may be "
        "(1, T, W). The extra_* arguments are the optional second KV source (all of them or none; "
        "extra_window defaults to extra_indices.shape[1]). kv_format / extra_kv_format: 'e4m3' or "
        "'model1' (584-byte rows with their scales; inv_scale may then be None). lens (or "
        "extra_lens) None: every index column counts; lens_rows_per_entry (or "
        "extra_lens_rows_per_entry) n: lens holds one length per n consecutive rows (T / n). "
        "empty_lse_positive: +inf (EmptyTokenLse::kPositiveInfinity) instead of -inf as the lse of "
        "a token without entries.");
  m.def("decode_exchange", &decode_exchange, nb::arg("q"), nb::arg("kv_cache"),
        nb::arg("inv_scale").none(), nb::arg("indices"), nb::arg("lens").none(),
        nb::arg("attn_sink").none(),
        nb::arg("out"), nb::arg("lse").none(), nb::arg("block_size"), nb::arg("scale").none(),
        nb::arg("window_size").none(), nb::arg("extra_kv_cache").none(),
        nb::arg("extra_inv_scale").none(), nb::arg("extra_indices").none(),
        nb::arg("extra_lens").none(), nb::arg("extra_block_size").none(),
        nb::arg("extra_window").none(), nb::arg("kv_format") = kE4m3Name,
        nb::arg("extra_kv_format") = kE4m3Name, nb::arg("lens_rows_per_entry") = 1,
        nb::arg("extra_lens_rows_per_entry").none() = nb::none(), nb::arg("seed_rows") = false,
        nb::arg("empty_lse_positive") = false,
        "decode() for arrays whose type has the DLPack C exchange API (torch.Tensor), read in "
        "place and run on the framework's current stream. Returns False, having run nothing, "
        "when an argument is not such an array on q's device (or q is on neither the CPU nor a "
        "CUDA device): the caller then takes the general path. seed_rows: indices and lens may "
        "have more rows than q (native_swa_decode_attention's convention); the first T are read.");
  m.def("flash_mla_exchange", &flash_mla_exchange, nb::arg("q"), nb::arg("k_cache"),
        nb::arg("indices"), nb::arg("topk_length").none(), nb::arg("attn_sink").none(),
        nb::arg("out"), nb::arg("lse"), nb::arg("scale").none(), nb::arg("extra_k_cache").none(),
        nb::arg("extra_indices").none(), nb::arg("extra_topk_length").none(),
        "flash_mla.flash_mla_with_kvcache's eager call: FlashMLA's shapes (q, out (b, s_q, h_q, "
        "512), indices (b, s_q, topk), lengths (b,), lse (b, h_q, s_q)) read in place, 'model1' "
        "caches, +inf lse for a row without entries. Returns False, having run nothing, for "
        "anything it cannot read so: the caller then takes the general path.");
  m.def("version", []() { return std::string(swa_decode::version()); });
  // include/swa_decode/limits.h, re-exported by swa_decode.limits.
  m.attr("GPU_HEAD_DIM") = swa_decode::kGpuHeadDim;
  m.attr("MAX_GPU_HEADS") = swa_decode::kMaxGpuHeads;
  m.attr("MAX_WINDOW") = swa_decode::kMaxWindow;
  m.attr("MAX_EXTRA_ENTRIES") = swa_decode::kMaxExtraEntries;
  m.attr("INDICES_LAYOUT") = kIndicesLayout;
  m.attr("kViewQ") = kViewQ;
  m.attr("kViewInvScale") = kViewInvScale;
  m.attr("kViewOut") = kViewOut;
  m.attr("kViewExtraInvScale") = kViewExtraInvScale;
}
