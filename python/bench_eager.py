"""Host time of one eager Python call (no CUDA graph) of swa_decode's two entry points.

    python3 -P python/bench_eager.py [--heads 128 64] [--tokens 1 8] [--calls 2000] [--json FILE]
    python3 -P python/bench_eager.py --device cpu      # the host cost alone, T = 0 (no GPU)

(-P: python/, holding the source package without its extension, must not shadow the installed one.)

What an engine pays per layer per step when it runs attention outside a captured graph: the time
the Python caller waits from calling until it can issue its next op. Each call is timed with
perf_counter_ns; the GPU work it enqueues is not waited for, and torch.cuda.synchronize() runs every
--sync-every calls, outside the timed intervals, so the launch queue never fills (a full queue
would make a launch wait for the GPU and count kernel time as host time). The row is the median
over --calls calls after a warm-up, with Python's garbage collector off.

Inputs are python/bench_vs_seed.py's DeepSeek-V4 batch (D = 512, W = 128, block_size = 256, uint8
cache, (slots, 1) bf16 scales, int64 indices (T, W) and lens), the drop-in's own convention. Rows:

- decode: swa_decode.decode(q, kv_cache, inv_scale, indices, lens, block_size=, scale=, out=)
- native_swa_decode_attention: the drop-in, which returns a new out (one allocation per call)
- torch.ops.swa_decode.decode_out: the custom op with out=, what the call costs where it is
  traced (torch.compile, make_fx), i.e. with the dispatcher
- _C.decode_exchange: the binding alone (reads the tensors through the DLPack C exchange API,
  checks, swa_decode::decode with its launch)
- flash_mla.flash_mla_with_kvcache: FlashMLA's entry point as vLLM and SGLang call it (q (T, 1, H,
  D), indices (T, 1, W) int32, topk_length (T,) int32, out=) over the same slots in a MODEL1 cache
  (the batch's rows re-laid in blocks of 64 with FlashMLA's padded stride), so its row is the
  entry point's cost over decode's: the lse it allocates, the reshapes where a call is traced
- flash_mla.flash_mla_with_kvcache (new out): the same without out=, which then allocates out too

On the CPU only T = 0 is timed: the float64 reference then does no work, so the row is the host
cost of the call alone (the layers of docs/perf-notes.md, "Eager Python call").
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import pathlib
import statistics
import sys
import time

import torch

import swa_decode
from swa_decode import _C
from swa_decode import flash_mla


def load_bench_vs_seed():
    """python/bench_vs_seed.py (make_inputs, source_commit), by path: see the -P note above."""
    path = pathlib.Path(__file__).resolve().parent / "bench_vs_seed.py"
    spec = importlib.util.spec_from_file_location("bench_vs_seed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def host_us(fn, calls: int, sync_every: int, sync, warmup: int = 200) -> float:
    """Median host time of one fn() call, in microseconds."""
    for _ in range(warmup):
        fn()
    sync()
    clock = time.perf_counter_ns
    times = []
    gc.disable()
    try:
        for i in range(calls):
            if i % sync_every == 0:
                sync()
            start = clock()
            fn()
            times.append(clock() - start)
    finally:
        gc.enable()
    sync()
    return statistics.median(times) / 1e3


MODEL1_BLOCK = 64                   # the engines' SWA cache: 64 tokens a block
MODEL1_ROW, MODEL1_SCALE_ROW, MODEL1_NOPE = 576, 8, 448


def model1_cache(kv_cache):
    """The seed cache's slots as FlashMLA's MODEL1 k_cache (num_blocks, 64, 1, 584) uint8 over
    blocks padded to a multiple of 576 bytes: dims 0..447 keep their e4m3 bytes under scales 2^0,
    dims 448..511 become bf16 (exact); the slot numbering (block * B + offset) is unchanged, so the
    batch's indices name the same rows. Unused bytes are 0xFF (NaN as e4m3, bf16 and UE8M0)."""
    codes = kv_cache.reshape(-1, MODEL1_BLOCK, kv_cache.shape[-1])  # (num_blocks, 64, 512) uint8
    num_blocks, row_bytes = codes.shape[0], MODEL1_ROW + MODEL1_SCALE_ROW
    stride = -(-MODEL1_BLOCK * row_bytes // MODEL1_ROW) * MODEL1_ROW
    blocks = torch.full((num_blocks, stride), 0xFF, dtype=torch.uint8, device=kv_cache.device)
    rows = blocks[:, :MODEL1_BLOCK * MODEL1_ROW].view(num_blocks, MODEL1_BLOCK, MODEL1_ROW)
    rows[:, :, :MODEL1_NOPE] = codes[:, :, :MODEL1_NOPE]
    rope = codes[:, :, MODEL1_NOPE:].view(torch.float8_e4m3fn).to(torch.bfloat16)
    rows[:, :, MODEL1_NOPE:] = rope.view(torch.uint8)
    footer = blocks[:, MODEL1_BLOCK * MODEL1_ROW:MODEL1_BLOCK * row_bytes]
    footer.view(num_blocks, MODEL1_BLOCK, MODEL1_SCALE_ROW)[:, :, :MODEL1_SCALE_ROW - 1] = 127
    return blocks.view(-1).as_strided((num_blocks, MODEL1_BLOCK, 1, row_bytes),
                                      (stride, row_bytes, row_bytes, 1))


def entry_points(inputs):
    """The output buffer, the timed calls on one batch by entry name, and per entry the call whose
    output it must match (the drop-in's, or for flash_mla decode's over its MODEL1 cache). Each
    writes that buffer, but the drop-in, which returns a new one."""
    q, kv_cache, inv_scale, indices, lens, block_size, scale, window_size = inputs
    out = torch.empty_like(q)
    T, H, D = q.shape
    k_cache = model1_cache(kv_cache)
    indices32, lens32 = indices.to(torch.int32), lens.to(torch.int32)  # the engines' dtypes
    # The engines' shapes, made once: a call is timed from tensors as an engine holds them.
    q4, out4 = q.view(T, 1, H, D), out.view(T, 1, H, D)
    indices4 = indices32.view(T, 1, indices.shape[1])
    metadata, num_splits = flash_mla.get_mla_metadata()
    drop_in = lambda: swa_decode.native_swa_decode_attention(*inputs)  # noqa: E731
    decode_model1 = lambda: swa_decode.decode(  # noqa: E731
        q, k_cache[:, :, 0], None, indices32, lens32, block_size=MODEL1_BLOCK, scale=scale,
        window_size=window_size, kv_format="model1")
    references = {FLASH_MLA: decode_model1, FLASH_MLA_NEW_OUT: decode_model1}
    return out, references, drop_in, {
        "decode": lambda: swa_decode.decode(q, kv_cache, inv_scale, indices, lens,
                                            block_size=block_size, scale=scale,
                                            window_size=window_size, out=out),
        "native_swa_decode_attention": lambda: swa_decode.native_swa_decode_attention(*inputs),
        "torch.ops.swa_decode.decode_out": lambda: torch.ops.swa_decode.decode_out(
            q, kv_cache, inv_scale, indices, lens, None, out, None, block_size, scale,
            window_size),
        "_C.decode_exchange": lambda: _C.decode_exchange(
            q, kv_cache, inv_scale, indices, lens, None, out, None, block_size, scale,
            window_size, None, None, None, None, None, None),
        FLASH_MLA: lambda: flash_mla.flash_mla_with_kvcache(
            q4, k_cache, None, None, D, metadata, num_splits, softmax_scale=scale,
            is_fp8_kvcache=True, indices=indices4, topk_length=lens32, out=out4),
        FLASH_MLA_NEW_OUT: lambda: flash_mla.flash_mla_with_kvcache(
            q4, k_cache, None, None, D, metadata, num_splits, softmax_scale=scale,
            is_fp8_kvcache=True, indices=indices4, topk_length=lens32),
    }


# The entry as vLLM and SGLang call it with out= (what a captured step reuses), and without it
# (the call then allocates out as well as lse).
FLASH_MLA = "flash_mla.flash_mla_with_kvcache"
FLASH_MLA_NEW_OUT = "flash_mla.flash_mla_with_kvcache (new out)"


def check_entries(out, references, drop_in, calls, sync) -> None:
    """The rows time working calls: every entry gives its reference's output (the drop-in's
    unless `references` names another), and the binding takes the tensors in place (False would
    mean every eager call goes through the custom ops)."""
    expected_by_drop_in = drop_in()
    for name, call in calls.items():
        if name == "native_swa_decode_attention":
            continue
        reference = references[name]() if name in references else expected_by_drop_in
        out.fill_(float("nan"))
        returned = call()
        sync()
        if name == "_C.decode_exchange" and not returned:
            raise SystemExit("the binding refused the tensors (no DLPack exchange API in this "
                             f"torch {torch.__version__}?): eager calls take the custom ops")
        written = returned[0].view_as(out) if name == FLASH_MLA_NEW_OUT else out
        # Not bitwise: a kernel may combine partial results in another order on another call.
        error = (written.float() - reference.float()).norm() / reference.float().norm()
        if reference.numel() and not error <= 1e-3:
            raise SystemExit(f"{name} and its reference disagree (rel L2 {error})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--heads", type=int, nargs="+", default=[128, 64])
    parser.add_argument("--tokens", type=int, nargs="+", default=None,
                        help="T per row (default 1 8 on CUDA; the CPU times T = 0 only)")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--sync-every", type=int, default=50)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    on_cuda = args.device == "cuda"
    if on_cuda and not torch.cuda.is_available():
        print("bench_eager.py: no CUDA device; nothing timed (--device cpu times the host cost "
              "at T = 0)")
        return 0
    tokens = args.tokens or ([1, 8] if on_cuda else [0])
    if not on_cuda and tokens != [0]:
        parser.error("--device cpu times T = 0 only (the float64 reference is seconds per call)")
    bench = load_bench_vs_seed()
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    device_name = torch.cuda.get_device_name() if on_cuda else "cpu"

    rows = []
    print(f"device: {device_name}  torch {torch.__version__}  D = 512, W = 128, block_size = 256, "
          f"median of {args.calls} calls")
    print(f"{'entry':<44} {'H':>4} {'T':>4} {'host us':>8}")
    for H in args.heads:
        for T in tokens:
            inputs = bench.make_inputs(T, H, device=args.device)
            out, references, drop_in, calls = entry_points(inputs)
            check_entries(out, references, drop_in, calls, sync)
            for entry, fn in calls.items():
                us = host_us(fn, args.calls, args.sync_every, sync)
                rows.append(dict(entry=entry, T=T, H=H, host_us=round(us, 3)))
                print(f"{entry:<44} {H:>4} {T:>4} {us:>8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device_name, "torch": torch.__version__,
                       "commit": bench.source_commit(), "calls": args.calls,
                       "sync_every": args.sync_every, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
