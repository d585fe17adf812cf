"""Shared helpers: a batch builder that poisons every cache slot and scale no valid entry names, and
the op's semantics (docs/semantics.md) re-implemented in float64 torch, independent of the package.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
from dataclasses import dataclass
from typing import Optional

import pytest

from swa_decode.limits import GPU_HEAD_DIM

torch = pytest.importorskip("torch")


def load_bench_module():
    """python/bench_vs_seed.py, which holds the seed's fallback (copied, attributed). Loaded by path:
    putting python/ on sys.path would shadow the installed package with its source folder."""
    path = pathlib.Path(__file__).resolve().parents[1] / "bench_vs_seed.py"
    spec = importlib.util.spec_from_file_location("bench_vs_seed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

E4M3_NAN = 0x7F


@dataclass
class Batch:
    q: torch.Tensor          # (T, H, D) bf16
    kv_cache: torch.Tensor   # (num_blocks, block_size, D) uint8 e4m3 bytes (maybe a padded view)
    inv_scale: torch.Tensor  # (num_slots, 1) bf16 or (num_slots,) fp32
    indices: torch.Tensor    # (T, >= W) int32 / int64
    lens: torch.Tensor       # (T,) int32 / int64
    block_size: int
    window_size: int
    attn_sink: Optional[torch.Tensor] = None

    def to(self, device) -> "Batch":
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v)
                 for k, v in self.__dict__.items()}
        return Batch(**moved)


def make_batch(T=4, H=8, D=GPU_HEAD_DIM, num_blocks=6, block_size=16, W=32, *, seed=0,
               index_dtype=torch.int64, lens_dtype=torch.int64, scale_dtype=torch.bfloat16,
               scale_2d=True, lens=None, extra_index_cols=0, row_stride=None, sink=None,
               poison=True) -> Batch:
    """A random batch whose valid entries are scattered over the pool; lens default to a mix of
    full, partial and empty windows. Every slot that no valid entry names holds e4m3 NaN and a NaN
    scale, so reading one shows up as NaN in the output."""
    g = torch.Generator().manual_seed(seed)
    num_slots = num_blocks * block_size
    q = (torch.randn(T, H, D, generator=g) * 0.5).to(torch.bfloat16)
    stride = row_stride or D
    storage = (torch.randn(num_blocks, block_size, stride, generator=g) * 2).to(
        torch.float8_e4m3fn).view(torch.uint8)
    kv_cache = storage[:, :, :D]
    inv_scale = (torch.rand(num_slots, generator=g) * 0.9 + 0.1).to(scale_dtype)
    cols = W + extra_index_cols
    indices = torch.stack([torch.randperm(num_slots, generator=g)[:cols] for _ in range(T)]
                          or [torch.empty(0, cols, dtype=torch.int64)]).reshape(T, cols)
    if lens is None:
        lens = [(W, W // 2, 1, 0, W - 1)[t % 5] for t in range(T)]
    lens_t = torch.tensor(lens, dtype=torch.int64)
    if poison:
        used = torch.zeros(num_slots, dtype=torch.bool)
        for t in range(T):
            used[valid_slots(indices[t], lens_t[t], W, num_slots)] = True
        unused = (~used).nonzero().flatten()
        storage.view(num_slots, stride)[unused] = E4M3_NAN
        inv_scale[unused] = float("nan")
    if scale_2d:
        inv_scale = inv_scale.unsqueeze(1)
    attn_sink = None if sink is None else torch.as_tensor(sink, dtype=torch.float32).expand(H).clone()
    return Batch(q=q, kv_cache=kv_cache, inv_scale=inv_scale, indices=indices.to(index_dtype),
                 lens=lens_t.to(lens_dtype), block_size=block_size, window_size=W,
                 attn_sink=attn_sink)


def valid_slots(index_row, length, window_size: int, num_slots: int) -> list[int]:
    """The tests' one statement of docs/semantics.md "Valid entries", independent of the package:
    the ids among the first min(max(length, 0), window_size) columns of index_row that lie in
    [0, num_slots), duplicates kept."""
    n = min(max(int(length), 0), window_size)
    return [int(i) for i in index_row[:n] if 0 <= int(i) < num_slots]


def windows(b: Batch, dtype):
    """(t, q[t] (H, D), k (n, D)) for each token t with a valid entry, in `dtype`: k holds the
    dequantized cache rows of its valid entries in column order, e4m3 * inv_scale[slot]."""
    num_slots = b.kv_cache.shape[0] * b.block_size
    kv = b.kv_cache.cpu().view(torch.float8_e4m3fn).to(dtype)
    inv_scale = b.inv_scale.cpu().reshape(-1).to(dtype)
    q = b.q.cpu().to(dtype)
    for t in range(q.shape[0]):
        ids = valid_slots(b.indices[t], b.lens[t], b.window_size, num_slots)
        if ids:
            yield t, q[t], torch.stack([kv[i // b.block_size, i % b.block_size] * inv_scale[i]
                                        for i in ids])


def reference(b: Batch, scale: Optional[float] = None):
    """docs/semantics.md in float64: returns out (T, H, D) and lse (T, H), both float64."""
    T, H, D = b.q.shape
    scale = D ** -0.5 if scale is None else scale
    out = torch.zeros(T, H, D, dtype=torch.float64)
    lse = torch.full((T, H), -math.inf, dtype=torch.float64)
    for t, q_t, k in windows(b, torch.float64):
        s = scale * q_t @ k.T                                    # (H, n)
        m = s.max(dim=1, keepdim=True).values
        e = torch.exp(s - m)
        lse[t] = (m.squeeze(1) + torch.log(e.sum(dim=1)))
        denom = e.sum(dim=1)
        if b.attn_sink is not None:
            sink = b.attn_sink.cpu().to(torch.float64)
            for h in range(H):
                if sink[h] == math.inf:
                    e[h] = 0.0           # all weight on the sink
                    denom[h] = 1.0
                elif sink[h] != -math.inf:
                    denom[h] = denom[h] + math.exp(sink[h] - m[h, 0])
        out[t] = (e @ k) / denom.unsqueeze(1)
    return out, lse


def bf16_baseline(b: Batch, scale: Optional[float] = None):
    """The same op at bf16 working precision (k and p rounded to bf16, fp32 sums, as a bf16 kernel
    or the seed's SDPA would), used only to derive the GPU tolerance."""
    T, H, D = b.q.shape
    scale = D ** -0.5 if scale is None else scale
    out = torch.zeros(T, H, D, dtype=torch.float32)
    for t, q_t, k in windows(b, torch.float32):
        k = k.to(torch.bfloat16).to(torch.float32)
        s = scale * q_t @ k.T
        p = torch.softmax(s, dim=1).to(torch.bfloat16).to(torch.float32)
        out[t] = p @ k
    return out.to(torch.bfloat16).to(torch.float64)


def assert_bf16_rounding_of(out: torch.Tensor, ref: torch.Tensor):
    """out is ref rounded once to bf16: within half a bf16 ulp of ref's binade, elementwise (1%
    slack for a float32 step on the way; subnormal-sized values get an absolute 2^-133)."""
    out = out.cpu().to(torch.float64)
    assert torch.isfinite(out).all(), "output has NaN/inf"
    err = (out - ref).abs()
    _, exponent = torch.frexp(ref)           # |ref| in [2^(e-1), 2^e): bf16 ulp there is 2^(e-8)
    bound = torch.ldexp(torch.full_like(ref, 1.01), exponent - 9) + 2.0 ** -133
    worst = (err - bound).max()
    assert worst <= 0, f"max error beyond half a bf16 ulp by {worst.item():.3g}"


def assert_lse_equal(lse: torch.Tensor, ref: torch.Tensor, rtol=1e-6):
    lse = lse.cpu().to(torch.float64)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref)), f"inf pattern differs: {lse} vs {ref}"
    finite = torch.isfinite(ref)
    assert torch.allclose(lse[finite], ref[finite], rtol=rtol, atol=1e-6)
    assert (lse[~finite] == ref[~finite]).all()


def has_cuda() -> bool:
    return torch.cuda.is_available()
