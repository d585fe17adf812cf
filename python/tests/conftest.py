"""Shared helpers: a batch builder (the window and an optional extra source, one generator for
both) that poisons every cache slot and scale no valid entry names, and the op's semantics
(docs/semantics.md) re-implemented in float64 torch, independent of the package.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
from dataclasses import dataclass
from typing import Optional

import pytest

import swa_decode
from swa_decode.limits import GPU_HEAD_DIM

torch = pytest.importorskip("torch")
from swa_decode import _torch_ops  # noqa: E402 (needs torch)


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
class Source:
    """One KV source: a paged cache, its scales, slot ids and lengths, and how many index columns a
    token reads (window_size for the window, extra_window for the extra source)."""
    kv_cache: torch.Tensor   # (num_blocks, block_size, D) uint8 e4m3 bytes (maybe a padded view)
    inv_scale: torch.Tensor  # (num_slots, 1) or (num_slots,), bf16 or fp32
    indices: torch.Tensor    # (T, >= window) int32 / int64
    lens: torch.Tensor       # (T,) int32 / int64
    block_size: int
    window: int

    @property
    def num_slots(self) -> int:
        return self.kv_cache.shape[0] * self.block_size

    def valid_slots(self, t: int) -> torch.Tensor:
        return valid_slots(self.indices[t], self.lens[t], self.window, self.num_slots)


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
    extra: Optional[Source] = None  # the compressed entries, in the same softmax after the window

    def sources(self) -> list[Source]:
        """The window (as a Source over this batch's own fields) and the extra source if any: J_t
        is their valid entries in this order."""
        window = Source(self.kv_cache, self.inv_scale, self.indices, self.lens, self.block_size,
                        self.window_size)
        return [window] if self.extra is None else [window, self.extra]

    def extra_kwargs(self) -> dict:
        """decode()'s extra_* arguments for this batch (none without an extra source)."""
        e = self.extra
        if e is None:
            return {}
        return dict(extra_kv_cache=e.kv_cache, extra_inv_scale=e.inv_scale,
                    extra_indices=e.indices, extra_lens=e.lens, extra_block_size=e.block_size,
                    extra_window=e.window)

    def to(self, device) -> "Batch":
        """The batch on `device` with every stride kept (a padded cache stays padded, its padding
        poisoned) and tensors the sources share still shared."""
        moved = {}

        def move(t):
            if not isinstance(t, torch.Tensor):
                return t
            if id(t) not in moved:
                flat = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
                moved[id(t)] = flat.to(device).as_strided(t.shape, t.stride(), t.storage_offset())
            return moved[id(t)]

        fields = {k: move(v) for k, v in self.__dict__.items() if k != "extra"}
        extra = None if self.extra is None else Source(
            **{k: move(v) for k, v in self.extra.__dict__.items()})
        return Batch(**fields, extra=extra)


def default_lens(T: int, W: int, shift: int = 0) -> list[int]:
    """A mix of full, partial, single and empty windows; `shift` rotates the pattern so that a
    second source's empty rows fall on other tokens than the window's."""
    return [(W, W // 2, 1, 0, W - 1)[(t + shift) % 5] for t in range(T)]


def make_source(g, T, D, *, num_blocks, block_size, W, index_dtype=torch.int64,
                lens_dtype=torch.int64, scale_dtype=torch.bfloat16, scale_2d=True, lens=None,
                lens_shift=0, spare_index_cols=0, row_stride=None, poison=True,
                share=None) -> Source:
    """A random source whose T x (W + spare_index_cols) ids are distinct per row and scattered over
    the pool (share: another Source whose cache and scales this one reads instead of its own).
    With poison, row padding bytes are e4m3 NaN; make_batch poisons the unused slots."""
    if share is not None:
        kv_cache, inv_scale, block_size = share.kv_cache, share.inv_scale, share.block_size
        num_slots = share.num_slots
    else:
        num_slots = num_blocks * block_size
        stride = row_stride or D
        storage = torch.full((num_blocks, block_size, stride), E4M3_NAN if poison else 0,
                             dtype=torch.uint8)
        kv_cache = storage[:, :, :D]
        kv_cache.copy_((torch.randn(num_blocks, block_size, D, generator=g) * 2).to(
            torch.float8_e4m3fn).view(torch.uint8))
        inv_scale = (torch.rand(num_slots, generator=g) * 0.9 + 0.1).to(scale_dtype)
        if scale_2d:
            inv_scale = inv_scale.unsqueeze(1)
    cols = W + spare_index_cols
    indices = torch.stack([torch.randperm(num_slots, generator=g)[:cols] for _ in range(T)]
                          or [torch.empty(0, cols, dtype=torch.int64)]).reshape(T, cols)
    lens_t = torch.tensor(default_lens(T, W, lens_shift) if lens is None else lens,
                          dtype=torch.int64)
    return Source(kv_cache=kv_cache, inv_scale=inv_scale, indices=indices.to(index_dtype),
                  lens=lens_t.to(lens_dtype), block_size=block_size, window=W)


def poison_unused_slots(sources: list[Source]) -> None:
    """e4m3 NaN and a NaN scale in every slot of each cache that no valid entry of any source
    reading that cache names, so reading one shows up as NaN in the output."""
    by_cache = {}
    for src in sources:
        by_cache.setdefault(id(src.kv_cache), []).append(src)
    for group in by_cache.values():
        cache = group[0]
        used = torch.zeros(cache.num_slots, dtype=torch.bool)
        for src in group:
            for t in range(src.indices.shape[0]):
                used[src.valid_slots(t)] = True
        unused = (~used).nonzero().flatten()
        cache.kv_cache[unused // cache.block_size, unused % cache.block_size] = E4M3_NAN
        cache.inv_scale.view(-1)[unused] = float("nan")


def make_batch(T=4, H=8, D=GPU_HEAD_DIM, num_blocks=6, block_size=16, W=32, *, seed=0,
               index_dtype=torch.int64, lens_dtype=torch.int64, scale_dtype=torch.bfloat16,
               scale_2d=True, lens=None, spare_index_cols=0, row_stride=None, sink=None,
               poison=True, extra=None) -> Batch:
    """A random batch whose valid entries are scattered over the pool; lens default to a mix of
    full, partial and empty windows. Every slot that no valid entry names holds e4m3 NaN and a NaN
    scale, so reading one shows up as NaN in the output.

    extra: None (no extra source) or make_source's keyword arguments for the extra source, each
    defaulting to the window's (lens to the window's pattern rotated by two tokens, so tokens with
    an empty window have extra entries and the reverse); share_cache=True makes it read the
    window's cache and scales."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(T, H, D, generator=g) * 0.5).to(torch.bfloat16)
    window = make_source(g, T, D, num_blocks=num_blocks, block_size=block_size, W=W,
                         index_dtype=index_dtype, lens_dtype=lens_dtype, scale_dtype=scale_dtype,
                         scale_2d=scale_2d, lens=lens, spare_index_cols=spare_index_cols,
                         row_stride=row_stride, poison=poison)
    sources = [window]
    if extra is not None:
        spec = dict(num_blocks=num_blocks, block_size=block_size, W=W, index_dtype=index_dtype,
                    lens_dtype=lens_dtype, scale_dtype=scale_dtype, scale_2d=scale_2d,
                    lens_shift=2, row_stride=row_stride, poison=poison)
        spec.update(extra)
        share = window if spec.pop("share_cache", False) else None
        sources.append(make_source(g, T, D, share=share, **spec))
    if poison:
        poison_unused_slots(sources)
    attn_sink = None if sink is None else torch.as_tensor(sink, dtype=torch.float32).expand(H).clone()
    return Batch(q=q, kv_cache=window.kv_cache, inv_scale=window.inv_scale,
                 indices=window.indices, lens=window.lens, block_size=window.block_size,
                 window_size=W, attn_sink=attn_sink, extra=None if extra is None else sources[1])


def valid_slots(index_row, length, window_size: int, num_slots: int) -> torch.Tensor:
    """The tests' one statement of docs/semantics.md "Valid entries", for the window and the extra
    source alike, independent of the package: the ids among the first min(max(length, 0),
    window_size) columns of index_row that lie in [0, num_slots), in column order, duplicates
    kept."""
    n = min(max(int(length), 0), window_size)
    ids = index_row[:n].cpu().to(torch.int64)
    return ids[(ids >= 0) & (ids < num_slots)]


def entries(b: Batch, dtype):
    """(t, q[t] (H, D), k (n, D)) for each token t with a valid entry, in `dtype`: k holds the
    dequantized cache rows, e4m3 * inv_scale[slot], of J_t: the window's valid entries in column
    order, then the extra source's."""
    q = b.q.cpu().to(dtype)
    sources = [(src, src.kv_cache.cpu().view(torch.float8_e4m3fn).to(dtype),
                src.inv_scale.cpu().reshape(-1).to(dtype)) for src in b.sources()]
    for t in range(q.shape[0]):
        rows = []
        for src, kv, inv_scale in sources:
            ids = src.valid_slots(t)
            rows.append(kv[ids // src.block_size, ids % src.block_size] * inv_scale[ids, None])
        k = torch.cat(rows)
        if k.shape[0] > 0:
            yield t, q[t], k


def as_numpy(b: Batch) -> dict:
    """decode()'s tensor arguments of the batch (extra_* too, with its block size and window) as
    numpy arrays: bf16 as ml_dtypes.bfloat16, the caches as uint8."""
    ml_dtypes = pytest.importorskip("ml_dtypes")

    def bf16(t):
        return t.float().numpy().astype(ml_dtypes.bfloat16)

    args = dict(q=bf16(b.q), kv_cache=b.kv_cache.numpy(), inv_scale=bf16(b.inv_scale),
                indices=b.indices.numpy(), lens=b.lens.numpy())
    extra = b.extra_kwargs()
    if extra:
        args.update(extra_kv_cache=extra["extra_kv_cache"].numpy(),
                    extra_inv_scale=bf16(extra["extra_inv_scale"]),
                    extra_indices=extra["extra_indices"].numpy(),
                    extra_lens=extra["extra_lens"].numpy(),
                    extra_block_size=extra["extra_block_size"],
                    extra_window=extra["extra_window"])
    return args


def run(b: Batch, **kw):
    """swa_decode.decode on the batch's tensors, with its sink and extra source; keyword arguments
    add to or replace those."""
    args = dict(block_size=b.block_size, window_size=b.window_size, attn_sink=b.attn_sink,
                **b.extra_kwargs())
    args.update(kw)
    return swa_decode.decode(b.q, b.kv_cache, b.inv_scale, b.indices, b.lens, **args)


def reference(b: Batch, scale: Optional[float] = None):
    """docs/semantics.md in float64: returns out (T, H, D) and lse (T, H), both float64."""
    T, H, D = b.q.shape
    scale = D ** -0.5 if scale is None else scale
    out = torch.zeros(T, H, D, dtype=torch.float64)
    lse = torch.full((T, H), -math.inf, dtype=torch.float64)
    for t, q_t, k in entries(b, torch.float64):
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
    for t, q_t, k in entries(b, torch.float32):
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


@pytest.fixture
def op_calls(monkeypatch):
    """The names of the custom ops that decode() and the drop-in call, in order; an eager call
    (nothing tracing it) calls none."""
    calls = []
    for name in ("decode_op", "decode_out_op"):
        def counted(*args, _op=getattr(_torch_ops, name), _name=name, **kwargs):
            calls.append(_name)
            return _op(*args, **kwargs)
        monkeypatch.setattr(_torch_ops, name, counted)
    return calls


def op_calls_in(graph, op) -> list[dict]:
    """The arguments, by name and with the schema's defaults filled in, of each call of the custom
    op `op` (e.g. torch.ops.swa_decode.decode.default) in an FX graph, however the trace spelled
    them (make_fx records them positionally)."""
    schema = op._schema.arguments
    calls = []
    for node in graph.graph.nodes:
        if node.op == "call_function" and node.target == op:
            args = {a.name: a.default_value for a in schema if a.has_default_value()}
            args.update(zip((a.name for a in schema), node.args))
            args.update(node.kwargs)
            calls.append(args)
    return calls


def has_cuda() -> bool:
    return torch.cuda.is_available()
