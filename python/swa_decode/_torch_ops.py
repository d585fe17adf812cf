"""torch.library custom ops ``swa_decode::decode`` and ``swa_decode::decode_out``.

Custom ops (not a plain Python call) so that torch.compile(fullgraph=True) traces through them with
their fake implementations, and so that CUDA-graph capture sees one opaque launch on the current
stream. The real implementations allocate only the outputs, never synchronize, and hand the tensors
to the native binding as DLPack capsules made without stream handshakes (``__dlpack__(stream=-1)``):
the kernel runs on torch's current stream, which is where the inputs were produced.
"""

from __future__ import annotations

from typing import Optional

import torch

from swa_decode import _C


def _capsule(t: torch.Tensor):
    # -1: "no synchronization" in the DLPack stream protocol. The default (None) would make the
    # legacy default stream wait on the current one, which is illegal during CUDA-graph capture.
    if t.device.type == "cuda":
        return t.__dlpack__(stream=-1)
    return t


def _as_e4m3_bytes(kv_cache: torch.Tensor) -> torch.Tensor:
    # Older torch versions cannot export float8 through DLPack; the bytes are the same.
    return kv_cache.view(torch.uint8) if kv_cache.dtype == torch.float8_e4m3fn else kv_cache


def _launch(q, kv_cache, inv_scale, indices, lens, attn_sink, out, lse, block_size, scale,
            window_size, extra_kv_cache, extra_inv_scale, extra_indices, extra_lens,
            extra_block_size, extra_window) -> None:
    stream = torch.cuda.current_stream(q.device).cuda_stream if q.device.type == "cuda" else 0
    # The extra source's arguments go through as given: the binding checks all-or-nothing.
    _C.decode(
        _capsule(q), _capsule(_as_e4m3_bytes(kv_cache)), _capsule(inv_scale), _capsule(indices),
        _capsule(lens), None if attn_sink is None else _capsule(attn_sink), _capsule(out),
        None if lse is None else _capsule(lse), block_size, scale, window_size, stream, 0,
        None if extra_kv_cache is None else _capsule(_as_e4m3_bytes(extra_kv_cache)),
        None if extra_inv_scale is None else _capsule(extra_inv_scale),
        None if extra_indices is None else _capsule(extra_indices),
        None if extra_lens is None else _capsule(extra_lens), extra_block_size, extra_window)


def _lse_shape(q: torch.Tensor, return_lse: bool):
    # Without return_lse the op still returns a tensor (custom ops have a fixed output arity); an
    # empty one costs no memory. A q of the wrong rank is the binding's to report.
    return q.shape[:2] if return_lse else (0,)


# scale and window_size may be None (the binding's defaults: head_dim ** -0.5, indices.shape[-1]);
# indices may be (1, T, W). The extra source (the compressed entries in the same softmax) is the
# last six arguments of both ops, all defaulting to None: callers of the window-only schema keep
# working unchanged.
@torch.library.custom_op("swa_decode::decode", mutates_args=())
def decode_op(q: torch.Tensor, kv_cache: torch.Tensor, inv_scale: torch.Tensor,
              indices: torch.Tensor, lens: torch.Tensor, attn_sink: Optional[torch.Tensor],
              block_size: int, scale: Optional[float], window_size: Optional[int],
              return_lse: bool, extra_kv_cache: Optional[torch.Tensor] = None,
              extra_inv_scale: Optional[torch.Tensor] = None,
              extra_indices: Optional[torch.Tensor] = None,
              extra_lens: Optional[torch.Tensor] = None, extra_block_size: Optional[int] = None,
              extra_window: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """out (T, H, D) bf16 and lse (T, H) fp32 (or (0,) without return_lse); see docs/semantics.md."""
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(_lse_shape(q, return_lse), dtype=torch.float32, device=q.device)
    _launch(q, kv_cache, inv_scale, indices, lens, attn_sink, out, lse if return_lse else None,
            block_size, scale, window_size, extra_kv_cache, extra_inv_scale, extra_indices,
            extra_lens, extra_block_size, extra_window)
    return out, lse


@decode_op.register_fake
def _decode_fake(q, kv_cache, inv_scale, indices, lens, attn_sink, block_size, scale,
                 window_size, return_lse, extra_kv_cache=None, extra_inv_scale=None,
                 extra_indices=None, extra_lens=None, extra_block_size=None, extra_window=None):
    return (q.new_empty(q.shape, dtype=torch.bfloat16),
            q.new_empty(_lse_shape(q, return_lse), dtype=torch.float32))


@torch.library.custom_op("swa_decode::decode_out", mutates_args=("out", "lse"))
def decode_out_op(q: torch.Tensor, kv_cache: torch.Tensor, inv_scale: torch.Tensor,
                  indices: torch.Tensor, lens: torch.Tensor, attn_sink: Optional[torch.Tensor],
                  out: torch.Tensor, lse: Optional[torch.Tensor], block_size: int,
                  scale: Optional[float], window_size: Optional[int],
                  extra_kv_cache: Optional[torch.Tensor] = None,
                  extra_inv_scale: Optional[torch.Tensor] = None,
                  extra_indices: Optional[torch.Tensor] = None,
                  extra_lens: Optional[torch.Tensor] = None,
                  extra_block_size: Optional[int] = None,
                  extra_window: Optional[int] = None) -> None:
    """Writes into the caller's out (T, H, D) bf16 and optional lse (T, H) fp32."""
    _launch(q, kv_cache, inv_scale, indices, lens, attn_sink, out, lse, block_size, scale,
            window_size, extra_kv_cache, extra_inv_scale, extra_indices, extra_lens,
            extra_block_size, extra_window)


@decode_out_op.register_fake
def _decode_out_fake(q, kv_cache, inv_scale, indices, lens, attn_sink, out, lse, block_size, scale,
                     window_size, extra_kv_cache=None, extra_inv_scale=None, extra_indices=None,
                     extra_lens=None, extra_block_size=None, extra_window=None):
    return None
