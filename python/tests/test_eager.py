"""The eager torch call: when nothing traces it, decode() and the drop-in skip the custom ops'
dispatcher and hand the tensors to the binding through the DLPack C exchange API
(swa_decode._torch_ops.decode_eager). It must be the ops' call in every way a caller can see: the
same output bits, the same exception with the same message for every bad argument, the same version
bumps of out= / lse=, and the ops themselves wherever a trace, a transform or autograd would see
them. CPU tensors (the float64 reference) throughout; test_gpu.py checks the CUDA stream.
"""

import contextlib
import ctypes

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import swa_decode
import test_errors
from conftest import assert_bf16_rounding_of, make_batch, reference, run
from swa_decode import _torch_ops

pytestmark = pytest.mark.skipif(not _torch_ops._CAN_SKIP_DISPATCH,
                                reason="this torch has no DLPack C exchange API: every call "
                                       "takes the custom ops")


@contextlib.contextmanager
def through_the_ops(monkeypatch):
    """Calls inside take the custom ops: eager() says something traces them."""
    with monkeypatch.context() as m:
        m.setattr(_torch_ops, "eager", lambda q: False)
        yield


def on_both_paths(monkeypatch, fn):
    """fn() eagerly and through the custom ops: [eager, ops], each fn's result or the exception
    it raised."""
    results = []
    for forced in (False, True):
        with through_the_ops(monkeypatch) if forced else contextlib.nullcontext():
            try:
                results.append(fn())
            except Exception as e:  # noqa: BLE001 (compared, whatever it is)
                results.append(e)
    return results


def as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


def window_batch(sink=0.5, **kw):
    return make_batch(T=5, H=4, D=64, W=16, sink=sink, seed=3, **kw)


def extra_batch():
    return make_batch(T=5, H=4, D=64, W=16, sink=0.5, seed=5,
                      extra=dict(num_blocks=3, block_size=32, W=40, index_dtype=torch.int32))


def longer_rows(b):
    """The seed's layout: (1, T + 2, W) indices and (T + 2,) lens; the extra rows are never read."""
    indices = torch.cat([b.indices, torch.full((2, b.indices.shape[1]), 10 ** 6)]).unsqueeze(0)
    return indices, torch.cat([b.lens, torch.tensor([-3, 5])])


def drop_in(b, indices=None, lens=None):
    return swa_decode.native_swa_decode_attention(
        b.q, b.kv_cache, b.inv_scale, b.indices if indices is None else indices,
        b.lens if lens is None else lens, b.block_size, 0.125, b.window_size)


def out_buffer(b):
    return torch.empty(b.q.shape, dtype=torch.bfloat16)


def defaults_and_3d_indices():
    b = window_batch()
    return swa_decode.decode(b.q, b.kv_cache, b.inv_scale, b.indices.unsqueeze(0), b.lens,
                             block_size=b.block_size)


def float8_cache_fp32_scales():
    b = window_batch(scale_dtype=torch.float32, scale_2d=False)
    b.kv_cache = b.kv_cache.view(torch.float8_e4m3fn)
    return run(b, return_lse=True)


def strided():
    """q and out with padded heads, a cache with padded rows, wider index rows."""
    b = make_batch(T=4, H=3, D=64, W=16, row_stride=80, spare_index_cols=5, seed=7)
    b.q = torch.zeros(4, 3, 96, dtype=torch.bfloat16)[:, :, :64].copy_(b.q)
    out = torch.zeros(4, 3, 80, dtype=torch.bfloat16)[:, :, :64]
    return run(b, out=out, return_lse=True)


RESULT_CASES = {
    "functional": lambda: run(window_batch()),
    "return_lse": lambda: run(window_batch(), return_lse=True),
    "out=": lambda: (lambda b: run(b, out=out_buffer(b)))(window_batch()),
    "out= lse=": lambda: (lambda b: run(b, out=out_buffer(b), lse=torch.empty(5, 4),
                                        return_lse=True))(window_batch()),
    "out= allocates lse": lambda: (lambda b: run(b, out=out_buffer(b), return_lse=True))(
        window_batch()),
    "defaults, (1, T, W) indices": defaults_and_3d_indices,
    "float8 cache, fp32 scales": float8_cache_fp32_scales,
    "int32 ids and lengths": lambda: run(window_batch(index_dtype=torch.int32,
                                                      lens_dtype=torch.int32)),
    "extra source": lambda: run(extra_batch(), return_lse=True),
    "empty_token_lse=+inf": lambda: run(window_batch(), return_lse=True,
                                        empty_token_lse=float("inf")),
    "empty_token_lse=+inf, out= lse=": lambda: (lambda b: run(
        b, out=out_buffer(b), lse=torch.empty(5, 4), return_lse=True,
        empty_token_lse=float("inf")))(window_batch()),
    "strided": strided,
    "zero tokens": lambda: run(make_batch(T=0, H=4, D=64, W=16), return_lse=True),
    "drop-in": lambda: drop_in(window_batch()),
    "drop-in, longer rows": lambda: (lambda b: drop_in(b, *longer_rows(b)))(window_batch()),
}


