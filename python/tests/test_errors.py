"""Bad input raises ValueError or TypeError naming the argument, the expected and the actual value.

Every shape or stride a tensor carries that an argument (or another tensor) can contradict is
checked, on the torch path, the custom ops called directly and the DLPack path alike: a
contradiction the op trusted instead would read bytes outside the tensors it was given.
"""

import pytest
import torch

import swa_decode
from conftest import assert_bf16_rounding_of, make_batch, reference
from swa_decode.limits import MAX_WINDOW


def call(b, **overrides):
    args = dict(q=b.q, kv_cache=b.kv_cache, inv_scale=b.inv_scale, indices=b.indices,
                lens=b.lens, block_size=b.block_size, window_size=b.window_size)
    args.update(overrides)
    return swa_decode.decode(args.pop("q"), args.pop("kv_cache"), args.pop("inv_scale"),
                             args.pop("indices"), args.pop("lens"), **args)


@pytest.fixture
def b():
    """T = 3, H = 4, D = 64, W = 16 columns; 6 blocks of 16 slots = 96 slots."""
    return make_batch(T=3, H=4, D=64, W=16, poison=False)


BF16, U8, I64 = torch.bfloat16, torch.uint8, torch.int64
OUT = torch.zeros(3, 4, 64, dtype=BF16)  # a valid out= beside a bad lse=


def strided(dtype, shape, strides):
    """A tensor whose strides make it overlap itself (as_strided over a buffer large enough)."""
    size = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    return torch.zeros(size, dtype=dtype).as_strided(shape, strides)


def expect(exc, *parts, **overrides):
    """The call raises `exc` with every substring of `parts` in its message."""
    def check(b):
        with pytest.raises(exc) as info:
            call(b, **overrides)
        for part in parts:
            assert part in str(info.value), f"{part!r} not in {str(info.value)!r}"
    return check


