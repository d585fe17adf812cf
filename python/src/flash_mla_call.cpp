// flash_mla_exchange (flash_mla_call.h): FlashMLA's arrays regrouped into the library's rows.
#include "flash_mla_call.h"

#include <cstdint>
#include <optional>

#include <nanobind/nanobind.h>

#include "array_view.h"
#include "exchange_views.h"
#include "run_decode.h"

namespace nb = nanobind;

namespace swa_decode_py {
namespace {

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

}  // namespace

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

}  // namespace swa_decode_py