@pytest.mark.parametrize("case", list(RESULT_CASES))
def test_same_output_bits_on_both_paths(monkeypatch, op_calls, case):
    eager = as_tuple(RESULT_CASES[case]())
    assert op_calls == [], "the eager call went through the custom ops"
    with through_the_ops(monkeypatch):
        ops = as_tuple(RESULT_CASES[case]())
    assert op_calls, "the forced call made no custom-op call"
    assert len(eager) == len(ops)
    for e, o in zip(eager, ops):
        assert e.shape == o.shape and e.dtype == o.dtype and e.stride() == o.stride()
        assert torch.equal(e, o)


# ---- the outputs an eager call allocates ------------------------------------------------------

# Calls whose outputs the eager path allocates, each returning them as a tuple; "out= allocates
# lse" allocates only lse.
NEW_OUTPUT_CASES = {
    "drop-in": lambda b: (drop_in(b, *longer_rows(b)),),
    "functional": lambda b: (run(b),),
    "return_lse": lambda b: run(b, return_lse=True),
    "out= allocates lse": lambda b: run(b, out=out_buffer(b), return_lse=True)[1:],
}


@pytest.mark.parametrize("case", list(NEW_OUTPUT_CASES))
def test_each_call_returns_new_outputs(op_calls, case):
    """Two calls on one batch: equal values in separate, plain, contiguous tensors that nothing
    else holds (writing one leaves the other alone), and no custom-op call. Plain as torch.empty's:
    a resizable storage (a tensor over a DLPack import, which is what torch's DLPack exchange
    allocator returns, is not; docs/perf-notes.md, "Eager Python call")."""
    b = window_batch(sink=None)
    first, second = NEW_OUTPUT_CASES[case](b), NEW_OUTPUT_CASES[case](b)
    assert op_calls == []
    for a, c in zip(first, second):
        assert type(a) is torch.Tensor and a.is_contiguous() and not a.requires_grad
        assert a.device == b.q.device and a.untyped_storage().resizable()
        assert a.data_ptr() != c.data_ptr() and torch.equal(a, c)
        a.fill_(float("nan"))
        assert not torch.isnan(c).any()


def test_an_output_torch_cannot_allocate_raises_its_error_on_both_paths(monkeypatch):
    """q, indices and lens broadcast over 2^40 tokens (stride 0): out would take 512 TiB, and
    torch's error is the same on both paths. window_size past the index columns keeps the call
    from running where memory is overcommitted (both paths then raise that ValueError instead)."""
    b = window_batch(sink=None)
    rows = 2 ** 40
    q = b.q[:1].expand(rows, -1, -1)
    indices, lens = b.indices[:1].expand(rows, -1), b.lens[:1].expand(rows)
    eager, ops = on_both_paths(monkeypatch, lambda: swa_decode.native_swa_decode_attention(
        q, b.kv_cache, b.inv_scale, indices, lens, b.block_size, 0.125, b.indices.shape[1] + 1))
    assert isinstance(ops, (RuntimeError, ValueError)), ops
    assert type(eager) is type(ops) and str(eager) == str(ops), (eager, ops)


def test_drop_in_with_longer_rows_matches_reference():
    b = window_batch(sink=None)  # the drop-in has no sink
    assert_bf16_rounding_of(drop_in(b, *longer_rows(b)), reference(b, scale=0.125)[0])


# ---- every bad argument of test_errors.py, on both paths ---------------------------------------

def error_batch(extra=False):
    """test_errors.py's fixtures b and bx."""
    return make_batch(T=3, H=4, D=64, W=16, poison=False, extra=dict(W=16) if extra else None)


def error_calls():
    calls = {}
    for case, check in test_errors.CASES.items():
        calls[case] = lambda o=check.overrides: test_errors.call(error_batch(), **o)
    for source, names in test_errors.SOURCES.items():
        tables = (test_errors.SOURCE_CASES, test_errors.NATIVE_SOURCE_CASES)
        for case, spec in [(c, s) for table in tables for c, s in table.items()]:
            calls[f"{source}: {case}"] = lambda n=names, o=spec[-1], x=source == "extra": (
                test_errors.call_source(error_batch(x), n, **o))
    for case, given in test_errors.PARTIAL_EXTRA.items():
        for out in (False, True):
            calls[f"partial extra: {case}{', out=' if out else ''}"] = lambda g=given, out=out: (
                lambda b: test_errors.call(
                    b, **test_errors.partial_extra(b, g),
                    **({"out": torch.empty_like(b.q)} if out else {})))(error_batch(True))
    for case, (_, _, overrides) in test_errors.DROP_IN_CASES.items():
        calls[f"drop-in: {case}"] = lambda o=overrides: (
            lambda b: test_errors.drop_in(b, **o(b)))(error_batch())
    return calls


ERROR_CALLS = error_calls()


