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


def entry_points(inputs):
    """The output buffer and the timed calls on one batch, by entry name; each writes that buffer,
    but the drop-in, which returns a new one."""
    q, kv_cache, inv_scale, indices, lens, block_size, scale, window_size = inputs
    out = torch.empty_like(q)
    return out, {
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
    }


def check_entries(out, calls, sync) -> None:
    """The rows time working calls: every entry gives the drop-in's output, and the binding takes
    the tensors in place (False would mean every eager call goes through the custom ops)."""
    reference = calls["native_swa_decode_attention"]()
    for name in ("decode", "torch.ops.swa_decode.decode_out", "_C.decode_exchange"):
        out.fill_(float("nan"))
        returned = calls[name]()
        sync()
        if name == "_C.decode_exchange" and not returned:
            raise SystemExit("the binding refused the tensors (no DLPack exchange API in this "
                             f"torch {torch.__version__}?): eager calls take the custom ops")
        # Not bitwise: a kernel may combine partial results in another order on another call.
        error = (out.float() - reference.float()).norm() / reference.float().norm()
        if reference.numel() and not error <= 1e-3:
            raise SystemExit(f"{name} and native_swa_decode_attention disagree (rel L2 {error})")


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
    print(f"{'entry':<34} {'H':>4} {'T':>4} {'host us':>8}")
    for H in args.heads:
        for T in tokens:
            inputs = bench.make_inputs(T, H, device=args.device)
            out, calls = entry_points(inputs)
            check_entries(out, calls, sync)
            for entry, fn in calls.items():
                us = host_us(fn, args.calls, args.sync_every, sync)
                rows.append(dict(entry=entry, T=T, H=H, host_us=round(us, 3)))
                print(f"{entry:<34} {H:>4} {T:>4} {us:>8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device_name, "torch": torch.__version__,
                       "commit": bench.source_commit(), "calls": args.calls,
                       "sync_every": args.sync_every, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