CASES = {
    "q dtype": expect(TypeError, "q", "bfloat16", "float16",
                      q=torch.zeros(3, 4, 64, dtype=torch.float16)),
    "kv dtype": expect(TypeError, "kv_cache", "uint8", "int8",
                       kv_cache=torch.zeros(6, 16, 64, dtype=torch.int8)),
    "scale dtype": expect(TypeError, "inv_scale", "float32", "float64",
                          inv_scale=torch.zeros(96, dtype=torch.float64)),
    "index dtype": expect(TypeError, "indices", "int32 or int64", "int16",
                          indices=torch.zeros(3, 16, dtype=torch.int16)),
    "lens dtype": expect(TypeError, "lens", "int32 or int64", "float32",
                         lens=torch.zeros(3, dtype=torch.float32)),
    "sink dtype": expect(TypeError, "attn_sink", "float32", "bfloat16",
                         attn_sink=torch.zeros(4, dtype=torch.bfloat16)),
    "head dim": expect(ValueError, "kv_cache.shape[2]", "64", "32",
                       kv_cache=torch.zeros(6, 16, 32, dtype=torch.uint8)),
    "lens T": expect(ValueError, "lens.shape[0]", "3", "5", lens=torch.zeros(5, dtype=torch.int64)),
    "indices T": expect(ValueError, "indices.shape[0]", "3", "2",
                        indices=torch.zeros(2, 16, dtype=torch.int64)),
    "indices 3-D batch": expect(ValueError, "indices", "(1, T, W)", "(2, 3, 16)",
                                indices=torch.zeros(2, 3, 16, dtype=torch.int64)),
    "sink H": expect(ValueError, "attn_sink.shape[0]", "4", "5",
                     attn_sink=torch.zeros(5, dtype=torch.float32)),
    "out shape": expect(ValueError, "out.shape[1]", "4", "2",
                        out=torch.zeros(3, 2, 64, dtype=torch.bfloat16)),
    "out dtype": expect(TypeError, "out", "bfloat16", "float32",
                        out=torch.zeros(3, 4, 64, dtype=torch.float32)),
    "q rank": expect(ValueError, "q", "3-D", "2-D", q=torch.zeros(3, 256, dtype=torch.bfloat16)),
    "scale rank": expect(ValueError, "inv_scale.shape[1]", "1", "2",
                         inv_scale=torch.zeros(48, 2, dtype=torch.bfloat16)),
    "q inner stride": expect(ValueError, "q.stride(2)", "1", "2",
                             q=torch.zeros(3, 4, 128, dtype=torch.bfloat16)[:, :, ::2]),
    "block_size 0": expect(ValueError, "block_size", "0", block_size=0),
    "block_size -1": expect(ValueError, "block_size", "-1", block_size=-1),
    "window 0": expect(ValueError, "window_size", "0", window_size=0),
    "scale nan": expect(ValueError, "scale", "nan", scale=float("nan")),
    "device": expect(ValueError, "kv_cache", "q's device cpu", "meta",
                     kv_cache=torch.zeros(6, 16, 64, dtype=torch.uint8, device="meta")),
    "not a tensor": expect(TypeError, "lens", "torch.Tensor", "list", lens=[1, 2, 3]),
    "stream on torch": expect(ValueError, "stream", stream=0),
    "lse without out": expect(ValueError, "lse", "out", lse=torch.zeros(3, 4)),
    # ---- shapes an argument can contradict ----
    "kv rows < block_size": expect(ValueError,
                                   "kv_cache.shape[1] must equal block_size = 16, got 8",
                                   kv_cache=torch.zeros(6, 16, 64, dtype=U8)[:, :8]),
    "kv rows > block_size": expect(ValueError,
                                   "kv_cache.shape[1] must equal block_size = 8, got 16",
                                   block_size=8),
    "scale count": expect(ValueError,
                          "inv_scale.shape[0] must be >= kv_cache.shape[0] * block_size",
                          "= 96, got 95", inv_scale=torch.zeros(95, 1, dtype=BF16)),
    "scale (1, S)": expect(ValueError, "inv_scale.shape[1] must equal 1", "got 96",
                           inv_scale=torch.zeros(1, 96, dtype=BF16)),
    "scale 3-D": expect(ValueError, "inv_scale", "1-D", "3-D",
                        inv_scale=torch.zeros(96, 1, 1, dtype=BF16)),
    "scale stride": expect(ValueError, "inv_scale.stride(0)", "1", "2",
                           inv_scale=torch.zeros(96, 2, dtype=BF16)[:, :1]),
    "index cols < window": expect(ValueError,
                                  "indices.shape[1] must be >= window_size = 17, got 16",
                                  window_size=17),
    "window > MAX_WINDOW": expect(ValueError, f"window_size must be in [1, {MAX_WINDOW}]",
                                  f"got {MAX_WINDOW + 1}", window_size=MAX_WINDOW + 1,
                                  indices=torch.zeros(3, MAX_WINDOW + 1, dtype=I64)),
    # ---- the cache's own dims, dtype and strides; q's ----
    "kv rank": expect(ValueError, "kv_cache", "3-D", "4-D",
                      kv_cache=torch.zeros(6, 16, 1, 64, dtype=U8)),
    "kv e5m2": expect(TypeError, "kv_cache", "float8_e4m3fn", "float8_e5m2",
                      kv_cache=torch.zeros(6, 16, 64, dtype=torch.float8_e5m2)),
    "kv rows overlap": expect(ValueError, "kv_cache", "64", "32",
                              kv_cache=strided(U8, (6, 16, 64), (16 * 32, 32, 1))),
    "kv blocks broadcast": expect(ValueError, "kv_cache", "got 0",
                                  kv_cache=torch.zeros(1, 16, 64, dtype=U8).expand(6, 16, 64)),
    "kv inner stride": expect(ValueError, "kv_cache.stride(2)", "1", "2",
                              kv_cache=torch.zeros(6, 16, 128, dtype=U8)[:, :, ::2]),
    "kv no blocks": expect(ValueError, "num_blocks", "got 0",
                           kv_cache=torch.zeros(0, 16, 64, dtype=U8)),
    "head dim 0": expect(ValueError, "head_dim", "got 0", q=torch.zeros(3, 4, 0, dtype=BF16),
                         kv_cache=torch.zeros(6, 16, 0, dtype=U8)),
    "q 0-D": expect(ValueError, "q", "3-D", "0-D", q=torch.zeros((), dtype=BF16)),
    "q heads overlap": expect(ValueError, "q", "64", "16",
                              q=strided(BF16, (3, 4, 64), (64, 16, 1))),
    # ---- indices, lens, attn_sink ----
    "indices rank": expect(ValueError, "indices", "2-D", "1-D",
                           indices=torch.zeros(16, dtype=I64)),
    "indices inner stride": expect(ValueError, "indices.stride(1)", "1", "2",
                                   indices=torch.zeros(3, 32, dtype=I64)[:, ::2]),
    "indices rows broadcast": expect(ValueError, "indices", "got 0",
                                     indices=torch.zeros(1, 16, dtype=I64).expand(3, 16)),
    "lens rank": expect(ValueError, "lens", "1-D", "2-D", lens=torch.zeros(3, 1, dtype=I64)),
    "lens stride": expect(ValueError, "lens.stride(0)", "1", "2",
                          lens=torch.zeros(6, dtype=I64)[::2]),
    "sink rank": expect(ValueError, "attn_sink", "1-D", "2-D", attn_sink=torch.zeros(1, 4)),
    "sink stride": expect(ValueError, "attn_sink.stride(0)", "1", "2",
                          attn_sink=torch.zeros(8)[::2]),
    # ---- out and lse ----
    "out T": expect(ValueError, "out.shape[0]", "3", "2", out=torch.zeros(2, 4, 64, dtype=BF16)),
    "out D": expect(ValueError, "out.shape[2]", "64", "32", out=torch.zeros(3, 4, 32, dtype=BF16)),
    "out rank": expect(ValueError, "out", "3-D", "2-D", out=torch.zeros(3, 256, dtype=BF16)),
    "out inner stride": expect(ValueError, "out.stride(2)", "1", "2",
                               out=torch.zeros(3, 4, 128, dtype=BF16)[:, :, ::2]),
    "out heads overlap": expect(ValueError, "out", "64", "16",
                                out=strided(BF16, (3, 4, 64), (64, 16, 1))),
    "lse H": expect(ValueError, "lse.shape[1]", "4", "5", out=OUT, lse=torch.zeros(3, 5)),
    "lse rank": expect(ValueError, "lse", "2-D", "1-D", out=OUT, lse=torch.zeros(12)),
    "lse dtype": expect(TypeError, "lse", "float32", "float64", out=OUT,
                        lse=torch.zeros(3, 4, dtype=torch.float64)),
    "lse inner stride": expect(ValueError, "lse.stride(1)", "1", "2", out=OUT,
                               lse=torch.zeros(3, 8)[:, ::2]),
    "lse rows broadcast": expect(ValueError, "lse", "got 0", out=OUT,
                                 lse=torch.zeros(1, 4).expand(3, 4)),
    # ---- integer arguments: never truncated ----
    "block_size float": expect(TypeError, "block_size", "int", "float", block_size=16.5),
    "block_size str": expect(TypeError, "block_size", "int", "str", block_size="16"),
    "block_size None": expect(TypeError, "block_size", "int", "NoneType", block_size=None),
    "block_size > int64": expect(ValueError, "block_size", "int64", str(2 ** 70),
                                 block_size=2 ** 70),
    "window float": expect(TypeError, "window_size", "int", "float", window_size=16.9),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_argument(b, case):
    CASES[case](b)


def test_message_is_the_native_status_message(b):
    """The C++ layer's message comes through intact (no prefix, no truncation)."""
    with pytest.raises(ValueError) as info:
        call(b, window_size=0)
    assert str(info.value).startswith("window_size")


def test_view_with_fewer_rows_than_block_size():
    """The issue's case: a (4, 64, D) view of a (4, 128, D) cache with block_size = 128. Trusting
    block_size, slot 100 would name row 100 of block 0, outside the view (and in the last block,
    past the allocation)."""
    b = make_batch(T=2, H=2, num_blocks=4, block_size=128, W=16, lens=[16, 16], poison=False)
    b.indices[0, 0] = 100
    view = b.kv_cache[:, :64]
    message = r"kv_cache\.shape\[1\] must equal block_size = 128, got 64"
    with pytest.raises(ValueError, match=f"^{message}$"):
        call(b, kv_cache=view)
    with pytest.raises(ValueError, match=message):
        swa_decode.native_swa_decode_attention(b.q, view, b.inv_scale, b.indices, b.lens, 128,
                                               0.1, 16)


@pytest.mark.parametrize("op", ["decode", "decode_out"])
def test_custom_ops_called_directly_check_block_size(b, op):
    view = b.kv_cache[:, :8]
    args = (b.q, view, b.inv_scale, b.indices, b.lens, None)
    rest = (b.block_size, 0.125, b.window_size)
    with pytest.raises(ValueError, match=r"kv_cache\.shape\[1\] must equal block_size = 16, got 8"):
        if op == "decode":
            torch.ops.swa_decode.decode(*args, *rest, False)
        else:
            torch.ops.swa_decode.decode_out(*args, torch.empty_like(b.q), None, *rest)


def drop_in(b, **overrides):
    args = dict(q=b.q, swa_kv_cache=b.kv_cache, swa_inv_scale=b.inv_scale, swa_indices=b.indices,
                swa_lens=b.lens, block_size=b.block_size, scale=0.125, window_size=b.window_size)
    args.update(overrides)
    return swa_decode.native_swa_decode_attention(**args)


ROWS = "must be >= q.shape[0] (num_tokens) = 3, got 2"
INDICES_LAYOUT = "swa_indices must be 2-D (T, W) or 3-D (1, T, W), got"
DROP_IN_CASES = {
    "indices rows < T": (ValueError, f"swa_indices.shape[0] {ROWS}",
                         lambda b: dict(swa_indices=b.indices[:2])),
    "3-D indices rows < T": (ValueError, f"swa_indices.shape[1] {ROWS}",
                             lambda b: dict(swa_indices=b.indices[:2].unsqueeze(0))),
    "indices batch of 2": (ValueError, f"{INDICES_LAYOUT} shape (2, 3, 16)",
                           lambda b: dict(swa_indices=b.indices.expand(2, 3, 16))),
    "indices 1-D": (ValueError, f"{INDICES_LAYOUT} 1-D", lambda b: dict(swa_indices=b.indices[0])),
    "lens rows < T": (ValueError, f"swa_lens.shape[0] {ROWS}", lambda b: dict(swa_lens=b.lens[:2])),
    "lens 0-D": (ValueError, "swa_lens must be 1-D (T,), got 0-D",
                 lambda b: dict(swa_lens=b.lens[0])),
    "q 0-D": (ValueError, "q must be 3-D", lambda b: dict(q=b.q[0, 0, 0])),
    "not a tensor": (TypeError, "lens must be a torch.Tensor", lambda b: dict(swa_lens=[1, 2, 3])),
    "block_size float": (TypeError, "block_size must be an int, got float",
                         lambda b: dict(block_size=16.0)),
}


@pytest.mark.parametrize("case", list(DROP_IN_CASES))
def test_drop_in_bad_argument(b, case):
    exc, message, overrides = DROP_IN_CASES[case]
    with pytest.raises(exc) as info:
        drop_in(b, **overrides(b))
    assert message in str(info.value), f"{message!r} not in {str(info.value)!r}"


def test_drop_in_takes_the_first_rows_of_longer_indices_and_lens(b):
    """The seed's convention: (T', W) / (1, T', W) indices and (T',) lens with T' >= T."""
    expected = drop_in(b)
    longer_indices = torch.cat([b.indices, torch.full((2, 16), 10 ** 6)])
    longer_lens = torch.cat([b.lens, torch.tensor([-3, 5])])
    assert torch.equal(drop_in(b, swa_indices=longer_indices, swa_lens=longer_lens), expected)
    assert torch.equal(drop_in(b, swa_indices=longer_indices.unsqueeze(0), swa_lens=longer_lens),
                       expected)


def test_integer_like_arguments_are_accepted(b):
    """operator.index semantics: numpy and 0-D torch integers stand for ints; floats never do."""
    np = pytest.importorskip("numpy")
    expected = call(b)
    assert torch.equal(call(b, block_size=np.int64(16), window_size=np.int32(16)), expected)
    assert torch.equal(call(b, block_size=torch.tensor(16)), expected)


def test_dlpack_path_checks_the_same_contradictions(b):
    np = pytest.importorskip("numpy")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q = b.q.float().numpy().astype(ml_dtypes.bfloat16)
    kv, scale, idx, lens = (t.numpy() for t in (b.kv_cache, b.inv_scale.float(), b.indices,
                                                b.lens))

    def numpy_call(**overrides):
        args = dict(q=q, kv_cache=kv, inv_scale=scale, indices=idx, lens=lens, block_size=16)
        args.update(overrides)
        return swa_decode.decode(args.pop("q"), args.pop("kv_cache"), args.pop("inv_scale"),
                                 args.pop("indices"), args.pop("lens"), **args)

    with pytest.raises(ValueError, match=r"kv_cache\.shape\[1\] must equal block_size = 16, got 8"):
        numpy_call(kv_cache=kv[:, :8])
    with pytest.raises(ValueError, match=r"indices\.shape\[1\] must be >= window_size = 17, got"):
        numpy_call(window_size=17)
    with pytest.raises(ValueError, match=r"inv_scale\.shape\[0\] must be >= .* = 96, got 95"):
        numpy_call(inv_scale=scale[:95])
    with pytest.raises(TypeError, match=r"block_size must be an int, got float"):
        numpy_call(block_size=16.0)
    with pytest.raises(ValueError, match="head_dim"):
        numpy_call(q=np.zeros((3, 4, 0), dtype=ml_dtypes.bfloat16),
                   kv_cache=np.zeros((6, 16, 0), np.uint8))
    with pytest.raises(ValueError, match=r"lse\.shape\[1\] must equal q\.shape\[1\] .* = 4, got 5"):
        numpy_call(out=np.zeros((3, 4, 64), ml_dtypes.bfloat16), lse=np.zeros((3, 5), np.float32),
                   return_lse=True)


def test_largest_window_runs():
    """MAX_WINDOW itself is accepted, and all its columns are read, on the CPU backend."""
    wide = make_batch(T=2, H=2, D=16, num_blocks=2, block_size=MAX_WINDOW, W=MAX_WINDOW,
                      lens=[MAX_WINDOW, MAX_WINDOW - 1])
    assert_bf16_rounding_of(call(wide), reference(wide)[0])
