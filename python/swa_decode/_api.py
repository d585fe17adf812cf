"""The public Python functions. Checked here: only what the native layer cannot see (Python types,
integer arguments that must not be truncated, empty_token_lse (a float, handed down as a flag),
torch devices, the longer index and length tensors of the seed, dtypes DLPack cannot carry);
everything else (shapes, strides, ranges, dtypes, the (1, T, W) indices, the defaults of scale and
window_size, what the GPU supports) is checked or decided once in the binding or in C++ and raised
from there.

An eager call on torch tensors (nothing tracing it) goes straight to the binding
(_torch_ops.decode_eager); the checks above are then the binding's refusals, which send the call
down the general path that raises them here, so every message is the same on both paths."""

from __future__ import annotations

import math
import operator
from typing import Any, NamedTuple, Optional

from swa_decode import _C

try:  # torch is optional: without it the package runs on DLPack arrays only
    import torch as _torch
    from swa_decode import _torch_ops as _ops
except ImportError:
    _torch = None
    _ops = None

# DLPack device types (dlpack.h).
_DL_CPU = 1
_DL_CUDA = 2

# The binding's int64_t arguments.
_INT64_MIN, _INT64_MAX = -2 ** 63, 2 ** 63 - 1


def _type_name(x: Any) -> str:
    return f"{type(x).__module__}.{type(x).__qualname__}"


def _int_arg(name: str, value) -> int:
    """An integer argument, never truncated: operator.index takes Python, numpy and 0-D torch
    integers and refuses floats and strings (int(16.5) would pass as 16)."""
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{name} must fit in int64, got {value}")
    return value


