"""The DLPack path (numpy on CPU) and the torch integration that needs no GPU: the seed drop-in
against the seed's own fallback, the custom ops under opcheck and torch.compile(fullgraph=True)."""

import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import swa_decode
from conftest import (as_numpy, assert_bf16_rounding_of, assert_lse_equal, load_bench_module,
                      make_batch, op_calls_in, reference)

np = pytest.importorskip("numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")


def test_numpy_arrays_match_reference():
    b = make_batch(T=4, H=4, D=64, W=16, sink=0.5)
    a = as_numpy(b)
    out, lse = swa_decode.decode(a["q"], a["kv_cache"], a["inv_scale"], a["indices"], a["lens"],
                                 block_size=b.block_size, attn_sink=b.attn_sink.numpy(),
                                 return_lse=True)
    assert isinstance(out, np.ndarray) and out.dtype == ml_dtypes.bfloat16
    assert out.shape == (4, 4, 64) and lse.dtype == np.float32
    ref_out, ref_lse = reference(b)
    assert_bf16_rounding_of(torch.from_numpy(out.astype(np.float64)), ref_out)
    assert_lse_equal(torch.from_numpy(lse), ref_lse)


def test_numpy_float8_cache_fp32_scale_and_out_buffer():
    b = make_batch(T=3, H=2, D=64, W=16, scale_dtype=torch.float32, scale_2d=False)
    a = as_numpy(b)
    out = np.zeros((3, 2, 64), dtype=ml_dtypes.bfloat16)
    ret = swa_decode.decode(a["q"], a["kv_cache"].view(ml_dtypes.float8_e4m3fn),
                            b.inv_scale.numpy(), a["indices"].astype(np.int32),
                            a["lens"].astype(np.int32), block_size=b.block_size, out=out)
    assert ret is out
    assert_bf16_rounding_of(torch.from_numpy(out.astype(np.float64)), reference(b)[0])


def test_numpy_errors_name_argument():
    b = make_batch(T=3, H=2, D=64, W=16)
    a = as_numpy(b)
    with pytest.raises(TypeError, match="q must have dtype bfloat16, got float32"):
        swa_decode.decode(a["q"].astype(np.float32), a["kv_cache"], a["inv_scale"], a["indices"],
                          a["lens"], block_size=16)
    with pytest.raises(TypeError, match="lens must be a torch.Tensor or an array with __dlpack__"):
        swa_decode.decode(a["q"], a["kv_cache"], a["inv_scale"], a["indices"], [1, 2, 3],
                          block_size=16)
    # A uint16 array is not taken for bfloat16 unless the package made the view itself.
    with pytest.raises(TypeError, match="out must have dtype bfloat16, got uint16"):
        swa_decode.decode(a["q"], a["kv_cache"], a["inv_scale"], a["indices"], a["lens"],
                          block_size=16, out=np.zeros((3, 2, 64), dtype=np.uint16))


def test_drop_in_matches_seed_fallback():
    """native_swa_decode_attention and the seed's fallback on the seed's own input conventions:
    uint8 cache, (slots, 1) bf16 scale, 3-D int64 indices and lens with more rows than T."""
    bench = load_bench_module()
    b = make_batch(T=5, H=4, D=128, W=16, lens=[16, 7, 1, 16, 15], poison=False)
    indices = torch.cat([b.indices, b.indices[:2]]).unsqueeze(0)  # (1, T + 2, W)
    lens = torch.cat([b.lens, torch.tensor([3, 3])])
    args = (b.q, b.kv_cache, b.inv_scale, indices, lens, b.block_size, 0.1, 16)
    ours = swa_decode.native_swa_decode_attention(*args)
    seed = bench.seed_fallback_batched_sdp(*args)
    assert ours.shape == seed.shape and ours.dtype == seed.dtype
    ref = reference(b, scale=0.1)[0]
    # The seed works in bf16 (its own rounding of k and p); ours is the float64 result rounded.
    seed_err = (seed.double() - ref).abs().max().item()
    ours_err = (ours.double() - ref).abs().max().item()
    assert ours_err <= seed_err
    assert_bf16_rounding_of(ours, ref)


