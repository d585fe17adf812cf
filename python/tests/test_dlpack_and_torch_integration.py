"""The DLPack path (numpy on CPU) and the torch integration that needs no GPU: the seed drop-in
against the seed's own fallback, the custom ops under opcheck and torch.compile(fullgraph=True)."""

import pytest
import torch

import swa_decode
from conftest import (assert_bf16_rounding_of, assert_lse_equal, load_bench_module, make_batch,
                      reference)

np = pytest.importorskip("numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")


def as_numpy(b):
    return dict(q=b.q.float().numpy().astype(ml_dtypes.bfloat16), kv_cache=b.kv_cache.numpy(),
                inv_scale=b.inv_scale.float().numpy().astype(ml_dtypes.bfloat16),
                indices=b.indices.numpy(), lens=b.lens.numpy())


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