def decode(q, kv_cache, inv_scale, indices, lens, *, block_size: int,
           scale: Optional[float] = None, window_size: Optional[int] = None, attn_sink=None,
           out=None, return_lse: bool = False, lse=None, stream=None, extra_kv_cache=None,
           extra_inv_scale=None, extra_indices=None, extra_lens=None,
           extra_block_size: Optional[int] = None, extra_window: Optional[int] = None,
           kv_format: str = "e4m3", extra_kv_format: str = "e4m3", lens_rows_per_entry: int = 1,
           extra_lens_rows_per_entry: Optional[int] = None, empty_token_lse: float = -math.inf):
    """Sliding-window decode attention over a paged e4m3 KV cache (semantics: docs/semantics.md).

    q (T, H, D) bf16; kv_cache (num_blocks, block_size, D) uint8 or float8_e4m3fn e4m3 bytes
    (rows may be padded: any token stride); inv_scale (num_slots,) or (num_slots, 1) bf16 or fp32;
    indices (T, >= window_size) or (1, T, >= window_size) int32/int64 slot ids, -1 = no entry;
    lens (T,) int32/int64, or None (every index column counts); attn_sink (H,) fp32 or None.
    lens_rows_per_entry n (default 1, must divide T): lens is (T / n,), one length for each n
    consecutive rows (FlashMLA's one length per batch row for its s_q query rows, n = s_q).

    The extra source (DeepSeek-V4's compressed entries, attended in the same softmax after the
    window's entries): extra_kv_cache (extra_num_blocks, extra_block_size, D), extra_inv_scale,
    extra_indices (T, >= extra_window) and extra_lens (T / extra_lens_rows_per_entry,), each with
    the window's dtypes and
    layout rules, and extra_block_size; give all of them or none (extra_lens may be None, as lens
    may). extra_window (the extra index columns read per token, up to limits.MAX_EXTRA_ENTRIES)
    defaults to extra_indices.shape[-1], extra_lens_rows_per_entry (lens_rows_per_entry's
    namesake) to 1.

    kv_format / extra_kv_format: each source's row format (docs/semantics.md, "Row formats"):
    "e4m3" (the above) or "model1", FlashMLA's k_cache for DeepSeek-V4 (vLLM's fp8_ds_mla): a
    (num_blocks, block_size, 1, 584) or (num_blocks, block_size, 584) uint8, int8 or
    float8_e4m3fn view whose blocks hold block_size 576-byte rows (448 e4m3 bytes, 64 bf16 RoPE
    values) and then block_size 8-byte scale rows (7 UE8M0 bytes), the block stride padded to a
    multiple of 576 bytes; D = 512. A "model1" source's scales are in the cache: its inv_scale is
    not read and may be None. The CPU reference and the portable and sm90 GPU kernels read
    "model1" (the few-heads kernel does not, and decode() picks another); on the GPU a "model1"
    cache must be 16-byte aligned.

    scale defaults to D ** -0.5, window_size to indices.shape[-1]. Returns out (T, H, D) bf16, or
    (out, lse) with lse (T, H) fp32 (natural log, without the sink) when return_lse. out= (and lse=)
    write into the caller's buffers instead of allocating. empty_token_lse: the lse of a token with
    no valid entry in either source, float('-inf') (the default: the log of its empty sum) or
    float('inf') (FlashMLA's convention); its out is 0 either way.

    torch tensors: CUDA runs the GPU kernel on the current stream, CPU the float64 reference. A
    traced call (torch.compile, make_fx, jit.trace, vmap, autograd on the output) goes through the
    custom ops torch.ops.swa_decode.decode / decode_out; an eager one hands the tensors to the
    binding in place, without the dispatcher, with the same result and messages. Other DLPack
    arrays (numpy on CPU; CuPy, JAX, ... on CUDA with stream= given as an int or a stream object)
    go straight to the native binding.
    """
    block_size = _int_arg("block_size", block_size)
    if window_size is not None:
        window_size = _int_arg("window_size", window_size)
    if scale is not None:
        scale = float(scale)
    _format_arg("kv_format", kv_format)
    _format_arg("extra_kv_format", extra_kv_format)
    formats = (kv_format, extra_kv_format)
    empty_lse_positive = _empty_lse_positive(empty_token_lse)
    # Alone, extra_lens_rows_per_entry makes the binding ask for the rest of the extra source.
    lens_rows = (_int_arg("lens_rows_per_entry", lens_rows_per_entry),
                 None if extra_lens_rows_per_entry is None
                 else _int_arg("extra_lens_rows_per_entry", extra_lens_rows_per_entry))
    extra = None  # no extra source: nothing below looks at the extra_* arguments again
    if (extra_kv_cache is not None or extra_inv_scale is not None or extra_indices is not None
            or extra_lens is not None or extra_block_size is not None or extra_window is not None):
        # Which of them are missing is the binding's to say, for every path alike.
        extra = _Extra(extra_kv_cache, extra_inv_scale, extra_indices, extra_lens,
                       None if extra_block_size is None else _int_arg("extra_block_size",
                                                                      extra_block_size),
                       None if extra_window is None else _int_arg("extra_window", extra_window))
    if _torch is not None and isinstance(q, _torch.Tensor):
        if stream is None and _ops.eager(q):
            result = _ops.decode_eager(q, kv_cache, inv_scale, indices, lens, attn_sink, out, lse,
                                       return_lse, block_size, scale, window_size, extra,
                                       formats=formats, lens_rows=lens_rows,
                                       empty_lse_positive=empty_lse_positive)
            if result is not None:
                return result
        return _decode_torch(q, kv_cache, inv_scale, indices, lens, block_size=block_size,
                             scale=scale, window_size=window_size, attn_sink=attn_sink, out=out,
                             return_lse=return_lse, lse=lse, stream=stream, extra=extra,
                             formats=formats, lens_rows=lens_rows,
                             empty_lse_positive=empty_lse_positive)
    return _decode_dlpack(q, kv_cache, inv_scale, indices, lens, block_size=block_size,
                          scale=scale, window_size=window_size, attn_sink=attn_sink, out=out,
                          return_lse=return_lse, lse=lse, stream=stream, extra=extra,
                          formats=formats, lens_rows=lens_rows,
                          empty_lse_positive=empty_lse_positive)


