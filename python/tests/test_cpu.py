"""The CPU backend through the torch path, against the float64 semantics in conftest.py. The CPU
backend computes in float64 and rounds once, so results must be the bf16 rounding of the reference.
"""

import math

import pytest
import torch

import swa_decode
from conftest import (assert_bf16_rounding_of, assert_lse_equal, make_batch, reference)
from swa_decode.limits import MAX_GPU_HEADS


def run(b, **kw):
    return swa_decode.decode(b.q, b.kv_cache, b.inv_scale, b.indices, b.lens,
                             block_size=b.block_size, window_size=b.window_size,
                             attn_sink=b.attn_sink, **kw)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("lens_dtype", [torch.int32, torch.int64])
def test_random_batch_matches_reference(index_dtype, lens_dtype):
    b = make_batch(T=5, H=8, index_dtype=index_dtype, lens_dtype=lens_dtype)
    out, lse = run(b, return_lse=True)
    ref_out, ref_lse = reference(b)
    assert out.shape == b.q.shape and out.dtype == torch.bfloat16
    assert lse.shape == (5, 8) and lse.dtype == torch.float32
    assert_bf16_rounding_of(out, ref_out)
    assert_lse_equal(lse, ref_lse)


@pytest.mark.parametrize("scale_dtype,scale_2d", [(torch.float32, False), (torch.bfloat16, False),
                                                  (torch.float32, True)])
def test_scale_layouts(scale_dtype, scale_2d):
    b = make_batch(T=3, H=2, D=64, scale_dtype=scale_dtype, scale_2d=scale_2d)
    assert_bf16_rounding_of(run(b), reference(b)[0])


def test_float8_cache_dtype_and_explicit_scale():
    b = make_batch(T=3, H=4, D=128)
    fp8 = b.kv_cache.view(torch.float8_e4m3fn)
    out = swa_decode.decode(b.q, fp8, b.inv_scale, b.indices, b.lens, block_size=b.block_size,
                            scale=0.3)
    assert_bf16_rounding_of(out, reference(b, scale=0.3)[0])


@pytest.mark.parametrize("lens", [[0, -1, 1, 31, 32, 33], [-5, 0, 0, 0, 0, 0]])
def test_lengths(lens):
    """lens 0 and negative (graph padding) give out = 0 and lse = -inf; lens > W read W columns."""
    b = make_batch(T=6, H=4, D=64, W=32, lens=lens)
    out, lse = run(b, return_lse=True)
    ref_out, ref_lse = reference(b)
    assert_bf16_rounding_of(out, ref_out)
    assert_lse_equal(lse, ref_lse)
    for t, n in enumerate(lens):
        if n <= 0:
            assert (out[t] == 0).all() and (lse[t] == -math.inf).all()


def test_holes_duplicates_and_out_of_range_ids():
    b = make_batch(T=4, H=4, D=64, W=16, lens=[16, 16, 16, 16], poison=False)
    num_slots = b.kv_cache.shape[0] * b.block_size
    b.indices[0, 3] = -1                      # a hole mid-window
    b.indices[0, 7] = -1
    b.indices[1, 5] = b.indices[1, 2]         # a duplicate counts twice
    b.indices[1, 9] = b.indices[1, 2]
    b.indices[2, 0] = num_slots               # past the pool: no entry, never read
    b.indices[2, 4] = num_slots + 1000
    b.indices[2, 6] = -7                      # other negatives: no entry too
    b.indices[3, :] = -1                      # no valid entry at all
    out, lse = run(b, return_lse=True)
    ref_out, ref_lse = reference(b)
    assert_bf16_rounding_of(out, ref_out)
    assert_lse_equal(lse, ref_lse)
    assert (out[3] == 0).all() and (lse[3] == -math.inf).all()


