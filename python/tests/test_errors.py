"""Bad input raises ValueError or TypeError naming the argument, the expected and the actual value."""

import re

import pytest
import torch

import swa_decode
from conftest import make_batch


def call(b, **overrides):
    args = dict(q=b.q, kv_cache=b.kv_cache, inv_scale=b.inv_scale, indices=b.indices,
                lens=b.lens, block_size=b.block_size, window_size=b.window_size)
    args.update(overrides)
    return swa_decode.decode(args.pop("q"), args.pop("kv_cache"), args.pop("inv_scale"),
                             args.pop("indices"), args.pop("lens"), **args)


@pytest.fixture
def b():
    return make_batch(T=3, H=4, D=64, W=16, poison=False)


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
    "window > cols": expect(ValueError, "index_cols", "17", "16", window_size=17),
    "scale nan": expect(ValueError, "scale", "nan", scale=float("nan")),
    "device": expect(ValueError, "kv_cache", "q's device cpu", "meta",
                     kv_cache=torch.zeros(6, 16, 64, dtype=torch.uint8, device="meta")),
    "not a tensor": expect(TypeError, "lens", "torch.Tensor", "list", lens=[1, 2, 3]),
    "stream on torch": expect(ValueError, "stream", stream=0),
    "lse without out": expect(ValueError, "lse", "out", lse=torch.zeros(3, 4)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_argument(b, case):
    CASES[case](b)


def test_num_scales_too_small(b):
    with pytest.raises(ValueError, match=re.compile(r"num_scales|inv_scale")):
        call(b, inv_scale=b.inv_scale[:10])


def test_message_is_the_native_status_message(b):
    """The C++ layer's message comes through intact (no prefix, no truncation)."""
    with pytest.raises(ValueError) as info:
        call(b, window_size=0)
    assert str(info.value).startswith("window_size")
