"""torch.library custom ops ``swa_decode::decode`` and ``swa_decode::decode_out``, and the eager
call that bypasses them when nothing traces it.

Custom ops (not a plain Python call) so that torch.compile(fullgraph=True) traces through them with
their fake implementations, and so that CUDA-graph capture sees one opaque launch on the current
stream. Their dispatch alone costs ~13 us of host time per call, so an eager call that nothing
traces (``eager``) skips it (``decode_eager``): the result, the checks and their messages are the
ops' (one binding function checks both), only the dispatcher is left out.

Both hand the tensors to the binding through the DLPack C exchange API (``_C.decode_exchange``,
torch >= 2.10): read in place, launched on torch's current stream, tens of nanoseconds per tensor.
Where torch has no such API the ops fall back to DLPack capsules made without stream handshakes
(``__dlpack__(stream=-1)``, ~2 us per tensor), and the eager call to the ops. Nothing allocates but
the outputs, nothing synchronizes.
"""

from __future__ import annotations

from typing import Optional

import torch

from swa_decode import _C

# What eager() asks, each one call into torch's C++ (~0.1 us); where one is missing (older torch),
# every call takes the custom ops.
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
_tracing_state = getattr(torch._C, "_get_tracing_state", None)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# Without the exchange API (torch < 2.10; the binding reads both its names) the binding would
# refuse every eager call.
_CAN_SKIP_DISPATCH = (None not in (_is_compiling, _dispatch_modes, _tracing_state)
                      and (hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
                           or hasattr(torch.Tensor, "__c_dlpack_exchange_api__")))

_NO_EXTRA = (None,) * 6


def eager(q) -> bool:
    """True when nothing would see the custom op's dispatch: no torch.compile / export trace, no
    torch_dispatch mode (make_fx, FakeTensorMode, FlopCounterMode, ...: they record or replace ops
    there), no torch.jit trace, and q a plain torch.Tensor (not a subclass such as FakeTensor or
    FunctionalTensor). Other arguments may be subclasses with storage (nn.Parameter) and are read
    as tensors; wrapper subclasses, and tensors under vmap or torch.func transforms, have no
    storage the DLPack exchange can describe, so the binding refuses them and the call takes the
    ops. torch_function modes (e.g. ``with torch.device(...)``) do not see an eager call."""
    return (_CAN_SKIP_DISPATCH and not _is_compiling() and type(q) is torch.Tensor
            and _dispatch_modes() == 0 and _tracing_state() is None)


def _requires_grad(q, kv_cache, inv_scale, attn_sink, extra) -> bool:
    """Whether an input the op reads as floating point requires grad (or is not a tensor, which
    the ops' path reports)."""
    try:
        if (q.requires_grad or kv_cache.requires_grad
                or (inv_scale is not None and inv_scale.requires_grad)
                or (attn_sink is not None and attn_sink.requires_grad)):
            return True
    except AttributeError:
        return True
    return extra is not None and any(getattr(t, "requires_grad", False) for t in extra[:2])


def _version_bumper():
    """torch._C._increment_version on a tuple of tensors (~0.2 us) where it takes one (torch >=
    2.5), else once per tensor."""
    try:
        torch._C._increment_version((torch.empty(0),))
        return torch._C._increment_version
    except TypeError:
        return lambda tensors: [torch._C._increment_version(t) for t in tensors]


increment_versions = _version_bumper()  # also flash_mla's eager call, for the out= it writes


