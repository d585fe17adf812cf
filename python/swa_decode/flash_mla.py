"""FlashMLA's sparse-decode entry point over swa_decode, for engines (vLLM, SGLang) that call
``flash_mla_interface.get_mla_metadata`` and ``flash_mla_interface.flash_mla_with_kvcache`` on
DeepSeek-V4's "MODEL1" cache (584-byte rows, docs/semantics.md "Row formats"). Switch with one
import: ``from swa_decode import flash_mla as flash_mla_interface``.

Differences from FlashMLA: any h_q from 1 to 128 (FlashMLA pads to 64 or 128 heads); topk up to
limits.MAX_WINDOW for indices and limits.MAX_EXTRA_ENTRIES for the extra ones; ids outside the cache are never read (FlashMLA reads any id other than -1); no
scheduler metadata and no scratch beyond out and lse, so a call with out= can be captured in a
CUDA graph. CUDA tensors run the GPU kernels, CPU tensors the float64 reference.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from swa_decode import _C
from swa_decode import _torch_ops
from swa_decode._api import decode

HEAD_DIM = 512  # q, k and v: MODEL1 rows are 512 dims (448 e4m3 + 64 bf16 RoPE)


class MlaMetadata:
    """What get_mla_metadata returns: nothing the decode needs. It pins no shape or length, so one
    object serves every layer and every step. It unpacks as FlashMLA's (metadata, num_splits)
    pair, num_splits None, so both ``m = get_mla_metadata(...)`` and ``m, n =
    get_mla_metadata(...)`` work."""

    __slots__ = ()

    def __iter__(self):
        return iter((self, None))

    def __repr__(self) -> str:
        return "swa_decode.flash_mla.MlaMetadata()"


_METADATA = MlaMetadata()


def get_mla_metadata(*args, **kwargs) -> MlaMetadata:
    """FlashMLA's scheduler metadata: its arguments (cache_seqlens, num_q_tokens_per_head_k,
    num_heads_k, num_heads_q, is_fp8_kvcache, topk, ...) are accepted and ignored."""
    del args, kwargs
    return _METADATA


def _batch_lens(topk_length, name: str, batch: int):
    """FlashMLA's (batch,) lengths, one per batch row for all its s_q query rows, as they are: the
    library reads them in place with lens_rows_per_entry = s_q, and None as "every index column
    counts". Nothing is allocated for either."""
    if topk_length is None:
        return None
    if not isinstance(topk_length, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (batch,) int32 or None, got "
                        f"{type(topk_length).__name__}")
    if topk_length.ndim != 1 or topk_length.shape[0] != batch:
        raise ValueError(f"{name} must be (batch,) = ({batch},) (one length per batch row), got "
                         f"shape {tuple(topk_length.shape)}")
    return topk_length


def _rows(indices, name: str, batch: int, s_q: int):
    """FlashMLA's (batch, s_q, topk) indices as the library's (batch * s_q, topk): a view when the
    batch and s_q strides allow it (they do for a contiguous tensor)."""
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (batch, s_q, topk) int32, got "
                        f"{type(indices).__name__}")
    if indices.ndim != 3 or tuple(indices.shape[:2]) != (batch, s_q):
        raise ValueError(f"{name} must be (batch, s_q, topk) with (batch, s_q) = ({batch}, {s_q}) "
                         f"from q, got shape {tuple(indices.shape)}")
    return indices.reshape(batch * s_q, indices.shape[2])