@pytest.mark.parametrize("case", list(ERROR_CALLS))
def test_same_error_on_both_paths(monkeypatch, case):
    eager, ops = on_both_paths(monkeypatch, ERROR_CALLS[case])
    assert isinstance(ops, (TypeError, ValueError)), f"the ops' path did not raise: {ops!r}"
    assert type(eager) is type(ops) and str(eager) == str(ops), (eager, ops)


# ---- what only the ops may see ----------------------------------------------------------------

@pytest.mark.parametrize("with_lse", [False, True])
def test_out_and_lse_versions_bumped_once_as_by_the_op(monkeypatch, with_lse):
    b = window_batch()
    out, lse = torch.empty_like(b.q), torch.empty(5, 4) if with_lse else None

    def version_deltas():
        before = [t._version for t in (out, lse) if t is not None]
        run(b, out=out, lse=lse, return_lse=with_lse)
        return [t._version - v for t, v in zip((out, lse), before)]

    eager, ops = on_both_paths(monkeypatch, version_deltas)
    assert eager == ops == [1] * (2 if with_lse else 1)


def call_on(q, kv, scale, idx, lens):
    return swa_decode.decode(q, kv, scale, idx, lens, block_size=16)


def test_traces_record_the_custom_op(op_calls):
    b = window_batch()
    args = (b.q, b.kv_cache, b.inv_scale, b.indices, b.lens)
    graph = make_fx(call_on)(*args)  # real tensors under a dispatch mode
    assert "swa_decode.decode" in graph.code and op_calls == ["decode_op"]
    make_fx(call_on, tracing_mode="fake")(*args)
    traced = torch.jit.trace(call_on, args, check_trace=False)
    assert "swa_decode::decode" in str(traced.graph)
    assert op_calls == ["decode_op"] * 3


def test_vmap_takes_the_custom_op(op_calls):
    b = window_batch()
    qs = torch.stack([b.q, b.q.flip(0)])
    batched = torch.vmap(lambda q: call_on(q, b.kv_cache, b.inv_scale, b.indices, b.lens))(qs)
    assert op_calls == ["decode_op"]
    assert torch.equal(batched, torch.stack([call_on(q, b.kv_cache, b.inv_scale, b.indices,
                                                     b.lens) for q in qs]))


def test_inputs_that_require_grad_keep_the_op_in_the_autograd_graph(op_calls):
    """With grad enabled, the functional op's output carries a grad_fn that refuses backward; an
    eager output without one would let backward treat the op as a constant."""
    b = window_batch()
    sink = torch.nn.Parameter(b.attn_sink.clone())
    with torch.no_grad():
        expected = run(b, attn_sink=sink)
    assert op_calls == []  # a Parameter is read like any tensor
    out = run(b, attn_sink=sink)
    assert op_calls == ["decode_op"] and out.grad_fn is not None and torch.equal(out, expected)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        out.float().sum().backward()
    run(b, attn_sink=sink, out=torch.empty_like(b.q))  # no output of its own: nothing to tie
    assert op_calls == ["decode_op"]


def test_without_the_exchange_api_the_ops_take_capsules(monkeypatch, op_calls):
    """torch without __dlpack_c_exchange_api__: the binding refuses, the ops hand over DLPack
    capsules instead, and the output is the same."""
    b = extra_batch()
    expected = run(b, return_lse=True)
    monkeypatch.setattr(swa_decode._C, "decode_exchange", lambda *args: False)
    got = run(b, return_lse=True)
    assert op_calls == ["decode_op"]
    assert all(torch.equal(g, e) for g, e in zip(got, expected))


def test_the_exchange_api_is_read_from_its_older_name_too():
    """torch 2.10 may offer the table's address as an int in __c_dlpack_exchange_api__ (the name
    before dlpack.h 1.3 settled on a capsule); a type without either is refused."""
    address = ctypes.pythonapi.PyCapsule_GetPointer
    address.restype, address.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]

    class OlderName(torch.Tensor):
        __dlpack_c_exchange_api__ = None
        __c_dlpack_exchange_api__ = address(torch.Tensor.__dlpack_c_exchange_api__,
                                            b"dlpack_exchange_api")

    class NoApi(torch.Tensor):
        __dlpack_c_exchange_api__ = None

    b = window_batch()
    for cls, accepted in ((OlderName, True), (NoApi, False)):
        out = torch.full_like(b.q, float("nan"))
        args = [t.as_subclass(cls) for t in (b.q, b.kv_cache, b.inv_scale, b.indices, b.lens)]
        ran = swa_decode._C.decode_exchange(*args, None, out.as_subclass(cls), None, 16, None,
                                            None, None, None, None, None, None, None)
        assert ran == accepted and torch.isnan(out).any() != accepted


def test_torch_compile_traces_the_drop_in_with_longer_rows():
    b = window_batch(sink=None)
    indices, lens = longer_rows(b)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(q, kv, scale, idx, lens):
        return swa_decode.native_swa_decode_attention(q, kv, scale, idx, lens, 16, 0.125, 16) * 2

    out = step(b.q, b.kv_cache, b.inv_scale, indices, lens)
    assert_bf16_rounding_of(out / 2, reference(b, scale=0.125)[0])
