"""The CPU backend through the torch path, against the float64 semantics in conftest.py. The CPU
backend computes in float64 and rounds once, so results must be the bf16 rounding of the reference.
"""

import math
from dataclasses import replace

import pytest
import torch

import swa_decode
from conftest import (as_numpy, assert_bf16_rounding_of, assert_lse_equal, make_batch, reference,
                      run)
from swa_decode.limits import MAX_EXTRA_ENTRIES, MAX_GPU_HEADS


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
    b = make_batch(T=4, H=4, D=64, W=16, row_stride=96, spare_index_cols=5)
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


# ---- the extra source: the compressed entries in the same softmax -----------------------------
# Every test below needs the C++ side of issue 11 (validation and the float64 reference over
# DecodeArgs::extra): without it the library ignores the extra source.

def check_against_reference(b, **kw):
    out, lse = run(b, return_lse=True, **kw)
    ref_out, ref_lse = reference(b, scale=kw.get("scale"))
    assert_bf16_rounding_of(out, ref_out)
    assert_lse_equal(lse, ref_lse)
    return out, lse


@pytest.mark.parametrize("index_dtype,lens_dtype,scale_dtype,scale_2d", [
    (torch.int32, torch.int64, torch.float32, False),
    (torch.int64, torch.int32, torch.bfloat16, True),
    (torch.int32, torch.int32, torch.bfloat16, False)])
def test_extra_source_with_its_own_geometry_and_dtypes(index_dtype, lens_dtype, scale_dtype,
                                                      scale_2d):
    """The extra cache has its own num_blocks, block_size, padded row stride, index columns past
    its window and dtypes, none of them the window's (int64 ids, bf16 (S, 1) scales, 16 x 16)."""
    b = make_batch(T=7, H=8, D=64, num_blocks=6, block_size=16, W=32, seed=3,
                   extra=dict(num_blocks=5, block_size=32, W=48, row_stride=80, spare_index_cols=3,
                              index_dtype=index_dtype, lens_dtype=lens_dtype,
                              scale_dtype=scale_dtype, scale_2d=scale_2d))
    assert b.extra.kv_cache.stride(1) == 80 and b.extra.indices.shape[1] == 51
    check_against_reference(b)


@pytest.mark.parametrize("window_lens,extra_lens", [
    ([0, -1, 16, 17, 3, 0, -7], [24, 25, 0, -1, 0, -3, 1]),   # one side empty, the other not
    ([0, -1, 0, -5, 0, 0, 0], [0, 0, -1, -9, 0, 0, 0]),       # nothing anywhere
    ([16, 17, 1, 15, 100, 16, 2], [24, 1000, 1, 23, 25, 24, 2])])  # lens > limit read the limit
def test_extra_lengths_in_either_source(window_lens, extra_lens):
    """A token with no valid entry in either source gets 0 and -inf; an empty window with extra
    entries is a softmax over the extra entries alone, and the reverse."""
    b = make_batch(T=7, H=4, D=64, W=16, lens=window_lens, seed=5,
                   extra=dict(num_blocks=4, block_size=16, W=24, lens=extra_lens))
    out, lse = check_against_reference(b)
    for t, (n, x) in enumerate(zip(window_lens, extra_lens)):
        empty = n <= 0 and x <= 0
        assert (out[t] == 0).all() == empty and (lse[t] == -math.inf).all() == empty


def test_extra_ids_past_its_own_slot_range_and_holes():
    """An extra id that would name a window slot but lies past the extra cache (32 slots here,
    the window's 96) is no entry, like -1 and other negatives, and is never read."""
    b = make_batch(T=4, H=4, D=64, W=16, lens=[16, 16, 0, 16], seed=7,
                   extra=dict(num_blocks=2, block_size=16, W=24, lens=[24, 24, 24, 24]))
    assert b.extra.num_slots == 32 and b.extra.kv_cache.shape[0] * 16 < b.kv_cache.shape[0] * 16
    b.extra.indices[0, 3] = 32                  # the first id past the extra cache
    b.extra.indices[0, 9] = 40                  # a window slot, not an extra one
    b.extra.indices[1, 4] = 10 ** 6
    b.extra.indices[1, 5] = -1                  # holes mid-row
    b.extra.indices[1, 6] = -8
    b.extra.indices[2, :] = -1                  # window empty and no valid extra id: 0 / -inf
    b.extra.indices[3, :] = 95                  # only out-of-range ids: the window alone
    out, lse = check_against_reference(b)
    assert (out[2] == 0).all() and (lse[2] == -math.inf).all()
    window_only, window_lse = run(replace(b, extra=None), return_lse=True)
    assert torch.equal(out[3], window_only[3]) and torch.equal(lse[3], window_lse[3])


