"""Bad input raises ValueError or TypeError naming the argument, the expected and the actual value.

Every shape or stride a tensor carries that an argument (or another tensor) can contradict is
checked, on the torch path, the custom ops called directly and the DLPack path alike: a
contradiction the op trusted instead would read bytes outside the tensors it was given.
"""

import re

import pytest
import torch

import swa_decode
from conftest import as_numpy, assert_bf16_rounding_of, make_batch, reference
from swa_decode.limits import MAX_EXTRA_ENTRIES, MAX_WINDOW


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
    """The call raises `exc` with every substring of `parts` in its message (the overrides stay on
    the check, for test_eager to make the same call on both paths)."""
    def check(b):
        with pytest.raises(exc) as info:
            call(b, **overrides)
        for part in parts:
            assert part in str(info.value), f"{part!r} not in {str(info.value)!r}"
    check.overrides = overrides
    return check


CASES = {
    "q dtype": expect(TypeError, "q", "bfloat16", "float16",
                      q=torch.zeros(3, 4, 64, dtype=torch.float16)),
    "sink dtype": expect(TypeError, "attn_sink", "float32", "bfloat16",
                         attn_sink=torch.zeros(4, dtype=torch.bfloat16)),
    "indices 3-D batch": expect(ValueError, "indices", "(1, T, W)", "(2, 3, 16)",
                                indices=torch.zeros(2, 3, 16, dtype=torch.int64)),
    "sink H": expect(ValueError, "attn_sink.shape[0]", "4", "5",
                     attn_sink=torch.zeros(5, dtype=torch.float32)),
    "out shape": expect(ValueError, "out.shape[1]", "4", "2",
                        out=torch.zeros(3, 2, 64, dtype=torch.bfloat16)),
    "out dtype": expect(TypeError, "out", "bfloat16", "float32",
                        out=torch.zeros(3, 4, 64, dtype=torch.float32)),
    "q rank": expect(ValueError, "q", "3-D", "2-D", q=torch.zeros(3, 256, dtype=torch.bfloat16)),
    "q inner stride": expect(ValueError, "q.stride(2)", "1", "2",
                             q=torch.zeros(3, 4, 128, dtype=torch.bfloat16)[:, :, ::2]),
    "scale nan": expect(ValueError, "scale", "nan", scale=float("nan")),
    "stream on torch": expect(ValueError, "stream", stream=0),
    "lse without out": expect(ValueError, "lse", "out", lse=torch.zeros(3, 4)),
    "window > MAX_WINDOW": expect(ValueError, f"window_size must be in [1, {MAX_WINDOW}]",
                                  f"got {MAX_WINDOW + 1}", window_size=MAX_WINDOW + 1,
                                  indices=torch.zeros(3, MAX_WINDOW + 1, dtype=I64)),
    "block_size None": expect(TypeError, "block_size", "int", "NoneType", block_size=None),
    # ---- q's own dims and strides ----
    "head dim 0": expect(ValueError, "head_dim", "got 0", q=torch.zeros(3, 4, 0, dtype=BF16),
                         kv_cache=torch.zeros(6, 16, 0, dtype=U8)),
    "q 0-D": expect(ValueError, "q", "3-D", "0-D", q=torch.zeros((), dtype=BF16)),
    "q heads overlap": expect(ValueError, "q", "64", "16",
                              q=strided(BF16, (3, 4, 64), (64, 16, 1))),
    # ---- attn_sink ----
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
    # ---- empty_token_lse: a float, -inf or +inf ----
    "empty_token_lse 0": expect(ValueError, "empty_token_lse must be", "got float 0.0",
                                empty_token_lse=0.0),
    "empty_token_lse str": expect(ValueError, "empty_token_lse must be", "got str 'inf'",
                                  empty_token_lse="inf"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_argument(b, case):
    CASES[case](b)


# ---- one KV source's arguments: the window and the extra source obey the same rules ----------
# A source's argument names, by role: the cases below are written once over {kv_cache},
# {block_size}, ... and run for both sources, as the binding checks both with one function.
WINDOW = dict(kv_cache="kv_cache", inv_scale="inv_scale", indices="indices", lens="lens",
              block_size="block_size", window="window_size", lens_rows="lens_rows_per_entry")
EXTRA = dict(kv_cache="extra_kv_cache", inv_scale="extra_inv_scale", indices="extra_indices",
             lens="extra_lens", block_size="extra_block_size", window="extra_window",
             lens_rows="extra_lens_rows_per_entry")
SOURCES = {"window": WINDOW, "extra": EXTRA}


@pytest.fixture
def bx():
    """The fixture's batch plus an extra source of the same shape (6 blocks of 16 slots, 16
    columns), so that every number in a source case's message is the same for both sources."""
    return make_batch(T=3, H=4, D=64, W=16, poison=False, extra=dict(W=16))


def call_source(b, names, **overrides):
    """call() with the role-named overrides given to the source `names` spells."""
    return call(b, **{**b.extra_kwargs(), **{names[role]: v for role, v in overrides.items()}})


SOURCE_CASES = {
    "kv dtype": (TypeError, ["{kv_cache}", "uint8", "int8"],
                 dict(kv_cache=torch.zeros(6, 16, 64, dtype=torch.int8))),
    "kv e5m2": (TypeError, ["{kv_cache}", "float8_e4m3fn", "float8_e5m2"],
                dict(kv_cache=torch.zeros(6, 16, 64, dtype=torch.float8_e5m2))),
    "scale dtype": (TypeError, ["{inv_scale}", "float32", "float64"],
                    dict(inv_scale=torch.zeros(96, dtype=torch.float64))),
    "index dtype": (TypeError, ["{indices}", "int32 or int64", "int16"],
                    dict(indices=torch.zeros(3, 16, dtype=torch.int16))),
    "lens dtype": (TypeError, ["{lens}", "int32 or int64", "float32"],
                   dict(lens=torch.zeros(3, dtype=torch.float32))),
    "head dim": (ValueError, ["{kv_cache}.shape[2] must equal q.shape[2] (head_dim) = 64, got 32"],
                 dict(kv_cache=torch.zeros(6, 16, 32, dtype=U8))),
    # An empty extra cache has a null pointer, "no extra source" to the library: the binding
    # refuses it; the window's is validate_args' to refuse.
    "kv no blocks": (ValueError, ["num_blocks", "must be", "got 0"],
                     dict(kv_cache=torch.zeros(0, 16, 64, dtype=U8))),
    "kv rank": (ValueError, ["{kv_cache} must be 3-D", "4-D"],
                dict(kv_cache=torch.zeros(6, 16, 1, 64, dtype=U8))),
    "kv inner stride": (ValueError, ["{kv_cache}.stride(2) must be 1", "got 2"],
                        dict(kv_cache=torch.zeros(6, 16, 128, dtype=U8)[:, :, ::2])),
    "kv rows < block_size": (ValueError,
                             ["{kv_cache}.shape[1] must equal {block_size} = 16, got 8"],
                             dict(kv_cache=torch.zeros(6, 16, 64, dtype=U8)[:, :8])),
    "kv rows > block_size": (ValueError,
                             ["{kv_cache}.shape[1] must equal {block_size} = 8, got 16"],
                             dict(block_size=8)),
    "block_size 0": (ValueError, ["{block_size} = 0"], dict(block_size=0)),
    "block_size -1": (ValueError, ["{block_size} = -1"], dict(block_size=-1)),
    "scale count": (ValueError, ["{inv_scale}.shape[0] must be >= {kv_cache}.shape[0] * "
                                 "{block_size} (num_slots) = 96, got 95"],
                    dict(inv_scale=torch.zeros(95, 1, dtype=BF16))),
    "scale (1, S)": (ValueError, ["{inv_scale}.shape[1] must equal 1", "got 96"],
                     dict(inv_scale=torch.zeros(1, 96, dtype=BF16))),
    "scale 2 columns": (ValueError, ["{inv_scale}.shape[1] must equal 1", "got 2"],
                        dict(inv_scale=torch.zeros(48, 2, dtype=torch.bfloat16))),
    "scale 3-D": (ValueError, ["{inv_scale} must be 1-D", "3-D"],
                  dict(inv_scale=torch.zeros(96, 1, 1, dtype=BF16))),
    "scale stride": (ValueError, ["{inv_scale}.stride(0) must be 1", "got 2"],
                     dict(inv_scale=torch.zeros(96, 2, dtype=BF16)[:, :1])),
    "indices T": (ValueError, ["{indices}.shape[0] must equal q.shape[0] (num_tokens) = 3, got 2"],
                  dict(indices=torch.zeros(2, 16, dtype=I64))),
    "index cols < window": (ValueError, ["{indices}.shape[1] must be >= {window} = 17, got 16"],
                            dict(window=17)),
    "indices rank": (ValueError, ["{indices} must be 2-D", "1-D"],
                     dict(indices=torch.zeros(16, dtype=I64))),
    "indices inner stride": (ValueError, ["{indices}.stride(1) must be 1", "got 2"],
                             dict(indices=torch.zeros(3, 32, dtype=I64)[:, ::2])),
    "lens T": (ValueError, ["{lens}.shape[0] must equal q.shape[0] (num_tokens) = 3, got 5"],
               dict(lens=torch.zeros(5, dtype=I64))),
    "lens rank": (ValueError, ["{lens} must be 1-D", "2-D"],
                  dict(lens=torch.zeros(3, 1, dtype=I64))),
    "lens stride": (ValueError, ["{lens}.stride(0) must be 1", "got 2"],
                    dict(lens=torch.zeros(6, dtype=I64)[::2])),
    "lens per 3 rows": (ValueError, ["{lens}.shape[0] * {lens_rows} must equal q.shape[0] "
                                     "(num_tokens) = 3, got 3 * 3"],
                        dict(lens=torch.zeros(3, dtype=I64), lens_rows=3)),
    "lens_rows float": (TypeError, ["{lens_rows} must be an int, got float"],
                        dict(lens_rows=1.0)),
    "not a tensor": (TypeError, ["{lens} must be a torch.Tensor like q", "list"],
                     dict(lens=[1, 2, 3])),
    "device": (ValueError, ["{kv_cache} must be on q's device cpu, got meta"],
               dict(kv_cache=torch.zeros(6, 16, 64, dtype=U8, device="meta"))),
    "block_size float": (TypeError, ["{block_size} must be an int, got float"],
                         dict(block_size=16.5)),
    "block_size str": (TypeError, ["{block_size} must be an int, got str"], dict(block_size="16")),
    "block_size > int64": (ValueError, ["{block_size} must fit in int64", str(2 ** 70)],
                           dict(block_size=2 ** 70)),
    "window float": (TypeError, ["{window} must be an int, got float"], dict(window=16.9)),
}


@pytest.mark.parametrize("source", list(SOURCES))
@pytest.mark.parametrize("case", list(SOURCE_CASES))
def test_bad_source_argument(b, bx, source, case):
    exc, parts, overrides = SOURCE_CASES[case]
    names = SOURCES[source]
    with pytest.raises(exc) as info:
        call_source(bx if source == "extra" else b, names, **overrides)
    for part in parts:
        assert part.format(**names) in str(info.value), \
            f"{part.format(**names)!r} not in {str(info.value)!r}"


# The C++ layer's checks of a source (the overlap of its strides, its ranges), reported under the
# DecodeArgs field: `num_blocks` for the window, `extra.num_blocks` for the extra source. The extra
# rows need the C++ validation of DecodeArgs::extra.
NATIVE_SOURCE_CASES = {
    "kv rows overlap": (["stride_kv_token must be >= 64", "got 32"],
                        dict(kv_cache=strided(U8, (6, 16, 64), (16 * 32, 32, 1)))),
    "kv blocks broadcast": (["stride_kv_block must be >= 64", "got 0"],
                            dict(kv_cache=torch.zeros(1, 16, 64, dtype=U8).expand(6, 16, 64))),
    "indices rows broadcast": (["stride_indices_token must be >= 16", "got 0"],
                               dict(indices=torch.zeros(1, 16, dtype=I64).expand(3, 16))),
    "lens_rows 0": (["lens_rows_per_entry must be in [1, 2147483647], got 0"],
                    dict(lens_rows=0)),
    "lens_rows not dividing T": (["lens_rows_per_entry must divide num_tokens = 3", "got 2"],
                                 dict(lens=None, lens_rows=2)),
}
NATIVE_WINDOW_RANGE = {"window": ("window_size", MAX_WINDOW),
                       "extra": ("extra.max_entries", MAX_EXTRA_ENTRIES)}


@pytest.mark.parametrize("source", list(SOURCES))
@pytest.mark.parametrize("case", list(NATIVE_SOURCE_CASES))
def test_bad_source_argument_native(b, bx, source, case):
    parts, overrides = NATIVE_SOURCE_CASES[case]
    with pytest.raises(ValueError) as info:
        call_source(bx if source == "extra" else b, SOURCES[source], **overrides)
    message = str(info.value)
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"
    assert ("extra." in message) == (source == "extra"), message


@pytest.mark.parametrize("source", list(SOURCES))
@pytest.mark.parametrize("window", [0, "max + 1"])
def test_window_out_of_range(b, bx, source, window):
    """window_size in [1, MAX_WINDOW], extra_window in [1, MAX_EXTRA_ENTRIES]: C++'s ranges."""
    field, limit = NATIVE_WINDOW_RANGE[source]
    window = limit + 1 if window == "max + 1" else window
    names = SOURCES[source]
    indices = torch.zeros(3, max(window, 1), dtype=I64)
    with pytest.raises(ValueError) as info:
        call_source(bx if source == "extra" else b, names, indices=indices, window=window)
    message = str(info.value)
    assert f"{field} must be in [1, {limit}]" in message and f"got {window}" in message, message


# ---- the extra source: all or nothing ---------------------------------------------------------
REQUIRED_EXTRA = ["extra_kv_cache", "extra_inv_scale", "extra_indices", "extra_block_size"]
PARTIAL_EXTRA = {  # extra_lens and extra_window are optional: listed when given, never missing
    "cache only": ["extra_kv_cache"],
    "lens only": ["extra_lens"],
    "lens rows only": ["extra_lens_rows_per_entry"],
    "no scales": ["extra_kv_cache", "extra_indices", "extra_lens", "extra_block_size",
                  "extra_window"],
    "no block_size": ["extra_kv_cache", "extra_inv_scale", "extra_indices", "extra_lens"],
    "window only": ["extra_window"],
    "block_size only": ["extra_block_size"],
    "no cache": ["extra_inv_scale", "extra_indices", "extra_lens", "extra_block_size"],
}


def partial_extra(b, given, numpy=False):
    """The extra_* arguments of `given` for the batch's extra source (as numpy arrays with numpy);
    extra_lens_rows_per_entry is 1."""
    tensors = as_numpy(b) if numpy else b.extra_kwargs()
    return {k: v for k, v in {**tensors, "extra_lens_rows_per_entry": 1}.items() if k in given}


def missing_message(given):
    missing = [name for name in REQUIRED_EXTRA if name not in given]
    return f"missing {', '.join(missing)} (given: {', '.join(given)})"


@pytest.mark.parametrize("case", list(PARTIAL_EXTRA))
@pytest.mark.parametrize("path", ["decode", "decode_out", "op", "numpy"])
def test_partial_extra_source_names_what_is_missing(bx, case, path):
    given = PARTIAL_EXTRA[case]
    extra = partial_extra(bx, given)
    with pytest.raises(ValueError) as info:
        if path == "decode":
            call(bx, **extra)
        elif path == "decode_out":
            call(bx, out=torch.empty_like(bx.q), **extra)
        elif path == "op":
            torch.ops.swa_decode.decode(bx.q, bx.kv_cache, bx.inv_scale, bx.indices, bx.lens,
                                        None, 16, 0.125, 16, False, **extra)
        else:
            numpy_args = {k: v for k, v in as_numpy(bx).items() if not k.startswith("extra_")}
            swa_decode.decode(**numpy_args, block_size=16, **partial_extra(bx, given, numpy=True))
    message = str(info.value)
    assert message.startswith("an extra source needs extra_kv_cache, extra_inv_scale, "
                              "extra_indices and extra_block_size (extra_lens, extra_window and "
                              "extra_lens_rows_per_entry are optional)"), message
    assert message.endswith(missing_message(given)), message


def test_extra_indices_are_2d_only(bx):
    """(1, T, W) indices are the seed's convention for the window; the extra source has none."""
    with pytest.raises(ValueError, match=r"^extra_indices must be 2-D \(num_tokens, index_cols\), "
                                         r"got 3-D$"):
        call(bx, **{**bx.extra_kwargs(), "extra_indices": bx.extra.indices.unsqueeze(0)})


EMPTY_TOKEN_LSE = ("empty_token_lse must be float('-inf') (the default) or float('inf') "
                   "(FlashMLA's convention), got ")
# Values decode() refuses for empty_token_lse, and how its message names each.
BAD_EMPTY_TOKEN_LSE = {
    "zero": (0.0, "float 0.0"),
    "nan": (float("nan"), "float nan"),
    "finite": (-1e30, "float -1e+30"),
    "int": (1, "int 1"),
    "bool": (True, "bool True"),
    "str": ("-inf", "str '-inf'"),
    "None": (None, "NoneType None"),
    "tensor": (torch.tensor(float("inf")), "Tensor tensor(inf)"),
}


@pytest.mark.parametrize("case", list(BAD_EMPTY_TOKEN_LSE))
@pytest.mark.parametrize("path", ["torch", "torch out=", "numpy"])
def test_empty_token_lse_is_minus_or_plus_inf_as_a_float(b, case, path):
    """Exactly float('-inf') or float('inf'): anything else, a number that is not infinite or an
    infinity that is not a float, raises before anything runs, the same message on every path."""
    value, given = BAD_EMPTY_TOKEN_LSE[case]
    with pytest.raises(ValueError, match=f"^{re.escape(EMPTY_TOKEN_LSE + given)}$"):
        if path == "numpy":
            numpy_call(b, empty_token_lse=value)
        else:
            call(b, empty_token_lse=value, **({"out": torch.empty_like(b.q)} if path != "torch"
                                              else {}))


def test_empty_token_lse_takes_float_subclasses():
    """A numpy float64 is a float: its infinities are accepted."""
    np = pytest.importorskip("numpy")
    b = make_batch(T=3, H=4, D=64, W=16, lens=[16, 0, 3], poison=False)
    _, lse = call(b, return_lse=True, empty_token_lse=np.float64("inf"))
    assert (lse[1] == float("inf")).all() and torch.isfinite(lse[[0, 2]]).all()


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


@pytest.mark.parametrize("source", list(SOURCES))
@pytest.mark.parametrize("op", ["decode", "decode_out"])
def test_custom_ops_called_directly_check_block_size(b, bx, source, op):
    names = SOURCES[source]
    b = bx if source == "extra" else b
    kwargs = {**b.extra_kwargs(), names["kv_cache"]: b.sources()[-1].kv_cache[:, :8]}
    kv_cache = kwargs.pop("kv_cache", b.kv_cache)
    args = (b.q, kv_cache, b.inv_scale, b.indices, b.lens, None)
    rest = (b.block_size, 0.125, b.window_size)
    message = f"{names['kv_cache']}.shape[1] must equal {names['block_size']} = 16, got 8"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        if op == "decode":
            torch.ops.swa_decode.decode(*args, *rest, False, **kwargs)
        else:
            torch.ops.swa_decode.decode_out(*args, torch.empty_like(b.q), None, *rest, **kwargs)


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


def numpy_call(b, **overrides):
    args = dict(as_numpy(b), block_size=b.block_size)
    args.update(overrides)
    return swa_decode.decode(**args)


@pytest.mark.parametrize("source", list(SOURCES))
def test_dlpack_path_checks_the_same_contradictions(b, bx, source):
    np = pytest.importorskip("numpy")
    names = SOURCES[source]
    b = bx if source == "extra" else b
    a = as_numpy(b)

    def check(exc, message, **overrides):
        message = message.format(**names)
        with pytest.raises(exc) as info:
            numpy_call(b, **{names[role]: v for role, v in overrides.items()})
        assert message in str(info.value), f"{message!r} not in {str(info.value)!r}"

    kv, scale = a[names["kv_cache"]], a[names["inv_scale"]]
    check(ValueError, "{kv_cache}.shape[1] must equal {block_size} = 16, got 8", kv_cache=kv[:, :8])
    check(ValueError, "{indices}.shape[1] must be >= {window} = 17, got 16", window=17)
    check(ValueError, "{inv_scale}.shape[0] must be >= {kv_cache}.shape[0] * {block_size} "
                      "(num_slots) = 96, got 95", inv_scale=scale[:95])
    check(TypeError, "{inv_scale} must have dtype bfloat16 or float32, got uint16",
          inv_scale=scale.view(np.uint16))
    check(TypeError, "{block_size} must be an int, got float", block_size=16.0)
    check(TypeError, "{lens} must be a torch.Tensor or an array with __dlpack__", lens=[1, 2, 3])


def test_dlpack_path_checks_q_and_the_outputs(b):
    np = pytest.importorskip("numpy")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with pytest.raises(ValueError, match="head_dim"):
        numpy_call(b, q=np.zeros((3, 4, 0), dtype=ml_dtypes.bfloat16),
                   kv_cache=np.zeros((6, 16, 0), np.uint8))
    with pytest.raises(ValueError, match=r"lse\.shape\[1\] must equal q\.shape\[1\] .* = 4, got 5"):
        numpy_call(b, out=np.zeros((3, 4, 64), ml_dtypes.bfloat16),
                   lse=np.zeros((3, 5), np.float32), return_lse=True)


def test_largest_window_runs():
    """MAX_WINDOW itself is accepted, and all its columns are read, on the CPU backend."""
    wide = make_batch(T=2, H=2, D=16, num_blocks=2, block_size=MAX_WINDOW, W=MAX_WINDOW,
                      lens=[MAX_WINDOW, MAX_WINDOW - 1])
    assert_bf16_rounding_of(call(wide), reference(wide)[0])