def decode_eager(q, kv_cache, inv_scale, indices, lens, attn_sink, out, lse, return_lse,
                 block_size, scale, window_size, extra, seed_rows=False,
                 formats=("e4m3", "e4m3"), lens_rows=(1, None), empty_lse_positive=False):
    """decode() for torch tensors outside any trace (``eager(q)``), without the dispatcher: what
    ``decode_op`` / ``decode_out_op`` would return, or None, having run nothing, when the call must
    take them instead (an argument the binding cannot read in place; lse= without out=; an output
    the ops would tie to autograd). Writes into out= / lse= without allocating. seed_rows: indices
    and lens may have more rows than q, as native_swa_decode_attention takes them. formats: the
    window's and the extra source's row formats (kv_format, extra_kv_format); lens_rows: their
    lens_rows_per_entry and extra_lens_rows_per_entry; empty_lse_positive: the ops' flag, +inf
    rather than -inf for a token without entries."""
    if out is None:
        if lse is not None:
            return None  # the ops' path says why
        # With grad enabled and an input that requires grad, decode_op's output carries a grad_fn
        # that refuses backward; a plain output would let backward treat the op as a constant.
        if torch.is_grad_enabled() and _requires_grad(q, kv_cache, inv_scale, attn_sink, extra):
            return None
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        mutated = ()
    else:
        mutated = (out,)
    if return_lse and lse is None:
        lse = q.new_empty(q.shape[:2], dtype=torch.float32)
    x = extra or _NO_EXTRA
    # Each argument spelled out: a call with *args costs 0.1-0.25 us more here (CPython builds a
    # tuple that nanobind then unpacks, where a plain call hands it the arguments' array).
    if not _C.decode_exchange(q, kv_cache, inv_scale, indices, lens, attn_sink, out, lse,
                              block_size, scale, window_size, x[0], x[1], x[2], x[3], x[4], x[5],
                              formats[0], formats[1], lens_rows[0], lens_rows[1], seed_rows,
                              empty_lse_positive):
        return None
    if mutated:  # as decode_out_op's ADInplaceOrView kernel does for its mutated arguments
        increment_versions(mutated if lse is None else (out, lse))
    return (out, lse) if return_lse else out


def _capsule(t: torch.Tensor):
    # -1: "no synchronization" in the DLPack stream protocol. The default (None) would make the
    # legacy default stream wait on the current one, which is illegal during CUDA-graph capture.
    if t.device.type == "cuda":
        return t.__dlpack__(stream=-1)
    return t


def _as_e4m3_bytes(kv_cache: torch.Tensor) -> torch.Tensor:
    # Older torch versions cannot export float8 through DLPack; the bytes are the same.
    return kv_cache.view(torch.uint8) if kv_cache.dtype == torch.float8_e4m3fn else kv_cache


def _optional_capsule(t: Optional[torch.Tensor]):
    return None if t is None else _capsule(t)


def _current_stream(device: torch.device) -> int:
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def _launch(q, kv_cache, inv_scale, indices, lens, attn_sink, out, lse, block_size, scale,
            window_size, extra_kv_cache, extra_inv_scale, extra_indices, extra_lens,
            extra_block_size, extra_window, kv_format, extra_kv_format, lens_rows_per_entry,
            extra_lens_rows_per_entry, empty_lse_positive) -> None:
    # The extra source's arguments go through as given: the binding checks all-or-nothing.
    if _C.decode_exchange(q, kv_cache, inv_scale, indices, lens, attn_sink, out, lse, block_size,
                          scale, window_size, extra_kv_cache, extra_inv_scale, extra_indices,
                          extra_lens, extra_block_size, extra_window, kv_format, extra_kv_format,
                          lens_rows_per_entry, extra_lens_rows_per_entry, False,  # seed_rows
                          empty_lse_positive):
        return
    # torch without the exchange API, or a tensor it cannot describe, or tensors on several
    # devices (which the binding then reports): DLPack capsules.
    stream = _current_stream(q.device) if q.device.type == "cuda" else 0
    _C.decode(
        _capsule(q), _capsule(_as_e4m3_bytes(kv_cache)), _optional_capsule(inv_scale),
        _capsule(indices), _optional_capsule(lens), _optional_capsule(attn_sink), _capsule(out),
        _optional_capsule(lse), block_size, scale, window_size, stream, 0,
        None if extra_kv_cache is None else _capsule(_as_e4m3_bytes(extra_kv_cache)),
        _optional_capsule(extra_inv_scale), _optional_capsule(extra_indices),
        _optional_capsule(extra_lens), extra_block_size, extra_window, kv_format, extra_kv_format,
        lens_rows_per_entry, extra_lens_rows_per_entry, empty_lse_positive)


def _lse_shape(q: torch.Tensor, return_lse: bool):
    # Without return_lse the op still returns a tensor (custom ops have a fixed output arity); an
    # empty one costs no memory. A q of the wrong rank is the binding's to report.
    return q.shape[:2] if return_lse else (0,)


