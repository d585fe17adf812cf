"""swa_decode.flash_mla (FlashMLA's sparse-decode entry point) and decode(kv_format="model1"), on CPU
tensors (the float64 reference) and on CUDA tensors (the GPU kernels; skipped without a CUDA
device), against a MODEL1 packer and decoder of this file's own, written from the spec
(docs/semantics.md, "Row formats"), and a float64 attention in torch. On CUDA also: a CUDA-graph
capture replayed on new inputs, and no allocation beyond out and lse.

Every byte of a cache that no valid entry names is 0xFF: NaN as e4m3, as bf16 and as UE8M0, so a
read of an unused row, footer or pad shows as NaN in the output.

Tolerance: the CPU backend rounds the exact result once to bf16; a GPU kernel works in bf16 / fp32
like any fast kernel, so it is held, as in test_gpu.py, to twice the error of a plain bf16
pipeline (the softmax weights rounded to bf16; MODEL1 values are exact in bf16) on the same input,
plus one bf16 ulp of the output's magnitude."""

from __future__ import annotations

import math
import re

import pytest

torch = pytest.importorskip("torch")
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402
import swa_decode  # noqa: E402
from conftest import op_calls_in  # noqa: E402
from swa_decode import flash_mla as flash_mla_interface  # noqa: E402 (the engines' spelling)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# Every case runs on the CPU backend and, where there is one, on the GPU.
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]

D, NOPE, ROPE = 512, 448, 64
ROW, SCALE_ROW = 576, 8          # a row's bytes: 448 e4m3 + 64 * 2 bf16; a scale row: 7 UE8M0 + 1
GROUP = 64                       # e4m3 dims per UE8M0 scale
E4M3_MAX = 448.0
POISON = 0xFF