@pytest.mark.parametrize("sink", [-math.inf, math.inf, 0.0, 3.5])
def test_sinks(sink):
    b = make_batch(T=5, H=4, D=64, W=16, sink=sink)
    out, lse = run(b, return_lse=True)
    ref_out, ref_lse = reference(b)
    assert_bf16_rounding_of(out, ref_out)
    assert_lse_equal(lse, ref_lse)  # the lse never includes the sink
    if sink == math.inf:
        assert (out == 0).all()
    assert not torch.isnan(out).any()


def test_per_head_sinks_and_lse_without_sink_match_no_sink_run():
    b = make_batch(T=4, H=4, D=64, W=16)
    _, lse_plain = run(b, return_lse=True)
    b.attn_sink = torch.tensor([-math.inf, 0.0, 1.0, math.inf])
    out, lse = run(b, return_lse=True)
    assert_bf16_rounding_of(out, reference(b)[0])
    assert torch.equal(lse, lse_plain)


def test_strided_q_padded_cache_rows_wide_indices_and_strided_out():
    b = make_batch(T=4, H=4, D=64, W=16, row_stride=96, extra_index_cols=5)
    wide_q = torch.randn(4, 6, 80).to(torch.bfloat16)
    wide_q[:, 1:5, 8:72] = b.q
    b.q = wide_q[:, 1:5, 8:72]                # strides (480, 80, 1)
    assert b.kv_cache.stride(1) == 96         # padded rows: 96 bytes per token
    wide_out = torch.full((4, 4, 128), 7.0, dtype=torch.bfloat16)
    out = wide_out[:, :, 32:96]
    lse_store = torch.full((4, 8), 7.0)
    lse = lse_store[:, :4]
    ret, ret_lse = run(b, out=out, lse=lse, return_lse=True)
    assert ret is out and ret_lse is lse
    ref_out, ref_lse = reference(b)
    assert_bf16_rounding_of(out, ref_out)
    assert_lse_equal(lse, ref_lse)
    assert (wide_out[:, :, :32] == 7).all() and (wide_out[:, :, 96:] == 7).all()
    assert (lse_store[:, 4:] == 7).all()


def test_out_with_return_lse_allocates_lse():
    b = make_batch(T=3, H=2, D=64)
    out = torch.empty_like(b.q)
    ret, lse = run(b, out=out, return_lse=True)
    assert ret is out and lse.shape == (3, 2)
    assert_lse_equal(lse, reference(b)[1])


def test_defaults_scale_and_window():
    """scale defaults to D**-0.5 and window_size to indices.shape[-1]."""
    b = make_batch(T=3, H=2, D=64, W=16)
    out = swa_decode.decode(b.q, b.kv_cache, b.inv_scale, b.indices, b.lens,
                            block_size=b.block_size)
    assert_bf16_rounding_of(out, reference(b)[0])


def test_window_smaller_than_index_columns_reads_first_columns():
    b = make_batch(T=3, H=2, D=64, W=16, lens=[16, 16, 16], poison=False)
    b.window_size = 9
    assert_bf16_rounding_of(run(b), reference(b)[0])


def test_three_d_indices():
    b = make_batch(T=3, H=2, D=64)
    out = swa_decode.decode(b.q, b.kv_cache, b.inv_scale, b.indices.unsqueeze(0), b.lens,
                            block_size=b.block_size)
    assert_bf16_rounding_of(out, reference(b)[0])


def test_zero_tokens():
    b = make_batch(T=0, H=2, D=64)
    out, lse = run(b, return_lse=True)
    assert out.shape == (0, 2, 64) and lse.shape == (0, 2)


def test_head_counts():
    for H in (1, 16, MAX_GPU_HEADS, MAX_GPU_HEADS + 1):  # the CPU backend has no head limit
        b = make_batch(T=2, H=H, D=64, W=8, lens=[8, 5])
        assert_bf16_rounding_of(run(b), reference(b)[0])


def test_version():
    assert swa_decode.__version__ == "0.1.0"