def test_duplicates_within_and_across_sources_sharing_a_cache():
    """Both sources name one cache: a slot in the window and twice in the extra source is three
    entries of J_t."""
    b = make_batch(T=3, H=4, D=64, W=16, lens=[16, 16, 5], seed=11,
                   extra=dict(W=20, lens=[20, 20, 20], share_cache=True))
    assert b.extra.kv_cache is b.kv_cache and b.extra.inv_scale is b.inv_scale
    b.extra.indices[0, 0] = b.indices[0, 4]      # across the sources
    b.extra.indices[0, 7] = b.indices[0, 4]      # and once more within the extra source
    b.extra.indices[1, 2:6] = b.extra.indices[1, 1]
    b.extra.indices[2, :] = b.indices[2, 0]      # the window's first slot, 20 more times
    check_against_reference(b)


def test_extra_source_that_repeats_the_window_doubles_every_entry():
    """Independent of the reference: an extra source with the window's very cache, scales, ids and
    lengths makes every entry count twice, which leaves out unchanged without a sink and adds
    log 2 to the lse."""
    b = make_batch(T=5, H=4, D=64, W=16, seed=13)
    out, lse = run(b, return_lse=True)
    doubled = replace(b, extra=b.sources()[0])
    out2, lse2 = run(doubled, return_lse=True)
    ref_out, ref_lse = reference(doubled)
    assert_bf16_rounding_of(out2, ref_out)
    assert_lse_equal(lse2, ref_lse)
    assert torch.equal(out2, out)
    finite = torch.isfinite(lse)
    assert torch.allclose(lse2[finite].double(), lse[finite].double() + math.log(2), rtol=1e-6)
    assert torch.equal(torch.isinf(lse2), ~finite)


@pytest.mark.parametrize("sink", [-math.inf, math.inf, 0.0, 3.5])
def test_extra_source_with_sinks(sink):
    """One sink per head for the whole of J_t, never in the lse."""
    b = make_batch(T=5, H=4, D=64, W=16, sink=sink, seed=17,
                   extra=dict(num_blocks=3, block_size=32, W=40))
    out, _ = check_against_reference(b)
    if sink == math.inf:
        assert (out == 0).all()


def test_extra_window_smaller_than_index_columns_reads_first_columns():
    b = make_batch(T=3, H=2, D=64, W=16, poison=False,
                   extra=dict(W=24, lens=[24, 24, 24]))
    b.extra.window = 9
    check_against_reference(b)


def test_extra_window_defaults_to_index_columns():
    b = make_batch(T=4, H=2, D=64, W=16, extra=dict(W=24, lens=[24, 3, 0, 25]))
    out = run(b, extra_window=None)
    assert_bf16_rounding_of(out, reference(b)[0])


def test_largest_extra_window():
    """MAX_EXTRA_ENTRIES columns are accepted and all of them are read."""
    b = make_batch(T=2, H=2, D=16, num_blocks=2, block_size=16, W=16, lens=[16, 0],
                   extra=dict(num_blocks=64, block_size=256, W=MAX_EXTRA_ENTRIES,
                              lens=[MAX_EXTRA_ENTRIES, MAX_EXTRA_ENTRIES - 1]))
    check_against_reference(b)


def test_extra_source_with_strided_q_and_outputs():
    b = make_batch(T=4, H=4, D=64, W=16, seed=19, extra=dict(W=32, row_stride=72))
    wide_q = torch.randn(4, 6, 80).to(torch.bfloat16)
    wide_q[:, 1:5, 8:72] = b.q
    b.q = wide_q[:, 1:5, 8:72]
    wide_out = torch.full((4, 4, 128), 7.0, dtype=torch.bfloat16)
    out = wide_out[:, :, 32:96]
    lse_store = torch.full((4, 8), 7.0)
    ret, ret_lse = run(b, out=out, lse=lse_store[:, :4], return_lse=True)
    ref_out, ref_lse = reference(b)
    assert ret is out
    assert_bf16_rounding_of(out, ref_out)
    assert_lse_equal(ret_lse, ref_lse)
    assert (wide_out[:, :, :32] == 7).all() and (lse_store[:, 4:] == 7).all()