def _flash_mla_eager(q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
                     extra_topk_length, scale, out):
    """The call for torch tensors outside any trace (``_torch_ops.eager(q)``, q 4-D): the binding
    reads FlashMLA's shapes in place and the kernel writes the +inf of an empty row, so the call
    costs two allocations (lse, and out without out=) and one binding call, not the general path's
    reshapes and decode() (~14 -> ~4 us of host time on a CPU, docs/perf-notes.md, where the
    general path still made a pass over lse). None, having run nothing, when the binding cannot
    vouch for the arguments: the general path then reports them."""
    batch, s_q, h_q, _ = q.shape
    out_given = out is not None
    if not out_given:  # q's shape and dtype (bf16, or the binding raises): 1.0 us, torch.empty 2.5
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    # The layout the general path returns: (b, h_q, s_q) over a (b, s_q, h_q) buffer.
    lse = torch.empty_strided((batch, h_q, s_q), (s_q * h_q, 1, h_q), dtype=torch.float32,
                              device=q.device)
    if not _C.flash_mla_exchange(q, k_cache, indices, topk_length, attn_sink, out, lse, scale,
                                 extra_k_cache, extra_indices, extra_topk_length):
        return None
    if out_given:  # as decode_out_op's ADInplaceOrView kernel does for its mutated arguments
        _torch_ops.increment_versions((out,))
    return out, lse


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None, out=None):
    """FlashMLA's sparse decode on MODEL1 caches: attention of each query row over the cache rows
    its indices name and, with an extra cache, over those its extra indices name, in one softmax.

    q (b, s_q, h_q, 512) bf16, h_q 1..128; k_cache and extra_k_cache (num_blocks, B, 1, 584)
    uint8, int8 or float8_e4m3fn MODEL1 bytes, the block stride padded (FlashMLA's k_cache);
    indices and extra_indices_in_kvcache (b, s_q, topk) int32 slot ids (block * B + offset), -1 =
    none; topk_length and extra_topk_length (b,) int32, the leading columns each batch row's s_q
    query rows read (None: all topk); attn_sink (h_q,) fp32 or None; softmax_scale defaults to
    512 ** -0.5. block_table, cache_seqlens, tile_scheduler_metadata and num_splits are not read.

    Returns (out (b, s_q, h_q, 512) bf16, lse (b, h_q, s_q) fp32): lse is the natural log of the
    softmax denominator without the sink, +inf for a row with no entry (as FlashMLA; decode()'s
    default is -inf), a view of a (b, s_q, h_q) buffer. out= writes into the caller's
    (b, s_q, h_q, 512) bf16 tensor. Allocates lse and, when not given, out: nothing else (the
    lengths are read in place, _batch_lens).

    The dense path (indices None), causal=True, a bf16 cache (is_fp8_kvcache False) and
    head_dim_v other than 512 are refused; valid arguments no GPU kernel of this build runs
    raise the library's kNotSupported message (ValueError).
    """
    del block_table, cache_seqlens, tile_scheduler_metadata, num_splits  # no dense path, no plan
    if indices is None:
        raise NotImplementedError("indices=None (FlashMLA's dense decode) is not implemented: "
                                  "swa_decode reads sparse indices (b, s_q, topk) only")
    if causal:
        raise NotImplementedError("causal=True is not implemented: the sparse decode has no "
                                  "causal mask (the indices say what each row attends)")
    if not is_fp8_kvcache:
        raise NotImplementedError("is_fp8_kvcache=False (a bf16 cache) is not implemented: "
                                  "k_cache must be MODEL1 fp8 rows (is_fp8_kvcache=True)")
    if head_dim_v != HEAD_DIM:
        raise ValueError(f"head_dim_v must be {HEAD_DIM} (MODEL1 rows, K = V), got {head_dim_v!r}")
    if extra_k_cache is None and (extra_indices_in_kvcache is not None
                                  or extra_topk_length is not None):
        raise ValueError("extra_indices_in_kvcache and extra_topk_length need extra_k_cache")
    if extra_k_cache is not None and extra_indices_in_kvcache is None:
        raise ValueError("extra_k_cache needs extra_indices_in_kvcache (b, s_q, topk) int32")
    scale = None if softmax_scale is None else float(softmax_scale)  # None: 512 ** -0.5
    if _torch_ops.eager(q) and q.ndim == 4:
        result = _flash_mla_eager(q, k_cache, indices, topk_length, attn_sink, extra_k_cache,
                                  extra_indices_in_kvcache, extra_topk_length, scale, out)
        if result is not None:
            return result
    # The general path: a traced call (the custom ops), or arguments the binding refused.
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor (b, s_q, h_q, 512) bf16, got "
                        f"{type(q).__name__}")
    if q.ndim != 4:
        raise ValueError(f"q must be 4-D (b, s_q, h_q, {HEAD_DIM}), got shape {tuple(q.shape)}")
    batch, s_q, h_q, head_dim = q.shape
    for name, cache in (("k_cache", k_cache), ("extra_k_cache", extra_k_cache)):
        # Its block size is read here; every other rule of the layout is the binding's to check.
        if cache is not None and getattr(cache, "ndim", 0) < 2:
            raise ValueError(f"{name} must be a torch.Tensor (num_blocks, B, 1, 584), got "
                             f"{getattr(cache, 'shape', type(cache).__name__)}")
    rows = batch * s_q
    window = _rows(indices, "indices", batch, s_q)
    lens = _batch_lens(topk_length, "topk_length", batch)
    extra = {}
    if extra_k_cache is not None:
        extra = dict(extra_kv_cache=extra_k_cache,
                     extra_indices=_rows(extra_indices_in_kvcache, "extra_indices_in_kvcache",
                                         batch, s_q),
                     extra_lens=_batch_lens(extra_topk_length, "extra_topk_length", batch),
                     extra_lens_rows_per_entry=s_q, extra_block_size=extra_k_cache.shape[1],
                     extra_kv_format="model1")
    if out is None:
        out = torch.empty((batch, s_q, h_q, head_dim), dtype=torch.bfloat16, device=q.device)
    elif not isinstance(out, torch.Tensor) or tuple(out.shape) != (batch, s_q, h_q, head_dim):
        raise ValueError(f"out must be a torch.Tensor of q's shape {tuple(q.shape)}, got "
                         f"{getattr(out, 'shape', type(out).__name__)}")
    try:
        out_rows = out.view(rows, h_q, head_dim)
    except RuntimeError:
        raise ValueError(f"out must be viewable as (b * s_q, h_q, {head_dim}) (b and s_q "
                         f"strides that merge), got strides {out.stride()}") from None
    # The library's lse is (rows, h_q) with unit stride in h_q; FlashMLA's (b, h_q, s_q) is its
    # transpose, a view.
    lse_rows = torch.empty((rows, h_q), dtype=torch.float32, device=q.device)
    if scale is None:
        scale = HEAD_DIM ** -0.5
    # FlashMLA's +inf for an empty row, written by the kernel as in the eager call.
    decode(q.reshape(rows, h_q, head_dim), k_cache, None, window, lens,
           block_size=k_cache.shape[1], scale=scale, attn_sink=attn_sink, out=out_rows,
           return_lse=True, lse=lse_rows, kv_format="model1", lens_rows_per_entry=s_q,
           empty_token_lse=math.inf, **extra)
    return out, lse_rows.view(batch, s_q, h_q).transpose(1, 2)
