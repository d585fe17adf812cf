"""The GPU kernel through the package: against the float64 semantics on poisoned batches (the
window alone and with the extra source of compressed entries), the seed's fallback, CUDA-graph
capture and replay on new inputs, torch.compile, and DLPack CUDA arrays. Skipped without a CUDA
device.

Tolerance: the kernel works in bf16/fp32 like any fast kernel, so it is held to twice the error a
plain bf16 pipeline (k and p rounded to bf16, fp32 sums: conftest.bf16_baseline) makes on the same
input, plus one bf16 ulp of the output's magnitude.
"""

import math
from dataclasses import replace

import pytest
import torch

import swa_decode
from conftest import (assert_lse_equal, bf16_baseline, load_bench_module, make_batch, reference,
                      run)
from swa_decode import _torch_ops
from swa_decode.limits import GPU_HEAD_DIM, MAX_EXTRA_ENTRIES, MAX_GPU_HEADS, MAX_WINDOW

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def assert_close_to_reference(out, b, ref_out=None):
    ref_out = reference(b)[0] if ref_out is None else ref_out
    out = out.cpu().double()
    assert torch.isfinite(out).all(), "kernel output has NaN/inf (a poisoned slot was read?)"
    baseline_err = (bf16_baseline(b) - ref_out).abs().max().item()
    tol = 2 * baseline_err + ref_out.abs().max().item() * 2.0 ** -8
    err = (out - ref_out).abs().max().item()
    assert err <= tol, f"max error {err:.3g} > tolerance {tol:.3g} (bf16 baseline {baseline_err:.3g})"
    empty = ref_out.abs().amax(dim=(1, 2)) == 0
    assert (out[empty] == 0).all(), "tokens without entries must give exactly 0"


def assert_lse_close(lse, ref_lse):
    # fp32 accumulation: relative 1e-4 in the log domain is ~1e-4 relative in the sum.
    assert_lse_equal(lse, ref_lse, rtol=1e-4)


def check_gpu(b, **kw):
    """out and lse of the kernel against the float64 reference, within the tolerances above."""
    out, lse = run(b, return_lse=True, **kw)
    ref_out, ref_lse = reference(b)
    assert_close_to_reference(out, b, ref_out)
    assert_lse_close(lse, ref_lse)
    return out, lse