def block_stride(block_size: int, extra_rows: int = 0) -> int:
    """B rows and B scale rows, rounded up to a multiple of 576, plus extra_rows * 576 bytes."""
    return (-(-block_size * (ROW + SCALE_ROW) // ROW) + extra_rows) * ROW


class Model1Cache:
    """A MODEL1 cache of num_blocks blocks of block_size rows; write() packs float rows into slots.
    view(dtype) is FlashMLA's k_cache: (num_blocks, B, 1, 584) over the padded blocks."""

    def __init__(self, num_blocks: int, block_size: int, extra_rows: int = 0):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.stride = block_stride(block_size, extra_rows)
        self.bytes = torch.full((num_blocks * self.stride,), POISON, dtype=torch.uint8)
        self._on_device = {}  # device -> a copy of the bytes, made once (write() comes first)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def _row_at(self, slot: int) -> int:
        return (slot // self.block_size) * self.stride + (slot % self.block_size) * ROW

    def _scales_at(self, slot: int) -> int:
        block = slot // self.block_size
        return block * self.stride + self.block_size * ROW + (slot % self.block_size) * SCALE_ROW

    def write(self, slot: int, row: torch.Tensor) -> None:
        """Quantizes dims 0..447 to e4m3 with a power-of-two scale per 64 dims (the smallest that
        keeps the group within e4m3's range), keeps 448..511 as bf16; the pad byte stays 0xFF."""
        nope = row[:NOPE].double().view(NOPE // GROUP, GROUP)
        amax = nope.abs().amax(dim=1).clamp_min(2.0 ** -100)
        exponent = torch.ceil(torch.log2(amax / E4M3_MAX))
        codes = (nope / torch.exp2(exponent)[:, None]).to(torch.float8_e4m3fn)
        start = self._row_at(slot)
        self.bytes[start:start + NOPE] = codes.reshape(-1).view(torch.uint8)
        rope = row[NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
        self.bytes[start + NOPE:start + ROW] = rope
        scales = self._scales_at(slot)
        self.bytes[scales:scales + NOPE // GROUP] = (exponent + 127).to(torch.uint8)

    def decoded(self, slot: int) -> torch.Tensor:
        """Slot's 512 float64 values, read back from the bytes (UE8M0 255 and unwritten rows are
        NaN)."""
        start = self._row_at(slot)
        codes = self.bytes[start:start + NOPE].clone().view(torch.float8_e4m3fn).double()
        scale_bytes = self.bytes[self._scales_at(slot):][:NOPE // GROUP].double()
        scales = torch.where(scale_bytes == 255, math.nan, torch.exp2(scale_bytes - 127))
        rope = self.bytes[start + NOPE:start + ROW].clone().view(torch.bfloat16).double()
        return torch.cat([(codes.view(-1, GROUP) * scales[:, None]).reshape(-1), rope])

    def view(self, dtype=torch.uint8, device="cpu") -> torch.Tensor:
        """FlashMLA's k_cache over the bytes on `device` (one copy per device, so that two views
        on one device share their storage as one engine cache does)."""
        device = torch.device(device)
        if device.type == "cpu":
            flat = self.bytes
        else:
            flat = self._on_device.setdefault(device, self.bytes.to(device))
        return flat.view(dtype).as_strided((self.num_blocks, self.block_size, 1, ROW + SCALE_ROW),
                                           (self.stride, ROW + SCALE_ROW, ROW + SCALE_ROW, 1))


def filled_cache(gen, num_blocks, block_size, live_slots, extra_rows=0) -> Model1Cache:
    """A cache whose live_slots hold random rows (RoPE values about 1, e4m3 groups at scales from
    2^-6 to 2^3); every other slot keeps its poison."""
    cache = Model1Cache(num_blocks, block_size, extra_rows)
    for slot in live_slots:
        row = torch.randn(D, generator=gen, dtype=torch.float64)
        group_scale = torch.exp2(torch.randint(-6, 4, (NOPE // GROUP,), generator=gen).double())
        row[:NOPE] *= group_scale.repeat_interleave(GROUP)
        cache.write(int(slot), row)
    return cache


def reference(q, sources, softmax_scale, attn_sink, bf16_weights=False):
    """float64 attention: sources = [(cache, indices (b, s_q, topk), lens (b,) or None)]; a valid
    entry is one of the first lens columns with an id other than -1. Returns out (b, s_q, h_q, D)
    and lse (b, h_q, s_q), lse +inf for a row with no entry (FlashMLA's convention).
    bf16_weights: a plain bf16 pipeline instead (the softmax weights rounded to bf16 before they
    weigh the rows), only to derive the GPU tolerance."""
    q = q.cpu()
    sources = [(cache, indices.cpu(), None if lens is None else lens.cpu())
               for cache, indices, lens in sources]
    attn_sink = None if attn_sink is None else attn_sink.cpu()
    batch, s_q, h_q, _ = q.shape
    out = torch.zeros(batch, s_q, h_q, D, dtype=torch.float64)
    lse = torch.full((batch, h_q, s_q), math.inf, dtype=torch.float64)
    for b in range(batch):
        for s in range(s_q):
            rows = []
            for cache, indices, lens in sources:
                count = indices.shape[2] if lens is None else int(lens[b])
                rows += [cache.decoded(int(i)) for i in indices[b, s, :count] if int(i) != -1]
            if not rows:
                continue
            kv = torch.stack(rows)                          # (n, D)
            scores = q[b, s].double() @ kv.T * softmax_scale  # (h_q, n)
            top = scores.amax(dim=1, keepdim=True)
            if attn_sink is not None:
                top = torch.maximum(top, attn_sink.double()[:, None])
            weights = torch.exp(scores - top)
            denominator = weights.sum(dim=1, keepdim=True)
            lse[b, :, s] = (torch.log(denominator) + top)[:, 0]
            if attn_sink is not None:
                denominator = denominator + torch.exp(attn_sink.double()[:, None] - top)
            probabilities = weights / denominator
            if bf16_weights:
                probabilities = probabilities.to(torch.bfloat16).double()
            out[b, s] = probabilities @ kv
    return out, lse


def random_indices(gen, batch, s_q, topk, live_slots, lens, dead_slot):
    """(b, s_q, topk) int32: columns before lens[b] name live slots (some -1), the rest a poisoned
    slot, so that reading past a length shows as NaN."""
    live = torch.as_tensor(live_slots)
    picks = live[torch.randint(0, len(live), (batch, s_q, topk), generator=gen)].int()
    picks[torch.rand(batch, s_q, topk, generator=gen) < 0.1] = -1
    if lens is not None:
        past = torch.arange(topk)[None, None, :] >= lens.long()[:, None, None]
        picks[past.expand_as(picks)] = dead_slot
    return picks


def make_q(gen, batch, s_q, h_q):
    return torch.randn(batch, s_q, h_q, D, generator=gen).to(torch.bfloat16)


def check(out, lse, ref_out, ref_lse, baseline_out=None):
    """out and lse against the float64 reference: as the CPU backend's exact result rounded to
    bf16, or, given baseline_out (reference(..., bf16_weights=True)), within the GPU tolerance
    above."""
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    out, lse = out.cpu().double(), lse.cpu().double()
    assert not out.isnan().any(), "a poisoned byte was read"
    if baseline_out is None:
        torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=2e-2)
    else:
        baseline_err = (baseline_out.to(torch.bfloat16).double() - ref_out).abs().max().item()
        tol = 2 * baseline_err + ref_out.abs().max().item() * 2.0 ** -8
        err = (out - ref_out).abs().max().item()
        assert err <= tol, (f"max error {err:.3g} > tolerance {tol:.3g} "
                            f"(bf16 baseline {baseline_err:.3g})")
        empty = ref_out.abs().amax(dim=(2, 3)) == 0
        assert (out[empty] == 0).all(), "rows without entries must give exactly 0"
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-4)


def check_against_reference(out, lse, q, sources, softmax_scale, attn_sink, rows=slice(None),
                            heads=slice(None)):
    """check() of out[rows, :, heads] and lse[rows, heads] against the reference over the same q
    heads, with the GPU tolerance when out is on CUDA."""
    q = q[:, :, heads]
    attn_sink = None if attn_sink is None else attn_sink[heads]
    ref_out, ref_lse = reference(q, sources, softmax_scale, attn_sink)
    baseline = None
    if out.is_cuda:
        baseline = reference(q, sources, softmax_scale, attn_sink, bf16_weights=True)[0][rows]
    check(out[rows][:, :, heads], lse[rows][:, heads], ref_out[rows], ref_lse[rows], baseline)


def call(q, cache, indices, **kwargs):
    metadata, num_splits = flash_mla_interface.get_mla_metadata()
    return flash_mla_interface.flash_mla_with_kvcache(
        q, cache, None, None, 512, metadata, num_splits, is_fp8_kvcache=True, indices=indices,
        **kwargs)


def on(device, *tensors):
    """The tensors on `device` (None stays None)."""
    moved = tuple(None if t is None else t.to(device) for t in tensors)
    return moved if len(moved) > 1 else moved[0]


# ---- against the float64 reference ----------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("h_q", [8, 16, 64, 128])
@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("with_extra", [False, True])
def test_matches_reference(h_q, s_q, with_extra, device):
    gen = torch.Generator().manual_seed(h_q * 10 + s_q + with_extra)
    batch, topk, block_size = 3, 32, 64
    live = list(range(0, 3 * block_size, 3))  # every third slot of 4 blocks; slot 1 is poisoned
    cache = filled_cache(gen, 4, block_size, live)
    lens = torch.tensor([topk, 5, 17], dtype=torch.int32)
    indices = random_indices(gen, batch, s_q, topk, live, lens, dead_slot=1)
    q = make_q(gen, batch, s_q, h_q)
    sink = torch.randn(h_q, generator=gen, dtype=torch.float32)
    sources = [(cache, indices, lens)]
    kwargs = {}
    if with_extra:
        extra_live = [1, 2, 3]  # of 2 blocks of 2 rows; slot 0 is poisoned
        extra = filled_cache(gen, 2, 2, extra_live, extra_rows=1)  # a stride past the minimum
        extra_lens = torch.tensor([0, 6, 3], dtype=torch.int32)
        extra_indices = random_indices(gen, batch, s_q, 6, extra_live, extra_lens, dead_slot=0)
        sources.append((extra, extra_indices, extra_lens))
        kwargs = dict(extra_k_cache=extra.view(torch.int8, device),
                      extra_indices_in_kvcache=on(device, extra_indices),
                      extra_topk_length=on(device, extra_lens))
    out, lse = call(on(device, q), cache.view(device=device), on(device, indices),
                    topk_length=on(device, lens), attn_sink=on(device, sink), **kwargs)
    assert out.shape == (batch, s_q, h_q, D) and lse.shape == (batch, h_q, s_q)
    assert out.device == q.to(device).device and lse.device == out.device
    check_against_reference(out, lse, q, sources, 512 ** -0.5, sink)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.float8_e4m3fn])
def test_every_column_counts_without_topk_length(dtype, device):
    gen = torch.Generator().manual_seed(7)
    live = [0, 2, 5, 6, 9]
    cache = filled_cache(gen, 3, 4, live)
    indices = random_indices(gen, 2, 1, 8, live, None, dead_slot=1)
    q = make_q(gen, 2, 1, 16)
    out, lse = call(on(device, q), cache.view(dtype, device), on(device, indices),
                    softmax_scale=0.07)
    check_against_reference(out, lse, q, [(cache, indices, None)], 0.07, None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("s_q", [2, 3])
@pytest.mark.parametrize("with_lengths", [True, False])
def test_lengths_read_in_place_equal_explicit_per_row_lengths(with_lengths, s_q, device):
    """flash_mla reads topk_length (b,) in place for all s_q rows of a batch row
    (lens_rows_per_entry = s_q) and None as "every column counts" (no lens): out and lse equal,
    bit for bit, decode() given the per-row lengths flash_mla once allocated, (b * s_q,) int32,
    the repeat of each length or topk in every row; in both sources. And both match the float64
    reference."""
    gen = torch.Generator().manual_seed(40 + s_q + 10 * with_lengths)
    batch, topk, extra_topk, h_q, block_size = 3, 24, 6, 16, 64
    live = list(range(0, 3 * block_size, 3))
    cache = filled_cache(gen, 4, block_size, live)
    extra_live = [1, 2, 3]
    extra = filled_cache(gen, 2, 2, extra_live, extra_rows=1)
    lens = torch.tensor([topk, 0, 7], dtype=torch.int32) if with_lengths else None
    extra_lens = torch.tensor([2, 6, 0], dtype=torch.int32) if with_lengths else None
    indices = random_indices(gen, batch, s_q, topk, live, lens, dead_slot=1)
    extra_indices = random_indices(gen, batch, s_q, extra_topk, extra_live, extra_lens,
                                   dead_slot=0)
    q = make_q(gen, batch, s_q, h_q)
    sink = torch.randn(h_q, generator=gen, dtype=torch.float32)
    window_view, extra_view = cache.view(device=device), extra.view(device=device)
    out, lse = call(on(device, q), window_view, on(device, indices), topk_length=on(device, lens),
                    attn_sink=on(device, sink), extra_k_cache=extra_view,
                    extra_indices_in_kvcache=on(device, extra_indices),
                    extra_topk_length=on(device, extra_lens))

    def per_row(lengths, columns):
        if lengths is None:
            return torch.full((batch * s_q,), columns, dtype=torch.int32)
        return lengths.repeat_interleave(s_q)

    rows = batch * s_q
    explicit_out, explicit_lse = swa_decode.decode(
        on(device, q).view(rows, h_q, D), window_view[:, :, 0], None,
        on(device, indices).view(rows, topk), on(device, per_row(lens, topk)),
        block_size=block_size, scale=512 ** -0.5, attn_sink=on(device, sink), return_lse=True,
        kv_format="model1", extra_kv_cache=extra_view[:, :, 0],
        extra_indices=on(device, extra_indices).view(rows, extra_topk),
        extra_lens=on(device, per_row(extra_lens, extra_topk)), extra_block_size=2,
        extra_kv_format="model1", empty_token_lse=math.inf)
    assert torch.equal(out.view(rows, h_q, D), explicit_out)
    assert torch.equal(lse.transpose(1, 2).reshape(rows, h_q), explicit_lse)
    check_against_reference(out, lse, q, [(cache, indices, lens), (extra, extra_indices,
                                                                   extra_lens)],
                            512 ** -0.5, sink)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_row_gets_zero_and_lse_plus_inf(device):
    gen = torch.Generator().manual_seed(3)
    cache = filled_cache(gen, 2, 4, [0, 3, 4])
    indices = torch.tensor([[[0, 3, 4]], [[-1, -1, -1]], [[0, 3, 1]]], dtype=torch.int32)
    lens = torch.tensor([3, 3, 0], dtype=torch.int32)
    q = make_q(gen, 3, 1, 8)
    out, lse = call(on(device, q), cache.view(device=device), on(device, indices),
                    topk_length=on(device, lens))
    assert torch.isinf(lse[1:]).all() and (lse[1:] > 0).all(), lse
    assert (out[1:] == 0).all()
    check_against_reference(out, lse, q, [(cache, indices, lens)], 512 ** -0.5, None)


@pytest.mark.parametrize("device", DEVICES)
def test_out_is_written_in_place_and_metadata_is_reused(device):
    gen = torch.Generator().manual_seed(4)
    cache = filled_cache(gen, 2, 8, range(16))
    metadata = flash_mla_interface.get_mla_metadata(None, 1, 1, num_heads_q=8, topk=4)
    for batch, h_q in ((2, 8), (3, 4)):  # one metadata object for shapes it never saw
        q = make_q(gen, batch, 1, h_q)
        indices = torch.randint(0, 16, (batch, 1, 4), generator=gen, dtype=torch.int32)
        out = torch.full((batch, 1, h_q, D), math.nan, dtype=torch.bfloat16, device=device)
        result, lse = flash_mla_interface.flash_mla_with_kvcache(
            on(device, q), cache.view(device=device), None, None, 512, metadata,
            is_fp8_kvcache=True, indices=on(device, indices), out=out)
        assert result is out
        check_against_reference(out, lse, q, [(cache, indices, None)], 512 ** -0.5, None)


@needs_cuda
def test_both_sources_in_one_cache_on_cuda():
    """Two query rows a batch row (s_q = 2, one length for both), the extra source reading the
    window's very cache and ids: every entry counts twice."""
    gen = torch.Generator().manual_seed(13)
    live = list(range(0, 64, 2))
    cache = filled_cache(gen, 2, 64, live)
    lens = torch.tensor([9, 0], dtype=torch.int32)
    indices = random_indices(gen, 2, 2, 16, live, lens, dead_slot=1)
    q = make_q(gen, 2, 2, 64)
    sink = torch.randn(64, generator=gen, dtype=torch.float32)
    view = cache.view(device="cuda")
    out, lse = call(q.cuda(), view, indices.cuda(), topk_length=lens.cuda(), attn_sink=sink.cuda(),
                    extra_k_cache=view, extra_indices_in_kvcache=indices.cuda(),
                    extra_topk_length=lens.cuda())
    check_against_reference(out, lse, q, [(cache, indices, lens), (cache, indices, lens)],
                            512 ** -0.5, sink)


# ---- the eager call and the general path ------------------------------------------------------
def two_source_case(gen, s_q):
    """A batch of 4 rows of s_q query rows over both sources, rows 1 and 3 without entries."""
    batch, topk, extra_topk, h_q, block_size = 4, 16, 6, 16, 64
    live = list(range(0, 3 * block_size, 3))
    cache = filled_cache(gen, 4, block_size, live)
    extra_live = [1, 2, 3]
    extra = filled_cache(gen, 2, 2, extra_live, extra_rows=1)
    lens = torch.tensor([topk, 0, 7, 3], dtype=torch.int32)
    extra_lens = torch.tensor([2, 0, 0, 0], dtype=torch.int32)
    indices = random_indices(gen, batch, s_q, topk, live, lens, dead_slot=1)
    indices[3] = -1
    extra_indices = random_indices(gen, batch, s_q, extra_topk, extra_live, extra_lens,
                                   dead_slot=0)
    q = make_q(gen, batch, s_q, h_q)
    sink = torch.randn(h_q, generator=gen, dtype=torch.float32)
    return q, (cache, indices, lens), (extra, extra_indices, extra_lens), sink


def eager_and_general(flash_mla, monkeypatch):
    """flash_mla()'s result on the eager call, which must not reach decode() (the binding reads
    FlashMLA's shapes itself), and on the general path (the custom ops, as under a trace)."""
    def no_decode(*args, **kwargs):
        raise AssertionError("the eager call went through decode()")

    with monkeypatch.context() as patch:
        patch.setattr(flash_mla_interface, "decode", no_decode)
        eager = flash_mla()
    with monkeypatch.context() as patch:
        patch.setattr(swa_decode._torch_ops, "eager", lambda q: False)
        general = flash_mla()
    return eager, general


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("s_q", [1, 3])
@pytest.mark.parametrize("out_given", [False, True])
def test_eager_call_equals_the_general_path(s_q, out_given, device, monkeypatch):
    """An eager call goes to the binding alone (decode() is never called) and gives, bit for bit,
    what the general path (the custom ops, as under a trace) gives: out, lse with the same
    strides, +inf for the rows without entries."""
    gen = torch.Generator().manual_seed(60 + s_q)
    q, (cache, indices, lens), (extra, extra_indices, extra_lens), sink = two_source_case(gen, s_q)
    q_on, indices_on, lens_on, extra_indices_on, extra_lens_on, sink_on = on(
        device, q, indices, lens, extra_indices, extra_lens, sink)
    window_view, extra_view = cache.view(device=device), extra.view(device=device)

    def flash_mla():
        out = torch.full(q.shape, math.nan, dtype=torch.bfloat16, device=device)
        returned = call(q_on, window_view, indices_on, topk_length=lens_on, attn_sink=sink_on,
                        extra_k_cache=extra_view, extra_indices_in_kvcache=extra_indices_on,
                        extra_topk_length=extra_lens_on, out=out if out_given else None)
        assert returned[0] is out or not out_given
        return returned

    (eager_out, eager_lse), (general_out, general_lse) = eager_and_general(flash_mla, monkeypatch)
    assert torch.equal(eager_out, general_out)
    assert eager_lse.shape == general_lse.shape == (4, 16, s_q)
    assert eager_lse.stride() == general_lse.stride()
    assert torch.equal(eager_lse, general_lse)
    assert (eager_lse[1] == math.inf).all() and (eager_lse[3] == math.inf).all()
    check_against_reference(eager_out, eager_lse, q, [(cache, indices, lens),
                                                      (extra, extra_indices, extra_lens)],
                            512 ** -0.5, sink)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("s_q", [1, 2])
def test_eager_call_reads_strided_views_in_place(s_q, device, monkeypatch):
    """q and out as the first 16 heads of 24-head buffers, the indices as the first columns of
    wider rows, lse as given: strides that still merge b and s_q are read in place (decode() is
    never called) and give what the general path gives."""
    gen = torch.Generator().manual_seed(80 + s_q)
    q, (cache, indices, lens), (extra, extra_indices, extra_lens), sink = two_source_case(gen, s_q)
    batch, _, h_q, _ = q.shape
    wide_q = torch.zeros(batch, s_q, h_q + 8, D, dtype=torch.bfloat16)
    wide_q[:, :, :h_q] = q
    wide_indices = torch.full((batch, s_q, indices.shape[2] + 5), 1, dtype=torch.int32)
    wide_indices[:, :, :indices.shape[2]] = indices
    q_view = on(device, wide_q)[:, :, :h_q]
    indices_view = on(device, wide_indices)[:, :, :indices.shape[2]]
    assert not q_view.is_contiguous() and not indices_view.is_contiguous()
    window_view, extra_view = cache.view(device=device), extra.view(device=device)
    lens_on, extra_indices_on, extra_lens_on, sink_on = on(device, lens, extra_indices, extra_lens,
                                                           sink)

    def flash_mla():
        out = torch.full((batch, s_q, h_q + 8, D), math.nan, dtype=torch.bfloat16,
                         device=device)[:, :, :h_q]
        return call(q_view, window_view, indices_view, topk_length=lens_on, attn_sink=sink_on,
                    extra_k_cache=extra_view, extra_indices_in_kvcache=extra_indices_on,
                    extra_topk_length=extra_lens_on, out=out)

    (eager_out, eager_lse), (general_out, general_lse) = eager_and_general(flash_mla, monkeypatch)
    assert torch.equal(eager_out, general_out) and torch.equal(eager_lse, general_lse)
    check_against_reference(eager_out, eager_lse, q, [(cache, indices, lens),
                                                      (extra, extra_indices, extra_lens)],
                            512 ** -0.5, sink)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("s_q", [1, 3])
def test_general_path_is_one_op_that_writes_plus_inf(s_q, device):
    """Traced (make_fx on real tensors: the general path), flash_mla_with_kvcache is one
    swa_decode op asked for +inf (empty_lse_positive=True) and no pass over lse after it: the
    rows without entries come out +inf from the op itself, as from the eager call."""
    gen = torch.Generator().manual_seed(90 + s_q)
    q, (cache, indices, lens), (extra, extra_indices, extra_lens), sink = two_source_case(gen, s_q)
    args = (*on(device, q, indices, lens, extra_indices, extra_lens, sink),
            cache.view(device=device), extra.view(device=device))

    def flash_mla(q, indices, lens, extra_indices, extra_lens, sink, window_view, extra_view):
        return call(q, window_view, indices, topk_length=lens, attn_sink=sink,
                    extra_k_cache=extra_view, extra_indices_in_kvcache=extra_indices,
                    extra_topk_length=extra_lens)

    graph = make_fx(flash_mla)(*args)
    ops = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
    assert [op for op in ops if "swa_decode" in op] == ["swa_decode.decode_out.default"], ops
    assert not [op for op in ops if "nan_to_num" in op], ops
    calls = op_calls_in(graph, torch.ops.swa_decode.decode_out.default)
    assert calls[0]["empty_lse_positive"] is True, graph.code
    out, lse = graph(*args)
    assert (lse[1] == math.inf).all() and (lse[3] == math.inf).all()
    eager_out, eager_lse = flash_mla(*args)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    check_against_reference(out, lse, q, [(cache, indices, lens),
                                          (extra, extra_indices, extra_lens)], 512 ** -0.5, sink)


@pytest.mark.parametrize("path", ["eager", "general"])
def test_nan_q_head_gives_nan_lse_on_the_cpu_and_empty_rows_stay_plus_inf(path, monkeypatch):
    """A NaN q head (an engine's uninitialized padding head) gives NaN in that head's lse on the
    CPU backend, which propagates NaN (docs/semantics.md, "NaN inputs"; a GPU kernel's result
    there is unspecified), on both paths; a row without entries is +inf in every head, the NaN
    one too, and the other heads are untouched."""
    gen = torch.Generator().manual_seed(95)
    q, (cache, indices, lens), (extra, extra_indices, extra_lens), sink = two_source_case(gen, 1)
    q[:, :, 5] = math.nan
    if path == "general":
        monkeypatch.setattr(swa_decode._torch_ops, "eager", lambda q: False)
    out, lse = call(q, cache.view(), indices, topk_length=lens, attn_sink=sink,
                    extra_k_cache=extra.view(), extra_indices_in_kvcache=extra_indices,
                    extra_topk_length=extra_lens)
    assert lse[[0, 2], 5].isnan().all()
    assert (lse[[1, 3]] == math.inf).all() and (out[[1, 3]] == 0).all()
    heads = [h for h in range(q.shape[2]) if h != 5]
    check_against_reference(out, lse, q, [(cache, indices, lens),
                                          (extra, extra_indices, extra_lens)], 512 ** -0.5, sink,
                            heads=heads)


@pytest.mark.parametrize("device", DEVICES)
def test_eager_call_leaves_what_it_cannot_read_to_the_general_path(device):
    """Strides that do not merge into rows (out over every other batch row of a larger buffer,
    indices the same) are the general path's: it copies the indices and reports out."""
    gen = torch.Generator().manual_seed(70)
    q, (cache, indices, lens), _, _ = two_source_case(gen, 2)
    q_on, lens_on = on(device, q, lens)
    spaced_indices = on(device, indices).repeat_interleave(2, dim=0)[::2]
    assert not spaced_indices.is_contiguous()
    out, lse = call(q_on, cache.view(device=device), spaced_indices, topk_length=lens_on)
    check_against_reference(out, lse, q, [(cache, indices, lens)], 512 ** -0.5, None)
    spaced_out = torch.empty((8, 2, 16, D), dtype=torch.bfloat16, device=device)[::2]
    with pytest.raises(ValueError, match="out must be viewable as"):
        call(q_on, cache.view(device=device), on(device, indices), topk_length=lens_on,
             out=spaced_out)


# ---- playing an engine -----------------------------------------------------------------------
VLLM_REAL_ROWS, VLLM_ROWS, VLLM_BLOCK = 3, 5, 64


def vllm_case(gen, heads, caches=None):
    """vLLM's decode of a C4A layer: q (T, 1, H, 512), caches (nb, 64, 1, 584) uint8, the window
    and the compressed entries; the CUDA-graph padding rows past the VLLM_REAL_ROWS real ones have
    lengths 0 (ids -1). caches: the (window, compressed) caches of an earlier case to reuse, else
    new ones. Returns q, the two caches, (indices, lens) of each, and the sink."""
    live = list(range(0, 2 * VLLM_BLOCK, 2))
    window_cache, compressed_cache = caches or (filled_cache(gen, 3, VLLM_BLOCK, live),
                                                filled_cache(gen, 2, VLLM_BLOCK, live[:20]))
    lens = torch.tensor([16, 9, 1, 0, 0], dtype=torch.int32)
    extra_lens = torch.tensor([12, 0, 5, 0, 0], dtype=torch.int32)
    indices = random_indices(gen, VLLM_ROWS, 1, 16, live, lens, dead_slot=1)
    extra_indices = random_indices(gen, VLLM_ROWS, 1, 12, live[:20], extra_lens, dead_slot=1)
    indices[VLLM_REAL_ROWS:] = -1
    extra_indices[VLLM_REAL_ROWS:] = -1
    q = make_q(gen, VLLM_ROWS, 1, heads)
    sink = torch.randn(heads, generator=gen, dtype=torch.float32)
    return q, window_cache, compressed_cache, (indices, lens), (extra_indices, extra_lens), sink


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads", [8, 16, 64, 128])
def test_plays_vllm(heads, device):
    gen = torch.Generator().manual_seed(11 + heads)
    real = VLLM_REAL_ROWS
    q, window_cache, compressed_cache, (indices, lens), (extra_indices, extra_lens), sink = \
        vllm_case(gen, heads)
    out, lse = call(on(device, q), window_cache.view(device=device), on(device, indices),
                    topk_length=on(device, lens), attn_sink=on(device, sink),
                    extra_k_cache=compressed_cache.view(device=device),
                    extra_indices_in_kvcache=on(device, extra_indices),
                    extra_topk_length=on(device, extra_lens))
    check_against_reference(out, lse, q, [(window_cache, indices, lens),
                                          (compressed_cache, extra_indices, extra_lens)],
                            512 ** -0.5, sink, rows=slice(0, real))
    assert (out[real:] == 0).all() and (lse[real:] == math.inf).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads, rank_heads", [(64, 8), (64, 16), (128, 64)])
def test_plays_sglang(heads, rank_heads, device):
    """SGLang: padding rows name slot 0 with length 1; this rank's heads are the first rank_heads
    of q's, the rest of q uninitialized (NaN here), which must not leak into the heads it checks."""
    gen = torch.Generator().manual_seed(12 + rank_heads)
    real, padded, block_size = 2, 4, 64
    live = list(range(0, block_size))
    cache = filled_cache(gen, 2, block_size, live)  # block 1 is poisoned
    lens = torch.tensor([20, 7, 1, 1], dtype=torch.int32)
    indices = random_indices(gen, padded, 1, 20, live, lens, dead_slot=block_size)
    indices[real:, :, 0] = 0
    q = make_q(gen, padded, 1, heads)
    q[:, :, rank_heads:] = math.nan
    out, lse = call(on(device, q), cache.view(torch.float8_e4m3fn, device), on(device, indices),
                    topk_length=on(device, lens))
    check_against_reference(out, lse, q, [(cache, indices, lens)], 512 ** -0.5, None,
                            rows=slice(0, real), heads=slice(0, rank_heads))
    assert out[real:, :, :rank_heads].isfinite().all()  # padding rows: slot 0, finite


# ---- decode(kv_format=...) through each path -------------------------------------------------
def model1_decode_case():
    gen = torch.Generator().manual_seed(5)
    cache = filled_cache(gen, 2, 4, [0, 1, 2, 5])
    indices = torch.tensor([[0, 5, 2], [1, -1, 3]], dtype=torch.int32)
    lens = torch.tensor([3, 2], dtype=torch.int32)
    q = make_q(gen, 2, 1, 8)
    return q, cache, indices, lens


@pytest.mark.parametrize("device", DEVICES)
def test_decode_reads_model1_on_each_path(device):
    q, cache, indices, lens = model1_decode_case()
    kv = cache.view(device=device)[:, :, 0]  # (num_blocks, B, 584): the 3-D spelling
    q_rows, indices_on, lens_on = on(device, q[:, 0], indices, lens)
    eager_out, eager_lse = swa_decode.decode(q_rows, kv, None, indices_on, lens_on, block_size=4,
                                             scale=0.05, return_lse=True, kv_format="model1")
    op_out, op_lse = torch.ops.swa_decode.decode(q_rows, kv, None, indices_on, lens_on, None, 4,
                                                 0.05, None, True, kv_format="model1")
    out = torch.empty_like(q_rows)
    lse = torch.empty(q_rows.shape[:2], dtype=torch.float32, device=device)
    torch.ops.swa_decode.decode_out(q_rows, kv, None, indices_on, lens_on, None, out, lse, 4, 0.05,
                                    None, kv_format="model1")
    for o, l in ((eager_out, eager_lse), (op_out, op_lse), (out, lse)):
        assert o.device == q_rows.device
        # decode's lse says -inf for an empty row where flash_mla says +inf: none is empty here.
        check_against_reference(o[:, None], l[:, :, None], q, [(cache, indices[:, None], lens)],
                                0.05, None)


# ---- argument errors -------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, words", [
    (dict(indices=None), NotImplementedError, "indices=None"),
    (dict(causal=True), NotImplementedError, "causal=True"),
    (dict(is_fp8_kvcache=False), NotImplementedError, "is_fp8_kvcache=False"),
    (dict(head_dim_v=256), ValueError, "head_dim_v must be 512"),
    (dict(topk_length=torch.ones(3, dtype=torch.int32)), ValueError, "topk_length must be"),
    (dict(extra_topk_length=torch.ones(2, dtype=torch.int32)), ValueError, "need extra_k_cache"),
])
def test_flash_mla_argument_errors(kwargs, error, words):
    gen = torch.Generator().manual_seed(6)
    cache = filled_cache(gen, 1, 4, [0])
    args = dict(q=make_q(gen, 2, 1, 8), k_cache=cache.view(), block_table=None,
                cache_seqlens=None, head_dim_v=512, tile_scheduler_metadata=None,
                is_fp8_kvcache=True, indices=torch.zeros(2, 1, 1, dtype=torch.int32))
    args.update(kwargs)
    with pytest.raises(error, match=words):
        flash_mla_interface.flash_mla_with_kvcache(**args)


def test_decode_format_errors():
    q, cache, indices, lens = model1_decode_case()
    q, kv = q[:, 0], cache.view()[:, :, 0]
    with pytest.raises(ValueError, match="kv_format must be 'e4m3' or 'model1', got 'fp8'"):
        swa_decode.decode(q, kv, None, indices, lens, block_size=4, kv_format="fp8")
    with pytest.raises(TypeError, match="extra_kv_format must be a str"):
        swa_decode.decode(q, kv, None, indices, lens, block_size=4, extra_kv_format=1)
    with pytest.raises(ValueError, match=r"kv_cache.shape\[2\] must equal .* = 584, got 576"):
        swa_decode.decode(q, kv[..., :576], None, indices, lens, block_size=4,
                          kv_format="model1")
    with pytest.raises(ValueError, match="inv_scale is required for kv_format 'e4m3'"):
        swa_decode.decode(q, kv, None, indices, lens, block_size=4)
    with pytest.raises(TypeError, match="must have dtype uint8, int8 or float8_e4m3fn"):
        swa_decode.decode(q, torch.zeros(2, 4, 584, dtype=torch.float16), None, indices, lens,
                          block_size=4, kv_format="model1")
    missing = "missing extra_block_size (given: extra_kv_cache, extra_indices)"
    with pytest.raises(ValueError, match=re.escape(missing)):
        swa_decode.decode(q, kv, None, indices, lens, block_size=4, kv_format="model1",
                          extra_kv_cache=kv, extra_indices=indices, extra_kv_format="model1")


# ---- CUDA: graph capture and allocations -----------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("with_extra", [False, True])
def test_cuda_graph_capture_replays_new_contents(with_extra):
    """Captured once; replayed after new q, indices and lengths (of both sources) were copied into
    the captured buffers, each replay matching the reference of what the buffers then held."""
    heads, real = 64, VLLM_REAL_ROWS
    cases = [vllm_case(torch.Generator().manual_seed(21), heads)]
    window_cache, compressed_cache = cases[0][1:3]  # one engine cache for every step
    cases += [vllm_case(torch.Generator().manual_seed(seed), heads,
                        (window_cache, compressed_cache)) for seed in (22, 23)]
    q0, _, _, (indices0, lens0), (extra_indices0, extra_lens0), sink = cases[0]
    static = dict(q=q0.cuda(), indices=indices0.cuda(), lens=lens0.cuda(),
                  extra_indices=extra_indices0.cuda(), extra_lens=extra_lens0.cuda())
    out = torch.empty(q0.shape, dtype=torch.bfloat16, device="cuda")
    window_view, compressed_view, cuda_sink = (window_cache.view(device="cuda"),
                                               compressed_cache.view(device="cuda"), sink.cuda())

    def step():
        extra = dict(extra_k_cache=compressed_view,
                     extra_indices_in_kvcache=static["extra_indices"],
                     extra_topk_length=static["extra_lens"]) if with_extra else {}
        return call(static["q"], window_view, static["indices"], topk_length=static["lens"],
                    attn_sink=cuda_sink, out=out, **extra)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = step()

    for q, _, _, (indices, lens), (extra_indices, extra_lens), _ in cases[1:] + cases[:1]:
        for name, value in dict(q=q, indices=indices, lens=lens, extra_indices=extra_indices,
                                extra_lens=extra_lens).items():
            static[name].copy_(value)
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        sources = [(window_cache, indices, lens)]
        if with_extra:
            sources.append((compressed_cache, extra_indices, extra_lens))
        check_against_reference(out, lse, q, sources, 512 ** -0.5, sink, rows=slice(0, real))
        assert (out[real:] == 0).all() and (lse[real:] == math.inf).all()


def allocator_counts():
    """The caching allocator's cumulative allocation count and requested bytes on this device."""
    stats = torch.cuda.memory_stats()
    return stats["allocation.all.allocated"], stats.get("requested_bytes.all.allocated")


def batch_rows(case, s_q, with_lengths):
    """vllm_case's q, ids and lengths (T = 5 rows, s_q = 1) as a call with s_q query rows a batch
    row: its first 4 rows as 4 / s_q batch rows, each batch row's length the shortest of its rows'
    (no poisoned column is read), or no lengths at all, the poisoned slot's ids (slot 1, past a
    row's length) then made -1."""
    q, _, _, (indices, lens), (extra_indices, extra_lens), _ = case
    rows, batch = 4, 4 // s_q
    if with_lengths:
        lengths = [x[:rows].view(batch, s_q).amin(dim=1) for x in (lens, extra_lens)]
    else:
        lengths = [None, None]
        indices, extra_indices = (torch.where(x == 1, -1, x) for x in (indices, extra_indices))
    return (q[:rows].reshape(batch, s_q, *q.shape[2:]), indices[:rows].reshape(batch, s_q, -1),
            lengths[0], extra_indices[:rows].reshape(batch, s_q, -1), lengths[1])


@needs_cuda
@pytest.mark.parametrize("s_q,with_lengths", [(1, True), (2, True), (1, False), (2, False)])
def test_calls_allocate_nothing_beyond_out_and_lse(s_q, with_lengths):
    """With out= given, flash_mla_with_kvcache allocates its lse alone, (b * s_q, h_q) fp32, per
    call; without, out too; decode(..., out=, lse=) allocates nothing. Whatever s_q, and with or
    without lengths: (b,) lengths are read in place for all s_q rows, None is no lens."""
    heads, calls = 64, 20
    case = vllm_case(torch.Generator().manual_seed(31), heads)
    window_cache, compressed_cache, sink = case[1], case[2], case[5]
    q, indices, lens, extra_indices, extra_lens = on("cuda", *batch_rows(case, s_q, with_lengths))
    sink = sink.cuda()
    window_view = window_cache.view(device="cuda")
    compressed_view = compressed_cache.view(device="cuda")
    out = torch.empty(q.shape, dtype=torch.bfloat16, device="cuda")
    lse_bytes = q.shape[0] * q.shape[1] * heads * 4
    out_bytes = out.numel() * out.element_size()

    def flash_mla(**kwargs):
        return call(q, window_view, indices, topk_length=lens, attn_sink=sink,
                    extra_k_cache=compressed_view, extra_indices_in_kvcache=extra_indices,
                    extra_topk_length=extra_lens, **kwargs)

    rows_q, rows_out = q.view(-1, heads, D), out.view(-1, heads, D)
    rows_lse = torch.empty(rows_q.shape[:2], dtype=torch.float32, device="cuda")

    def decode_in_place():
        swa_decode.decode(rows_q, window_view[:, :, 0], None, indices.view(-1, indices.shape[-1]),
                          lens, block_size=64, attn_sink=sink, out=rows_out, return_lse=True,
                          lse=rows_lse, kv_format="model1", lens_rows_per_entry=s_q,
                          extra_kv_cache=compressed_view[:, :, 0],
                          extra_indices=extra_indices.view(-1, extra_indices.shape[-1]),
                          extra_lens=extra_lens, extra_lens_rows_per_entry=s_q,
                          extra_block_size=64, extra_kv_format="model1")

    for fn, allocations, requested in ((lambda: flash_mla(out=out), 1, lse_bytes),
                                       (flash_mla, 2, lse_bytes + out_bytes),
                                       (decode_in_place, 0, 0)):
        fn()  # warm-up: first-call work (the op registry, the device's attributes) is not a call's
        torch.cuda.synchronize()
        count_before, bytes_before = allocator_counts()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        count_after, bytes_after = allocator_counts()
        assert count_after - count_before == calls * allocations
        if bytes_before is not None:  # requested_bytes: torch >= 2.1
            assert bytes_after - bytes_before == calls * requested