def test_extra_source_with_zero_tokens():
    b = make_batch(T=0, H=2, D=64, extra=dict(W=8))
    out, lse = run(b, return_lse=True)
    assert out.shape == (0, 2, 64) and lse.shape == (0, 2)


@pytest.mark.parametrize("with_extra", [False, True])
def test_nan_in_padding_heads_of_q_stays_in_those_heads(with_extra):
    """Engines pass uninitialized padding heads: NaN in heads 1 and 6 of q must not reach the
    output or the lse of any other head."""
    b = make_batch(T=5, H=8, D=64, W=16, seed=23, sink=0.5,
                   extra=dict(W=24) if with_extra else None)
    padding = torch.tensor([1, 6])
    heads = torch.tensor([h for h in range(8) if h not in (1, 6)])
    b.q[:, padding] = float("nan")
    out, lse = run(b, return_lse=True)
    ref_out, ref_lse = reference(replace(b, q=b.q[:, heads], attn_sink=b.attn_sink[heads]))
    assert_bf16_rounding_of(out[:, heads], ref_out)
    assert_lse_equal(lse[:, heads], ref_lse)


def test_reference_is_one_softmax_over_both_sources():
    """The tests' reference itself (no package call): with an extra source and no sink it equals
    the LSE merge of its window-only and extra-only results."""
    b = make_batch(T=6, H=4, D=32, W=16, seed=29, lens=[16, 8, 0, 0, 15, 1],
                   extra=dict(num_blocks=3, block_size=8, W=20, lens=[1, 0, 20, 0, 10, 19]))
    out, lse = reference(b)
    out_w, lse_w = reference(replace(b, extra=None))
    x = b.extra
    out_x, lse_x = reference(replace(b, kv_cache=x.kv_cache, inv_scale=x.inv_scale,
                                     indices=x.indices, lens=x.lens, block_size=x.block_size,
                                     window_size=x.window, extra=None))
    merged_lse = torch.logaddexp(lse_w, lse_x)
    finite = torch.isfinite(merged_lse)
    weight_w = torch.where(finite, torch.exp(lse_w - merged_lse), 0.0).unsqueeze(-1)
    weight_x = torch.where(finite, torch.exp(lse_x - merged_lse), 0.0).unsqueeze(-1)
    assert torch.allclose(out, weight_w * out_w + weight_x * out_x, rtol=1e-12, atol=1e-12)
    assert torch.equal(torch.isinf(lse), ~finite)
    assert torch.allclose(lse[finite], merged_lse[finite], rtol=1e-12)
    # the case list: both empty (token 3), window only (1), extra only (2)
    assert (~finite).any() and (torch.isinf(lse_w) & finite).any()
    assert (torch.isinf(lse_x) & finite).any()


# ---- lens_rows_per_entry and lens=None (docs/semantics.md, "Valid entries") -----------------
@pytest.mark.parametrize("path", ["torch", "numpy"])
def test_one_length_per_group_of_rows_equals_the_length_of_each_row(path):
    """lens (T / n,) with lens_rows_per_entry = n gives each of n consecutive rows the length of
    its group: the window's groups of 3, the extra source's of 2, against decode() given the
    per-row lengths, bit for bit, and the float64 reference. Consecutive groups differ, so
    lens[t] in place of lens[t / n] would give another result."""
    window_lens, extra_lens = [16, 16, 16, 3, 3, 3], [0, 0, 24, 24, 5, 5]
    b = make_batch(T=6, H=4, D=64, W=16, lens=window_lens, lens_dtype=torch.int32, seed=9,
                   extra=dict(num_blocks=4, block_size=16, W=24, lens=extra_lens,
                              lens_dtype=torch.int64))
    per_row_out, per_row_lse = check_against_reference(b)
    groups = dict(lens=b.lens[::3].contiguous(), lens_rows_per_entry=3,
                  extra_lens=b.extra.lens[::2].contiguous(), extra_lens_rows_per_entry=2)
    if path == "torch":
        out, lse = swa_decode.decode(b.q, b.kv_cache, b.inv_scale, b.indices, groups.pop("lens"),
                                     block_size=b.block_size, return_lse=True,
                                     **{**b.extra_kwargs(), **groups})
    else:
        args = as_numpy(b)
        args.update(lens=groups.pop("lens").numpy(),
                    extra_lens=groups.pop("extra_lens").numpy(), **groups)
        out, lse = swa_decode.decode(**args, block_size=b.block_size, return_lse=True)
        out, lse = torch.from_numpy(out.astype("float32")).to(torch.bfloat16), torch.from_numpy(lse)
    assert torch.equal(out, per_row_out) and torch.equal(lse, per_row_lse)


