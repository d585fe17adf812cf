// The binding's entry point for flash_mla.flash_mla_with_kvcache's eager call (python/swa_decode/
// flash_mla.py): FlashMLA's shapes read in place and run through run_decode.
#pragma once

#include <optional>

#include <nanobind/nanobind.h>

namespace swa_decode_py {

// swa_decode.flash_mla.flash_mla_with_kvcache on torch tensors outside any trace, with FlashMLA's
// shapes read in place: q and out (b, s_q, h_q, 512), indices and extra_indices (b, s_q, topk),
// topk_length and extra_topk_length (b,) (one length for the s_q rows of a batch row), lse
// (b, h_q, s_q) (the caller's, any strides that swap and merge into rows), both caches kModel1
// (their block size is their shape[1]). The kernel writes +inf for a row without entries, FlashMLA's
// convention. False, having run nothing, for anything else (an argument ExchangeViews refuses, a
// shape that is not FlashMLA's, strides that do not merge): the caller's general path reshapes
// and reports. Everything the library checks raises as from decode().
bool flash_mla_exchange(nanobind::handle q, nanobind::handle k_cache, nanobind::handle indices,
                        nanobind::handle topk_length, nanobind::handle attn_sink, nanobind::handle out,
                        nanobind::handle lse, std::optional<double> scale, nanobind::handle extra_k_cache,
                        nanobind::handle extra_indices, nanobind::handle extra_topk_length);

}  // namespace swa_decode_py
