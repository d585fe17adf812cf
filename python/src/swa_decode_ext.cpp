// The Python binding: arrays in, one swa_decode::DecodeArgs out, one call to swa_decode::decode.
// Three ways in, one set of checks: decode() imports DLPack arrays (any framework) through
// nanobind; decode_exchange() reads the arrays of a framework with the DLPack C exchange API
// (torch tensors) in place, for the eager torch call (docs/perf-notes.md, "Eager Python call"),
// and flash_mla_exchange() (flash_mla_call.h) reads FlashMLA's shapes the same way for
// flash_mla's eager call. All hand ArrayViews to run_decode (run_decode.h), which checks them.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "array_view.h"
#include "exchange_views.h"
#include "flash_mla_call.h"
#include "run_decode.h"
#include "swa_decode/limits.h"
#include "swa_decode/swa_decode.h"

namespace nb = nanobind;

namespace {

using swa_decode_py::ArrayView;
using swa_decode_py::DecodeArrays;
using swa_decode_py::ExchangeViews;
using swa_decode_py::flash_mla_exchange;
using swa_decode_py::kE4m3Name;
using swa_decode_py::kIndicesLayout;
using swa_decode_py::kViewExtraInvScale;
using swa_decode_py::kViewInvScale;
using swa_decode_py::kViewOut;
using swa_decode_py::kViewQ;
using swa_decode_py::run_decode;
using swa_decode_py::scalars_of;

using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

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
