"""The GPU kernel through the package: against the float64 semantics on poisoned batches, the seed's
fallback, CUDA-graph capture and replay on new inputs, torch.compile, and DLPack CUDA arrays.
Skipped without a CUDA device.

Tolerance: the kernel works in bf16/fp32 like any fast kernel, so it is held to twice the error a
plain bf16 pipeline (k and p rounded to bf16, fp32 sums: conftest.bf16_baseline) makes on the same
input, plus one bf16 ulp of the output's magnitude.
"""

import math

import pytest
import torch

import swa_decode
from conftest import assert_lse_equal, bf16_baseline, load_bench_module, make_batch, reference
from swa_decode.limits import GPU_HEAD_DIM, MAX_GPU_HEADS, MAX_WINDOW

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def run(b, **kw):
    return swa_decode.decode(b.q, b.kv_cache, b.inv_scale, b.indices, b.lens,
                             block_size=b.block_size, window_size=b.window_size,
                             attn_sink=b.attn_sink, **kw)


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


def test_strided_inputs_and_outputs():
    b = make_batch(T=4, H=16, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=64, row_stride=584,
                   extra_index_cols=7).to("cuda")
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


def test_cuda_graph_capture_then_replay_on_new_inputs():
    shape = dict(T=8, H=64, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128)
    b0 = make_batch(**shape, seed=1).to("cuda")
    b1 = make_batch(**shape, seed=2, lens=[5, 128, 0, 77, -1, 128, 1, 64]).to("cuda")
    static = make_batch(**shape, seed=1).to("cuda")
    static.indices = static.indices.to(torch.int32)
    static.lens = static.lens.to(torch.int32)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(static, return_lse=True)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = run(static, return_lse=True)

    for b in (b0, b1):
        for name in ("q", "kv_cache", "inv_scale", "indices", "lens"):
            getattr(static, name).copy_(getattr(b, name))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = reference(b)
        assert_close_to_reference(out.clone(), b, ref_out)
        assert_lse_close(lse.clone(), ref_lse)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_torch_compile_fullgraph(mode):
    b = make_batch(T=4, H=16, D=GPU_HEAD_DIM, num_blocks=4, block_size=64, W=128).to("cuda")

    @torch.compile(fullgraph=True, mode=mode)
    def step(q, kv, scale, idx, lens):
        out = swa_decode.decode(q * 1, kv, scale, idx, lens, block_size=64)
        return out.float().sum(dim=-1), out

    for _ in range(3):  # reduce-overhead records a graph on a later call
        summed, out = step(b.q, b.kv_cache, b.inv_scale, b.indices, b.lens)
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