def _format_arg(name: str, value) -> None:
    """A row format is a str; which ones exist is the binding's to say."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str ('e4m3' or 'model1'), got {type(value).__name__} "
                        f"{value!r}")


def _empty_lse_positive(empty_token_lse) -> bool:
    """decode()'s empty_token_lse as the custom ops' and the binding's flag (True: +inf). The one
    place that says which values there are: the lse of a token without entries is the log of its
    empty sum, -inf, or FlashMLA's +inf (docs/semantics.md, "Edge cases"); below this a bool cannot
    name a third one."""
    if isinstance(empty_token_lse, float) and math.isinf(empty_token_lse):
        return bool(empty_token_lse > 0)  # a numpy float64's comparison is a numpy bool
    raise ValueError("empty_token_lse must be float('-inf') (the default) or float('inf') "
                     f"(FlashMLA's convention), got {type(empty_token_lse).__name__} "
                     f"{empty_token_lse!r}")


class _Extra(NamedTuple):
    """decode()'s extra_* arguments, in the order of the custom ops' and the binding's."""
    kv_cache: Any
    inv_scale: Any
    indices: Any
    lens: Any
    block_size: Optional[int]
    window: Optional[int]

    def named_tensors(self):
        return [("extra_kv_cache", self.kv_cache), ("extra_inv_scale", self.inv_scale),
                ("extra_indices", self.indices), ("extra_lens", self.lens)]


def native_swa_decode_attention(q, swa_kv_cache, swa_inv_scale, swa_indices, swa_lens,
                                block_size: int, scale: float, window_size: int = 128):
    """Drop-in for the seed's ``native_swa_decode_attention``: same signature and semantics.

    As in the seed, indices may be (T', W) or (1, T', W) and lens (T',) with T' >= T = q.shape[0]:
    the first T rows are used. Differences, all where the seed was undefined: a token with no valid
    entry gets 0 (the seed: NaN); slot ids past the cache are no entry (the seed: an indexing
    error); duplicate ids count as often as they appear, as in the seed.
    """
    block_size = _int_arg("block_size", block_size)
    window_size = _int_arg("window_size", window_size)
    if scale is not None:
        scale = float(scale)
    if _ops is not None and _ops.eager(q):
        # The binding takes the seed's longer rows itself and refuses any other layout, which
        # _first_rows below then reports.
        result = _ops.decode_eager(q, swa_kv_cache, swa_inv_scale, swa_indices, swa_lens, None,
                                   None, None, False, block_size, scale, window_size, None,
                                   seed_rows=True)
        if result is not None:
            return result
    if getattr(q, "ndim", None) == 3:  # any other q is decode()'s to report
        num_tokens = q.shape[0]
        swa_indices = _first_rows(swa_indices, "swa_indices", num_tokens)
        swa_lens = _first_rows(swa_lens, "swa_lens", num_tokens)
    return decode(q, swa_kv_cache, swa_inv_scale, swa_indices, swa_lens, block_size=block_size,
                  scale=scale, window_size=window_size)


_NO_EXTRA = (None,) * 6  # the extra_* arguments of the ops and the binding when there is none
_INDICES_LAYOUT = _C.INDICES_LAYOUT  # the binding's, which reads (1, T, W) indices as (T, W)


def _first_rows(x, name: str, num_tokens: int):
    """The first num_tokens rows of the seed's swa_indices ((T', W) or (1, T', W)) or swa_lens
    ((T',)), which may have more rows than q (T' >= T), never fewer. Exactly T rows go through as
    they are (decode takes (1, T, W) itself)."""
    ndim = getattr(x, "ndim", None)
    if ndim is None:
        return x  # not an array: decode() raises the TypeError
    is_indices = name == "swa_indices"
    if is_indices and ndim == 3 and x.shape[0] != 1:
        raise ValueError(f"{name} must be {_INDICES_LAYOUT}, got shape {tuple(x.shape)}")
    expected = (2, 3) if is_indices else (1,)
    if ndim not in expected:
        layout = _INDICES_LAYOUT if is_indices else "1-D (T,)"
        raise ValueError(f"{name} must be {layout}, got {ndim}-D")
    row_dim = ndim - 2 if is_indices else 0
    rows = x.shape[row_dim]
    if rows == num_tokens:
        return x
    if rows < num_tokens:
        raise ValueError(f"{name}.shape[{row_dim}] must be >= q.shape[0] (num_tokens) = "
                         f"{num_tokens}, got {rows}")
    return x[0, :num_tokens] if ndim == 3 else x[:num_tokens]