# scale and window_size may be None (the binding's defaults: head_dim ** -0.5, indices.shape[-1]);
# indices may be (1, T, W). The extra source (the compressed entries in the same softmax) is the
# six arguments after the window's, all defaulting to None: callers of the window-only schema keep
# working unchanged. kv_format / extra_kv_format ("e4m3" or "model1") follow; a "model1"
# source's inv_scale is not read and may be None. lens_rows_per_entry / extra_lens_rows_per_entry
# (tokens one lens entry covers, None = 1 for the extra source) follow; lens and extra_lens may
# be None (every index column counts). empty_lse_positive comes last: True writes +inf (FlashMLA's
# convention) rather than -inf as the lse of a token without entries. decode()'s empty_token_lse
# (-inf or +inf) becomes this flag: a float default of -inf is one torch.library's schema parser
# refuses ("expected number but found 'ident'"), and a bool has no third value to check.
@torch.library.custom_op("swa_decode::decode", mutates_args=())
def decode_op(q: torch.Tensor, kv_cache: torch.Tensor, inv_scale: Optional[torch.Tensor],
              indices: torch.Tensor, lens: Optional[torch.Tensor],
              attn_sink: Optional[torch.Tensor],
              block_size: int, scale: Optional[float], window_size: Optional[int],
              return_lse: bool, extra_kv_cache: Optional[torch.Tensor] = None,
              extra_inv_scale: Optional[torch.Tensor] = None,
              extra_indices: Optional[torch.Tensor] = None,
              extra_lens: Optional[torch.Tensor] = None, extra_block_size: Optional[int] = None,
              extra_window: Optional[int] = None, kv_format: str = "e4m3",
              extra_kv_format: str = "e4m3", lens_rows_per_entry: int = 1,
              extra_lens_rows_per_entry: Optional[int] = None, empty_lse_positive: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """out (T, H, D) bf16 and lse (T, H) fp32 (or (0,) without return_lse); see docs/semantics.md."""
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(_lse_shape(q, return_lse), dtype=torch.float32, device=q.device)
    _launch(q, kv_cache, inv_scale, indices, lens, attn_sink, out, lse if return_lse else None,
            block_size, scale, window_size, extra_kv_cache, extra_inv_scale, extra_indices,
            extra_lens, extra_block_size, extra_window, kv_format, extra_kv_format,
            lens_rows_per_entry, extra_lens_rows_per_entry, empty_lse_positive)
    return out, lse


@decode_op.register_fake
def _decode_fake(q, kv_cache, inv_scale, indices, lens, attn_sink, block_size, scale,
                 window_size, return_lse, extra_kv_cache=None, extra_inv_scale=None,
                 extra_indices=None, extra_lens=None, extra_block_size=None, extra_window=None,
                 kv_format="e4m3", extra_kv_format="e4m3", lens_rows_per_entry=1,
                 extra_lens_rows_per_entry=None, empty_lse_positive=False):
    return (q.new_empty(q.shape, dtype=torch.bfloat16),
            q.new_empty(_lse_shape(q, return_lse), dtype=torch.float32))


@torch.library.custom_op("swa_decode::decode_out", mutates_args=("out", "lse"))
def decode_out_op(q: torch.Tensor, kv_cache: torch.Tensor, inv_scale: Optional[torch.Tensor],
                  indices: torch.Tensor, lens: Optional[torch.Tensor],
                  attn_sink: Optional[torch.Tensor], out: torch.Tensor,
                  lse: Optional[torch.Tensor], block_size: int,
                  scale: Optional[float], window_size: Optional[int],
                  extra_kv_cache: Optional[torch.Tensor] = None,
                  extra_inv_scale: Optional[torch.Tensor] = None,
                  extra_indices: Optional[torch.Tensor] = None,
                  extra_lens: Optional[torch.Tensor] = None,
                  extra_block_size: Optional[int] = None,
                  extra_window: Optional[int] = None, kv_format: str = "e4m3",
                  extra_kv_format: str = "e4m3", lens_rows_per_entry: int = 1,
                  extra_lens_rows_per_entry: Optional[int] = None,
                  empty_lse_positive: bool = False) -> None:
    """Writes into the caller's out (T, H, D) bf16 and optional lse (T, H) fp32."""
    _launch(q, kv_cache, inv_scale, indices, lens, attn_sink, out, lse, block_size, scale,
            window_size, extra_kv_cache, extra_inv_scale, extra_indices, extra_lens,
            extra_block_size, extra_window, kv_format, extra_kv_format, lens_rows_per_entry,
            extra_lens_rows_per_entry, empty_lse_positive)


@decode_out_op.register_fake
def _decode_out_fake(q, kv_cache, inv_scale, indices, lens, attn_sink, out, lse, block_size, scale,
                     window_size, extra_kv_cache=None, extra_inv_scale=None, extra_indices=None,
                     extra_lens=None, extra_block_size=None, extra_window=None,
                     kv_format="e4m3", extra_kv_format="e4m3", lens_rows_per_entry=1,
                     extra_lens_rows_per_entry=None, empty_lse_positive=False):
    return None