def test_opcheck_custom_ops():
    b = make_batch(T=3, H=2, D=64, W=16, sink=0.0)
    args = (b.q, b.kv_cache, b.inv_scale, b.indices, b.lens, b.attn_sink, b.block_size, 0.125, 16)
    torch.library.opcheck(torch.ops.swa_decode.decode.default, args + (True,))
    torch.library.opcheck(torch.ops.swa_decode.decode.default, args + (False,))
    out, lse = torch.empty_like(b.q), torch.empty(3, 2)
    torch.library.opcheck(torch.ops.swa_decode.decode_out.default,
                          args[:6] + (out, lse) + args[6:])


def test_torch_compile_fullgraph_cpu():
    b = make_batch(T=4, H=2, D=64, W=16)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(q, kv, scale, idx, lens):
        out, lse = swa_decode.decode(q, kv.view(torch.float8_e4m3fn), scale, idx.unsqueeze(0),
                                     lens, block_size=16, return_lse=True)
        return out.float() * 2, lse

    out2, lse = step(b.q, b.kv_cache, b.inv_scale, b.indices, b.lens)
    ref_out, ref_lse = reference(b)
    assert_bf16_rounding_of(out2 / 2, ref_out)
    assert_lse_equal(lse, ref_lse)


# ---- the extra source through the DLPack path and the custom ops (needs the C++ side of issue
# 11: the library's validation and float64 reference over DecodeArgs::extra) --------------------

def extra_batch(**kw):
    return make_batch(T=5, H=4, D=64, W=16, sink=0.5, seed=31,
                      extra=dict(num_blocks=3, block_size=32, W=40, **kw))


def test_numpy_arrays_with_an_extra_source_match_reference():
    """ml_dtypes bfloat16 extra scales and a float8_e4m3fn extra cache, as for the window."""
    b = extra_batch(index_dtype=torch.int32)
    a = as_numpy(b)
    a["extra_kv_cache"] = a["extra_kv_cache"].view(ml_dtypes.float8_e4m3fn)
    out, lse = swa_decode.decode(**a, block_size=b.block_size, attn_sink=b.attn_sink.numpy(),
                                 return_lse=True)
    ref_out, ref_lse = reference(b)
    assert_bf16_rounding_of(torch.from_numpy(out.astype(np.float64)), ref_out)
    assert_lse_equal(torch.from_numpy(lse), ref_lse)


def test_numpy_extra_source_with_fp32_scales():
    b = extra_batch(scale_dtype=torch.float32, scale_2d=False)
    a = as_numpy(b)
    a["extra_inv_scale"] = b.extra.inv_scale.numpy()
    out = swa_decode.decode(**a, block_size=b.block_size, attn_sink=b.attn_sink.numpy())
    assert_bf16_rounding_of(torch.from_numpy(out.astype(np.float64)), reference(b)[0])


def test_opcheck_custom_ops_with_an_extra_source():
    """The extended schemas, their fake implementations and the real ones agree (runs without the
    C++ side too: opcheck compares the op with itself)."""
    b = extra_batch()
    x = b.extra
    args = (b.q, b.kv_cache, b.inv_scale, b.indices, b.lens, b.attn_sink, b.block_size, 0.125, 16)
    extra = dict(extra_kv_cache=x.kv_cache, extra_inv_scale=x.inv_scale, extra_indices=x.indices,
                 extra_lens=x.lens, extra_block_size=x.block_size, extra_window=x.window)
    for return_lse in (True, False):
        torch.library.opcheck(torch.ops.swa_decode.decode.default, args + (return_lse,), extra)
    out, lse = torch.empty_like(b.q), torch.empty(5, 4)
    torch.library.opcheck(torch.ops.swa_decode.decode_out.default,
                          args[:6] + (out, lse) + args[6:], extra)


def test_torch_compile_fullgraph_cpu_with_an_extra_source():
    b = extra_batch()

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(q, kv, scale, idx, lens, sink, x_kv, x_scale, x_idx, x_lens):
        out, lse = swa_decode.decode(q, kv, scale, idx, lens, block_size=16, attn_sink=sink,
                                     return_lse=True, extra_kv_cache=x_kv.view(torch.float8_e4m3fn),
                                     extra_inv_scale=x_scale, extra_indices=x_idx,
                                     extra_lens=x_lens, extra_block_size=32)
        return out.float() * 2, lse

    x = b.extra
    out2, lse = step(b.q, b.kv_cache, b.inv_scale, b.indices, b.lens, b.attn_sink, x.kv_cache,
                     x.inv_scale, x.indices, x.lens)
    ref_out, ref_lse = reference(b)
    assert_bf16_rounding_of(out2 / 2, ref_out)
    assert_lse_equal(lse, ref_lse)