def c4a_batch(T=6, H=64, X=512, *, seed=0, lens=None, extra_lens=None, **extra):
    """A DeepSeek-V4 layer's two sources: the window, 128 ids over 4 blocks of 64, and X extra ids
    over their own pool of 64-slot blocks (X + 128 slots, so some unused ones are poisoned too).
    C4A picks X = 512 (V4-Flash) or 1024 (V4-Pro) entries; C128A attends to context / 128, 512 at
    64k and 8192 at 1M."""
    spec = dict(num_blocks=(X + 128 + 63) // 64, block_size=64, W=X, lens=extra_lens)
    spec.update(extra)
    return make_batch(T=T, H=H, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128, seed=seed,
                      lens=lens, extra=spec).to("cuda")


@pytest.mark.parametrize("H", [1, 8, 16, 32, 64, MAX_GPU_HEADS])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_matches_reference(H, index_dtype):
    b = make_batch(T=6, H=H, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128, seed=H,
                   index_dtype=index_dtype, lens=[128, 0, -1, 1, 127, 129]).to("cuda")
    out, lse = run(b, return_lse=True)
    ref_out, ref_lse = reference(b)
    assert_close_to_reference(out, b, ref_out)
    assert_lse_close(lse, ref_lse)


def test_holes_duplicates_out_of_range_and_all_empty():
    b = make_batch(T=4, H=16, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=64, lens=[64] * 4,
                   poison=False)
    num_slots = 256
    b.indices[0, 10:20] = -1
    b.indices[1, 5] = b.indices[1, 2]
    b.indices[2, 0] = num_slots
    b.indices[2, 9] = 10 ** 9
    b.indices[3, :] = -1
    b = b.to("cuda")
    out, lse = run(b, return_lse=True)
    ref_out, ref_lse = reference(b)
    assert_close_to_reference(out, b, ref_out)
    assert_lse_close(lse, ref_lse)


@pytest.mark.parametrize("sink", [-math.inf, math.inf, 0.0, 4.0])
def test_sinks(sink):
    b = make_batch(T=5, H=32, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128,
                   sink=sink).to("cuda")
    out, lse = run(b, return_lse=True)
    ref_out, ref_lse = reference(b)
    assert_close_to_reference(out, b, ref_out)
    assert_lse_close(lse, ref_lse)


@pytest.mark.parametrize("with_extra", [False, True])
def test_strided_inputs_and_outputs(with_extra):
    """Padded 584-byte cache rows (the engines' format) and spare index columns; with an extra
    source, in its cache and ids too, with int32 ids beside an int64 window and fp32 extra scales
    beside bf16 window scales."""
    if with_extra:
        b = c4a_batch(T=4, H=16, X=512, seed=61, row_stride=584, spare_index_cols=9,
                      index_dtype=torch.int32, lens_dtype=torch.int32, scale_dtype=torch.float32,
                      scale_2d=False)
        assert b.extra.kv_cache.stride(1) == 584 and b.extra.indices.stride(0) == 521
    else:
        b = make_batch(T=4, H=16, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=64,
                       row_stride=584, spare_index_cols=7).to("cuda")
        assert b.kv_cache.stride(1) == 584  # Batch.to keeps the padding
    wide_q = torch.zeros(4, 20, GPU_HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    wide_q[:, 2:18] = b.q
    b.q = wide_q[:, 2:18]
    wide_out = torch.zeros(4, 32, GPU_HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    out = wide_out[:, ::2]
    run(b, out=out)
    assert_close_to_reference(out, b)
    assert (wide_out[:, 1::2] == 0).all()


def test_long_window():
    b = make_batch(T=3, H=16, D=GPU_HEAD_DIM, num_blocks=8, block_size=256, W=MAX_WINDOW,
                   lens=[MAX_WINDOW, MAX_WINDOW - 24, 3]).to("cuda")
    assert_close_to_reference(run(b), b)


def test_drop_in_vs_seed_fallback_on_gpu():
    bench = load_bench_module()
    inputs = bench.make_inputs(T=32, H=MAX_GPU_HEADS)
    ours = swa_decode.native_swa_decode_attention(*inputs).float()
    seed = bench.seed_fallback_batched_sdp(*inputs).float()
    rel_l2 = ((ours - seed).norm() / seed.norm()).item()
    assert rel_l2 < 1e-2, rel_l2  # both bf16 pipelines; the seed alone is ~3e-3 off float64


@pytest.mark.parametrize("with_extra", [False, True])
def test_cuda_graph_capture_then_replay_on_new_inputs(with_extra):
    """Captured once on int32 ids and lengths, replayed on new int64 contents of every buffer (of
    both sources with an extra source)."""
    if with_extra:
        def make(seed, **lens):
            return c4a_batch(T=8, H=64, X=1024, seed=seed, **lens)
        new_lens = dict(lens=[5, 128, 0, 77, -1, 128, 1, 0],
                        extra_lens=[1024, 0, 3, 1000, 1024, -1, 1025, 0])
    else:
        def make(seed, **lens):
            return make_batch(T=8, H=64, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128,
                              seed=seed, **lens).to("cuda")
        new_lens = dict(lens=[5, 128, 0, 77, -1, 128, 1, 64])
    b0, b1, static = make(1), make(2, **new_lens), make(1)
    for holder in (static, static.extra):
        if holder is not None:
            holder.indices = holder.indices.to(torch.int32)
            holder.lens = holder.lens.to(torch.int32)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(static, return_lse=True)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = run(static, return_lse=True)

    for b in (b0, b1):
        static.q.copy_(b.q)
        for dst, src in zip(static.sources(), b.sources()):
            for name in ("kv_cache", "inv_scale", "indices", "lens"):
                getattr(dst, name).copy_(getattr(src, name))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = reference(b)
        assert_close_to_reference(out.clone(), b, ref_out)
        assert_lse_close(lse.clone(), ref_lse)


@pytest.mark.skipif(not _torch_ops._CAN_SKIP_DISPATCH, reason="no DLPack C exchange API in torch")
def test_eager_call_skips_the_ops_and_runs_on_the_current_stream(op_calls):
    """The eager path takes torch's current stream from the DLPack exchange API. The side stream
    is held ~0.1 s by a sleep kernel, so right after the call out must still hold its NaN on the
    default stream (it would not, had the kernel run on any other stream than the side one)."""
    b = make_batch(T=8, H=64, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128).to("cuda")
    out = torch.full_like(b.q, float("nan"))
    torch.cuda.synchronize()  # the fill is done before the side stream reads nothing of it
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # cycles: ~0.1 s at the H200's ~2 GHz
        run(b, out=out)
        fresh = run(b)  # the functional form, on the same path
    early = out.clone()  # on the default stream, which does not wait for the side one
    torch.cuda.synchronize()
    assert op_calls == [], "the eager call went through the custom ops"
    assert torch.isnan(early).all(), "the kernel did not wait for the side stream"
    assert_close_to_reference(out, b)
    assert_close_to_reference(fresh, b)


@pytest.mark.skipif(not _torch_ops._CAN_SKIP_DISPATCH, reason="no DLPack C exchange API in torch")
def test_record_stream_holds_an_eager_output_for_its_stream(op_calls):
    """An output the eager call allocates is the caching allocator's own block: record_stream on
    a busy side stream keeps it from being handed out again when the tensor dies. (A tensor over
    one from torch's DLPack exchange allocator is not held: on the H200, torch 2.11, its block came
    back at once; docs/perf-notes.md, "Eager Python call".)"""
    b = make_batch(T=1, H=64, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128).to("cuda")
    out = swa_decode.native_swa_decode_attention(b.q, b.kv_cache, b.inv_scale, b.indices, b.lens,
                                                 b.block_size, None, b.window_size)
    assert op_calls == []
    size = out.numel()
    probe = torch.empty(size, dtype=out.dtype, device="cuda")
    freed = probe.data_ptr()
    del probe
    if torch.empty(size, dtype=out.dtype, device="cuda").data_ptr() != freed:
        pytest.skip("this allocator does not hand a freed block straight back: the check below "
                    "could not see a lost record_stream")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # cycles: ~0.1 s at the H200's ~2 GHz
    out.record_stream(side)
    block = out.data_ptr()
    del out
    assert torch.empty(size, dtype=torch.bfloat16, device="cuda").data_ptr() != block
    torch.cuda.synchronize()


@pytest.mark.skipif(not _torch_ops._CAN_SKIP_DISPATCH, reason="no DLPack C exchange API in torch")
def test_eager_call_with_out_captured_in_a_cuda_graph(op_calls):
    """out= and lse= given: the eager call allocates nothing, so it captures as is."""
    b = make_batch(T=8, H=64, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128, seed=4).to("cuda")
    out = torch.empty_like(b.q)
    lse = torch.empty(8, 64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(b, out=out, lse=lse, return_lse=True)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(b, out=out, lse=lse, return_lse=True)
    assert op_calls == []
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = reference(b)
    assert_close_to_reference(out, b, ref_out)
    assert_lse_close(lse, ref_lse)


@pytest.mark.parametrize("with_extra", [False, True])
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_torch_compile_fullgraph(mode, with_extra):
    if with_extra:
        b = c4a_batch(T=4, H=16, X=512)
    else:
        b = make_batch(T=4, H=16, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128).to("cuda")
    # extra_window left out: its default is taken under compile too
    extra = {k: v for k, v in b.extra_kwargs().items() if k != "extra_window"}

    @torch.compile(fullgraph=True, mode=mode)
    def step(q, kv, scale, idx, lens, extra):
        out = swa_decode.decode(q * 1, kv, scale, idx, lens, block_size=64, **extra)
        return out.float().sum(dim=-1), out

    for _ in range(3):  # reduce-overhead records a graph on a later call
        summed, out = step(b.q, b.kv_cache, b.inv_scale, b.indices, b.lens, extra)
    assert_close_to_reference(out, b)


class ForeignArray:
    """A CUDA array of an unknown framework: only the DLPack protocol, nothing torch-specific."""

    def __init__(self, t):
        self.t = t
        self.shape = tuple(t.shape)
        self.ndim = t.ndim
        self.calls = []

    def __getitem__(self, key):
        return ForeignArray(self.t[key])

    def __dlpack__(self, stream=None):
        self.calls.append(stream)
        return self.t.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def test_generic_dlpack_cuda_arrays_with_explicit_stream():
    b = make_batch(T=4, H=16, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128).to("cuda")
    out = torch.empty_like(b.q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    q = ForeignArray(b.q)
    args = [q] + [ForeignArray(t) for t in (b.kv_cache, b.inv_scale, b.indices, b.lens)]
    with pytest.raises(ValueError, match="stream= is required"):
        swa_decode.decode(*args, block_size=64, out=ForeignArray(out))
    with pytest.raises(TypeError, match="out= is required"):
        swa_decode.decode(*args, block_size=64, stream=stream)
    swa_decode.decode(*args, block_size=64, out=ForeignArray(out), stream=stream)
    assert q.calls == [stream.cuda_stream]
    stream.synchronize()
    assert_close_to_reference(out, b)


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    b = make_batch(T=4, H=16, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128).to("cuda")
    try:
        q = cupy.from_dlpack(b.q)
    except Exception as e:  # CuPy builds without bfloat16 cannot hold q
        pytest.skip(f"this CuPy cannot import a bfloat16 tensor: {e}")
    kv, scale, idx, lens = (cupy.from_dlpack(t) for t in (b.kv_cache, b.inv_scale, b.indices,
                                                          b.lens))
    stream = cupy.cuda.Stream(non_blocking=True)
    torch.cuda.synchronize()
    out, lse = swa_decode.decode(q, kv, scale, idx, lens, block_size=64, return_lse=True,
                                 stream=stream)
    stream.synchronize()
    assert isinstance(out, cupy.ndarray)
    out_t = torch.from_dlpack(out)
    ref_out, ref_lse = reference(b)
    assert_close_to_reference(out_t, b, ref_out)
    assert_lse_close(torch.from_dlpack(lse), ref_lse)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_a_device_that_is_not_current():
    b = make_batch(T=3, H=16, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=64).to("cuda:1")
    with torch.cuda.device(0):
        out = run(b)
    torch.cuda.synchronize(1)
    assert out.device == torch.device("cuda:1")
    assert_close_to_reference(out, b)


def test_device_mismatch_names_argument():
    b = make_batch(T=3, H=16, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=64).to("cuda")
    with pytest.raises(ValueError, match=r"lens must be on q's device cuda:0, got cpu"):
        swa_decode.decode(b.q, b.kv_cache, b.inv_scale, b.indices, b.lens.cpu(), block_size=64)


def test_limits_are_the_ones_the_gpu_checks():
    """One head more than MAX_GPU_HEADS, and a head dim other than GPU_HEAD_DIM, are refused on
    CUDA with the limit in the message (swa_decode.limits and the C++ checks read one header)."""
    b = make_batch(T=2, H=MAX_GPU_HEADS + 1, D=GPU_HEAD_DIM, num_blocks=2, block_size=64,
                   W=64).to("cuda")
    with pytest.raises(ValueError, match=rf"num_heads must be in \[1, {MAX_GPU_HEADS}\], "
                                         rf"got {MAX_GPU_HEADS + 1}"):
        run(b)
    b = make_batch(T=2, H=16, D=GPU_HEAD_DIM // 2, num_blocks=2, block_size=64, W=64).to("cuda")
    with pytest.raises(ValueError) as info:
        run(b)
    message = str(info.value)
    assert "head_dim" in message and str(GPU_HEAD_DIM) in message, message
    assert message.endswith(f"got {GPU_HEAD_DIM // 2}"), message


def test_view_with_fewer_rows_than_block_size_is_refused():
    """The issue's case on the GPU, where trusting block_size read outside the view: a
    (4, 64, D) view of a (4, 128, D) cache with block_size = 128."""
    b = make_batch(T=2, H=16, D=GPU_HEAD_DIM, num_blocks=4, block_size=128, W=64).to("cuda")
    view = b.kv_cache[:, :64]
    with pytest.raises(ValueError, match=r"kv_cache\.shape\[1\] must equal block_size = 128, "):
        swa_decode.decode(b.q, view, b.inv_scale, b.indices, b.lens, block_size=128)


# ---- the extra source: DeepSeek-V4's compressed entries in the same softmax as the window ------

@pytest.mark.parametrize("H", [1, 8, 16, 32, 64, MAX_GPU_HEADS])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_extra_source_matches_reference(H, index_dtype):
    b = c4a_batch(T=6, H=H, X=512, seed=H, index_dtype=index_dtype,
                  lens=[128, 0, -1, 1, 127, 129], extra_lens=[0, 512, 300, -1, 511, 513])
    check_gpu(b)


@pytest.mark.parametrize("X", [1, 7, 64, 500, 1024, 2048])
def test_extra_entry_counts(X):
    """Extra sources shorter than, equal to and longer than one tile of any kernel."""
    b = c4a_batch(T=5, H=64, X=X, seed=X, extra_lens=[X, X - 1, 1, 0, X + 1])
    check_gpu(b)


@pytest.mark.parametrize("T", [1, 2, 3, 37, 160])
def test_extra_source_token_counts(T):
    """Few tokens (where kernels split the entries over CTAs and combine) and many."""
    b = c4a_batch(T=T, H=MAX_GPU_HEADS, X=1024, seed=T)
    check_gpu(b)


def test_c128a_at_a_1m_context():
    """8192 extra entries (context / 128 at 1M) beside the window, and the largest extra window."""
    b = c4a_batch(T=3, H=MAX_GPU_HEADS, X=8192, extra_lens=[8192, 8191, 4096])
    check_gpu(b)
    b = make_batch(T=2, H=16, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128, lens=[0, 128],
                   extra=dict(num_blocks=MAX_EXTRA_ENTRIES // 256, block_size=256,
                              W=MAX_EXTRA_ENTRIES,
                              lens=[MAX_EXTRA_ENTRIES, MAX_EXTRA_ENTRIES - 5])).to("cuda")
    check_gpu(b)


@pytest.mark.parametrize("window_lens,extra_lens", [
    ([0, -1, 128, 129, 0, 5], [512, 513, 0, -1, -7, 0]),   # one source empty, the other not
    ([0, -1, 0, 0, -3, 0], [0, 0, -1, -2, 0, 0])])         # nothing at all: 0 and -inf
def test_extra_lengths_in_either_source(window_lens, extra_lens):
    b = c4a_batch(T=6, H=32, X=512, lens=window_lens, extra_lens=extra_lens, seed=41)
    out, lse = check_gpu(b)
    for t, (n, x) in enumerate(zip(window_lens, extra_lens)):
        empty = n <= 0 and x <= 0
        assert bool((out[t] == 0).all()) == empty and bool((lse[t] == -math.inf).all()) == empty


def test_extra_ids_past_its_slot_range_and_holes():
    """The extra pool has 256 slots, the window's 256 too but other ones: ids in [256, 10**9)
    and negatives are no entry; a row of them leaves the window alone."""
    b = make_batch(T=4, H=16, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128,
                   lens=[128, 128, 0, 128], seed=43,
                   extra=dict(num_blocks=4, block_size=64, W=200, lens=[200] * 4))
    b.extra.indices[0, 10:20] = -1
    b.extra.indices[0, 30] = 256
    b.extra.indices[1, 5] = 10 ** 9
    b.extra.indices[1, 6] = -3
    b.extra.indices[2, :] = -1
    b.extra.indices[3, :] = 300
    b = b.to("cuda")
    out, lse = check_gpu(b)
    assert (out[2] == 0).all() and (lse[2] == -math.inf).all()


def test_both_sources_share_one_cache_with_duplicates():
    b = make_batch(T=4, H=64, D=GPU_HEAD_DIM, num_blocks=8, block_size=64, W=128, seed=47,
                   lens=[128, 60, 0, 128],
                   extra=dict(W=256, lens=[256, 256, 256, 10], share_cache=True))
    b.extra.indices[0, :64] = b.indices[0, :64]          # the same slots again, across sources
    b.extra.indices[1, 1:40] = b.extra.indices[1, 0]     # one slot 40 times within the extra
    b = b.to("cuda")
    assert b.extra.kv_cache.data_ptr() == b.kv_cache.data_ptr()
    check_gpu(b)


@pytest.mark.parametrize("sink", [-math.inf, math.inf, 0.0, 4.0])
def test_extra_source_with_sinks(sink):
    b = c4a_batch(T=5, H=32, X=1024, seed=53)
    b.attn_sink = torch.full((32,), sink, device="cuda")
    check_gpu(b)


@pytest.mark.parametrize("with_extra", [False, True])
def test_nan_in_padding_heads_of_q_stays_in_those_heads(with_extra):
    """Engines pass uninitialized padding heads: NaN in q's heads 3 and 100..127 must not reach
    any other head's output or lse, whichever CTA or head group holds them."""
    H = MAX_GPU_HEADS
    if with_extra:
        b = c4a_batch(T=5, H=H, X=512, seed=59)
    else:
        b = make_batch(T=5, H=H, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128,
                       seed=59).to("cuda")
    b.attn_sink = torch.linspace(-2, 2, H, device="cuda")
    heads = torch.tensor([h for h in range(H) if h != 3 and h < 100])
    b.q[:, 3] = float("nan")
    b.q[:, 100:] = float("nan")
    out, lse = run(b, return_lse=True)
    clean = replace(b, q=b.q[:, heads.cuda()], attn_sink=b.attn_sink[heads.cuda()])
    ref_out, ref_lse = reference(clean)
    assert_close_to_reference(out[:, heads.cuda()], clean, ref_out)
    assert_lse_close(lse[:, heads.cuda()], ref_lse)


@pytest.mark.parametrize("with_extra", [False, True])
@pytest.mark.parametrize("H", [8, 64, MAX_GPU_HEADS])
def test_empty_token_lse_plus_inf(with_extra, H):
    """decode(empty_token_lse=inf), at head counts that decode() may run on different kernels:
    the tokens without entries get out = 0 and lse = +inf, the others what the default call's
    checks hold them to."""
    if with_extra:
        b = c4a_batch(T=6, H=H, X=512, seed=67, lens=[128, 0, 5, 0, 1, -1],
                      extra_lens=[0, -1, 3, 512, 0, 0])
        empty = [1, 5]
    else:
        b = make_batch(T=6, H=H, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128, seed=67,
                       lens=[128, 0, -1, 1, 127, 129]).to("cuda")
        empty = [1, 2]
    b.attn_sink = torch.linspace(-2, 2, H, device="cuda")
    out, lse = run(b, return_lse=True, empty_token_lse=math.inf)
    ref_out, ref_lse = reference(b)
    assert (ref_lse[empty] == -math.inf).all()
    assert_close_to_reference(out, b, ref_out)
    assert (lse[empty] == math.inf).all()
    assert_lse_close(lse, ref_lse.where(ref_lse != -math.inf, math.inf))


def test_extra_source_generic_dlpack_cuda_arrays_with_explicit_stream():
    b = c4a_batch(T=4, H=16, X=512)
    out = torch.empty_like(b.q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    x = b.extra
    tensors = [b.q, b.kv_cache, b.inv_scale, b.indices, b.lens]
    extra = [x.kv_cache, x.inv_scale, x.indices, x.lens]
    foreign = [ForeignArray(t) for t in tensors + extra]
    swa_decode.decode(*foreign[:5], block_size=64, out=ForeignArray(out), stream=stream,
                      extra_kv_cache=foreign[5], extra_inv_scale=foreign[6],
                      extra_indices=foreign[7], extra_lens=foreign[8], extra_block_size=64)
    assert all(a.calls == [stream.cuda_stream] for a in foreign)
    stream.synchronize()
    assert_close_to_reference(out, b)


def test_extra_source_on_another_device_is_refused():
    b = c4a_batch(T=3, H=16, X=64)
    with pytest.raises(ValueError, match=r"^extra_lens must be on q's device cuda:0, got cpu$"):
        run(b, extra_lens=b.extra.lens.cpu())