@pytest.mark.parametrize("source", ["window", "extra"])
def test_no_lens_counts_every_index_column_up_to_the_limit(source):
    """lens=None (or extra_lens=None): every index column counts, as lengths of the limit do.
    The columns past each limit are not read (they would add entries, some of them NaN rows)."""
    b = make_batch(T=4, H=4, D=64, W=16, lens=[16] * 4, spare_index_cols=5, seed=10,
                   extra=dict(num_blocks=4, block_size=16, W=24, lens=[24] * 4,
                              spare_index_cols=2))
    with_lens_out, with_lens_lse = check_against_reference(b)
    if source == "window":
        out, lse = swa_decode.decode(b.q, b.kv_cache, b.inv_scale, b.indices, None,
                                     block_size=b.block_size, window_size=16, return_lse=True,
                                     **b.extra_kwargs())
    else:
        out, lse = run(b, return_lse=True, extra_lens=None)
    assert not out.isnan().any()
    assert torch.equal(out, with_lens_out) and torch.equal(lse, with_lens_lse)


# ---- empty_token_lse (docs/semantics.md, "Edge cases") --------------------------------------
def empty_token_batch():
    """Token 1 has no entry in either source, token 3 none in the window, token 0 none in the
    extra source: only token 1 is empty."""
    return make_batch(T=5, H=4, D=64, W=16, lens=[16, 0, 5, 0, 1], seed=41, sink=0.5,
                      extra=dict(W=8, lens=[0, -2, 3, 8, 0]))


@pytest.mark.parametrize("path", ["torch", "torch out= lse=", "numpy"])
@pytest.mark.parametrize("empty_token_lse", [-math.inf, math.inf])
def test_empty_token_lse_is_what_the_caller_asks(empty_token_lse, path):
    """The empty token's lse is -inf (the default) or +inf as asked, on every path; its out is 0
    and every other token's out and lse are the same bits either way."""
    b = empty_token_batch()
    if path == "numpy":
        np = pytest.importorskip("numpy")
        args = dict(as_numpy(b), block_size=b.block_size, attn_sink=b.attn_sink.numpy(),
                    return_lse=True)
        default = swa_decode.decode(**args)
        got = swa_decode.decode(**args, empty_token_lse=empty_token_lse)
        default, got = ([torch.from_numpy(np.asarray(x, dtype=np.float64)) for x in pair]
                        for pair in (default, got))
    elif path == "torch":
        default = run(b, return_lse=True)
        got = run(b, return_lse=True, empty_token_lse=empty_token_lse)
    else:
        default = run(b, return_lse=True)
        got = (torch.full_like(b.q, math.nan), torch.full((5, 4), math.nan))
        run(b, out=got[0], lse=got[1], return_lse=True, empty_token_lse=empty_token_lse)
    (default_out, default_lse), (out, lse) = default, got
    ref_out, ref_lse = reference(b)
    assert (ref_lse[1] == -math.inf).all() and torch.isfinite(ref_lse[[0, 2, 3, 4]]).all()
    assert_lse_equal(default_lse, ref_lse)
    assert (lse[1] == empty_token_lse).all() and (out[1] == 0).all()
    assert torch.equal(out, default_out)
    assert torch.equal(lse[[0, 2, 3, 4]], default_lse[[0, 2, 3, 4]])
    assert_bf16_rounding_of(out, ref_out)