# ---- empty_token_lse through the custom ops: decode()'s float becomes their empty_lse_positive --

def empty_token_batch():
    """Tokens 1 and 3 without entries (lens 0 and -1)."""
    return make_batch(T=4, H=2, D=64, W=16, lens=[16, 0, 5, -1], sink=0.5, seed=17)


def test_custom_ops_take_empty_lse_positive():
    """The ops' trailing flag: False (the default, as every existing caller gets) writes -inf for
    an empty token, True +inf; nothing else changes."""
    b = empty_token_batch()
    args = (b.q, b.kv_cache, b.inv_scale, b.indices, b.lens, b.attn_sink, b.block_size, 0.125, 16)
    results = {}
    for flag in (None, False, True):
        kwargs = {} if flag is None else dict(empty_lse_positive=flag)
        out, lse = torch.ops.swa_decode.decode(*args, True, **kwargs)
        out_given, lse_given = torch.empty_like(b.q), torch.empty(4, 2)
        torch.ops.swa_decode.decode_out(*args[:6], out_given, lse_given, *args[6:], **kwargs)
        assert torch.equal(out, out_given) and torch.equal(lse, lse_given)
        results[flag] = out, lse
    ref_out, ref_lse = reference(b, scale=0.125)
    for flag, (out, lse) in results.items():
        assert_bf16_rounding_of(out, ref_out)
        assert (lse[[1, 3]] == (math.inf if flag else -math.inf)).all()
        assert_lse_equal(lse[[0, 2]], ref_lse[[0, 2]])
    assert torch.equal(results[None][1], results[False][1])


def test_opcheck_custom_ops_with_empty_lse_positive():
    b = empty_token_batch()
    args = (b.q, b.kv_cache, b.inv_scale, b.indices, b.lens, b.attn_sink, b.block_size, 0.125, 16)
    flag = dict(empty_lse_positive=True)
    for return_lse in (True, False):
        torch.library.opcheck(torch.ops.swa_decode.decode.default, args + (return_lse,), flag)
    out, lse = torch.empty_like(b.q), torch.empty(4, 2)
    torch.library.opcheck(torch.ops.swa_decode.decode_out.default,
                          args[:6] + (out, lse) + args[6:], flag)


@pytest.mark.parametrize("out_given", [False, True])
def test_traces_record_empty_token_lse_as_the_ops_flag(out_given):
    """make_fx records decode(empty_token_lse=inf) as the op with empty_lse_positive=True, and
    the traced graph writes +inf for the empty tokens."""
    b = empty_token_batch()

    def step(q, kv, scale, idx, lens, sink):
        out = torch.empty_like(q) if out_given else None
        return swa_decode.decode(q, kv, scale, idx, lens, block_size=16, attn_sink=sink,
                                 out=out, return_lse=True, empty_token_lse=math.inf)

    args = (b.q, b.kv_cache, b.inv_scale, b.indices, b.lens, b.attn_sink)
    graph = make_fx(step)(*args)
    op = torch.ops.swa_decode.decode_out if out_given else torch.ops.swa_decode.decode
    calls = op_calls_in(graph, op.default)
    assert [call["empty_lse_positive"] for call in calls] == [True], graph.code
    out, lse = graph(*args)
    assert (lse[[1, 3]] == math.inf).all()
    ref_out, ref_lse = reference(b)
    assert_bf16_rounding_of(out, ref_out)
    assert_lse_equal(lse[[0, 2]], ref_lse[[0, 2]])


@pytest.mark.parametrize("empty_token_lse", [-math.inf, math.inf])
def test_torch_compile_fullgraph_cpu_with_empty_token_lse(empty_token_lse):
    b = empty_token_batch()

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(q, kv, scale, idx, lens, sink):
        out, lse = swa_decode.decode(q, kv, scale, idx, lens, block_size=16, attn_sink=sink,
                                     return_lse=True, empty_token_lse=empty_token_lse)
        return out.float() * 2, lse

    out2, lse = step(b.q, b.kv_cache, b.inv_scale, b.indices, b.lens, b.attn_sink)
    ref_out, ref_lse = reference(b)
    assert_bf16_rounding_of(out2 / 2, ref_out)
    assert (lse[[1, 3]] == empty_token_lse).all()
    assert_lse_equal(lse[[0, 2]], ref_lse[[0, 2]])