# ---------------------------------------------------------------------------------------------
# torch tensors: through the custom ops
# ---------------------------------------------------------------------------------------------

def _decode_torch(q, kv_cache, inv_scale, indices, lens, *, block_size, scale, window_size,
                  attn_sink, out, return_lse, lse, stream, extra, formats, lens_rows,
                  empty_lse_positive):
    if stream is not None:
        raise ValueError("stream= is for DLPack arrays; torch tensors run on the current stream "
                         "(use `with torch.cuda.stream(s):`), got stream=" + repr(stream))
    named = [("kv_cache", kv_cache), ("inv_scale", inv_scale), ("indices", indices),
             ("lens", lens), ("attn_sink", attn_sink), ("out", out), ("lse", lse)]
    if extra is not None:
        named += extra.named_tensors()
    for name, t in named:
        if t is None:
            continue
        if not isinstance(t, _torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor like q, got {_type_name(t)}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    if q.device.type not in ("cuda", "cpu"):
        raise ValueError(f"q must be on a cuda or cpu device, got {q.device}")
    if lse is not None and out is None:
        raise ValueError("lse= needs out= as well (without out= the op allocates both)")

    extra_args = _NO_EXTRA if extra is None else tuple(extra)
    if out is None:
        out_t, lse_t = _ops.decode_op(q, kv_cache, inv_scale, indices, lens, attn_sink,
                                     block_size, scale, window_size, bool(return_lse),
                                     *extra_args, *formats, *lens_rows, empty_lse_positive)
        return (out_t, lse_t) if return_lse else out_t
    if return_lse and lse is None:
        lse = _torch.empty((q.shape[0], q.shape[1]), dtype=_torch.float32, device=q.device)
    _ops.decode_out_op(q, kv_cache, inv_scale, indices, lens, attn_sink, out, lse,
                      block_size, scale, window_size, *extra_args, *formats, *lens_rows,
                      empty_lse_positive)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# any other DLPack array (numpy, CuPy, JAX, ...)
# ---------------------------------------------------------------------------------------------

def _dlpack_device(x, name: str):
    if not hasattr(x, "__dlpack__") or not hasattr(x, "__dlpack_device__"):
        raise TypeError(f"{name} must be a torch.Tensor or an array with __dlpack__ / "
                        f"__dlpack_device__ (numpy, CuPy, JAX, ...), got {_type_name(x)}")
    device_type, device_id = x.__dlpack_device__()
    return int(device_type), int(device_id)


def _device_str(device) -> str:
    kind = {_DL_CPU: "cpu", _DL_CUDA: "cuda"}.get(device[0], f"dlpack device type {device[0]}")
    return kind if device[0] == _DL_CPU else f"{kind}:{device[1]}"


def _stream_handle(stream) -> int:
    if isinstance(stream, int):
        return stream
    for attr in ("ptr", "cuda_stream"):  # cupy.cuda.Stream.ptr, torch.cuda.Stream.cuda_stream
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError("stream must be a cudaStream_t as an int or a stream object with .ptr or "
                    f".cuda_stream, got {_type_name(stream)}")


def _dtype_name(x) -> str:
    return str(getattr(x, "dtype", ""))


def _allocate_like(q, shape, dtype, name: str):
    """An output of q's framework: numpy, CuPy, or any array with the array-API __array_namespace__."""
    if hasattr(q, "__array_namespace__"):
        xp = q.__array_namespace__()
        try:
            return xp.empty(shape, dtype=dtype if dtype is not None else q.dtype, device=q.device)
        except TypeError:  # namespaces without the device= keyword allocate on the current device
            return xp.empty(shape, dtype=dtype if dtype is not None else q.dtype)
    if type(q).__module__ == "numpy":
        import numpy as np
        return np.empty(shape, dtype=dtype if dtype is not None else q.dtype)
    if type(q).__module__.split(".")[0] == "cupy":  # cupy.ndarray has no __array_namespace__
        import cupy
        with cupy.cuda.Device(q.device.id):
            return cupy.empty(shape, dtype=dtype if dtype is not None else q.dtype)
    raise TypeError(f"{name}= is required for arrays of type {_type_name(q)}: swa_decode cannot "
                    "allocate in that framework")


def _as_uint16_if_bf16(x, bit: int, bf16_views: int):
    """x viewed as uint16 with `bit` set in bf16_views if x is an ml_dtypes bfloat16 array (no
    DLPack code), else x and bf16_views unchanged."""
    if _dtype_name(x) == "bfloat16":
        return x.view("uint16"), bf16_views | bit
    return x, bf16_views


def _as_uint8_if_float8(kv_cache):
    return kv_cache.view("uint8") if _dtype_name(kv_cache) == "float8_e4m3fn" else kv_cache


def _decode_dlpack(q, kv_cache, inv_scale, indices, lens, *, block_size, scale, window_size,
                   attn_sink, out, return_lse, lse, stream, extra, formats, lens_rows,
                   empty_lse_positive):
    device = _dlpack_device(q, "q")
    named = [("kv_cache", kv_cache), ("inv_scale", inv_scale), ("indices", indices),
             ("lens", lens), ("attn_sink", attn_sink), ("out", out), ("lse", lse)]
    if extra is not None:
        named += extra.named_tensors()
    for name, x in named:
        if x is not None and _dlpack_device(x, name) != device:
            raise ValueError(f"{name} must be on q's device {_device_str(device)}, got "
                             f"{_device_str(_dlpack_device(x, name))}")
    if device[0] == _DL_CUDA:
        if stream is None:
            raise ValueError("stream= is required for DLPack CUDA arrays: pass the cudaStream_t "
                             "(an int, or a stream object with .ptr) the inputs are ready on")
        stream_handle = _stream_handle(stream)
    elif device[0] == _DL_CPU:
        stream_handle = 0
    else:
        raise ValueError(f"q must be on a cpu or cuda device, got {_device_str(device)}")

    num_tokens, num_heads = q.shape[0], q.shape[1]
    if out is None:
        out = _allocate_like(q, tuple(q.shape), None, "out")
    if return_lse and lse is None:
        lse = _allocate_like(q, (num_tokens, num_heads), "float32", "lse")

    # bfloat16 / float8 dtypes of ml_dtypes (numpy) have no DLPack code: pass their bits as
    # uint16 / uint8 and tell the binding which uint16 arrays are bfloat16.
    q, bf16_views = _as_uint16_if_bf16(q, _C.kViewQ, 0)
    inv_scale, bf16_views = _as_uint16_if_bf16(inv_scale, _C.kViewInvScale, bf16_views)
    out_arg, bf16_views = _as_uint16_if_bf16(out, _C.kViewOut, bf16_views)
    kv_cache = _as_uint8_if_float8(kv_cache)

    def export(x):
        if x is None or device[0] == _DL_CPU:
            return x  # nanobind imports CPU arrays itself (versioned DLPack or buffer protocol)
        # The producer orders its pending work before `stream` (DLPack stream protocol; the
        # legacy default stream is 1 there, 0 being reserved).
        return x.__dlpack__(stream=stream_handle if stream_handle != 0 else 1)

    extra_args = _NO_EXTRA
    if extra is not None:
        extra_inv_scale, bf16_views = _as_uint16_if_bf16(extra.inv_scale, _C.kViewExtraInvScale,
                                                         bf16_views)
        extra_args = (export(_as_uint8_if_float8(extra.kv_cache)), export(extra_inv_scale),
                      export(extra.indices), export(extra.lens), extra.block_size, extra.window)

    _C.decode(export(q), export(kv_cache), export(inv_scale), export(indices), export(lens),
              export(attn_sink), export(out_arg), export(lse), block_size, scale,
              window_size, stream_handle, bf16_views, *extra_args, *formats, *lens_rows,
              empty_lse_positive)
    return (out, lse) if return_lse else out
