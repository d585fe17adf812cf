"""Tensor-parallel decode: the query heads split over GPUs, every GPU holding the same KV cache.

    torchrun --nproc-per-node N examples/tensor_parallel.py [--heads 128] [--tokens 128,2048]
             [--window 128] [--json FILE]
    torchrun --nproc-per-node 2 examples/tensor_parallel.py --device cpu --heads 8 --tokens 4
             # no GPU: the CPU backend and gloo, no graphs, the same flow

How an engine serving DeepSeek-V4 with tensor parallelism (128 query heads over 8 GPUs: 16 per GPU)
runs swa-decode. The sliding-window cache is one KV head (MQA), so every rank holds all of it; only
the query heads are split. One process per GPU, NCCL between them. For each T in --tokens, rank r:

1. builds the same paged cache, indices and lens as every rank (the same seed): T sequences, each
   attending to the last min(context, W) of its positions through its own blocks of 64 slots;
   every slot no index names holds e4m3 NaN and a NaN scale, so reading one shows up as NaN;
2. takes heads [r*H/N, (r+1)*H/N) of q and of the sink, as its column-parallel q projection would
   leave them (contiguous), and runs swa_decode.decode for them inside a CUDA graph (captured once,
   replayed; out= preallocated);
3. multiplies its output (T, H/N * D) by its rows of a row-parallel output projection (bf16,
   (H * D, --hidden)) and all-reduces the (T, hidden) partial sums, as the layer's o_proj would.

Rank 0 gathers every rank's output and checks it against a one-GPU run of all H heads on its own
GPU (with N = 1 that run is rank 0's own), with the GPU tests' tolerance (python/tests/test_gpu.py):
twice the error a plain bf16 pipeline (k and p rounded to bf16, fp32 sums) makes against the
one-GPU run on the same input, plus one bf16 ulp of the output's magnitude. Every rank checks the
all-reduced projection against the same sum in float64. Time is the median of --replays graph
replays (CUDA events) of one rank's decode (the projection and all-reduce are checked, not
timed), against the one-GPU time of all heads; the inputs
rotate over copies (same values, other addresses) whose total is at least twice the L2, so a replay
reads its cache from HBM as a decode step does. NCCL_NVLS_ENABLE defaults to 0 here (no NVLink
multicast: the device machines' rule, /work/.library/device/KINDS.md).

--device cpu runs swa_decode.decode on CPU tensors (the float64 reference, exact) with gloo, no
graphs, wall-clock medians: the whole flow without a GPU (python/tests/test_tensor_parallel.py).

Exit status: 0 every check passed, 1 a check failed, 2 bad arguments or no CUDA device for
--device cuda (torchrun then reports the workers' failure with its own status).
--json FILE (rank 0) writes rows {N, rank, H_per_gpu, T, us, one_gpu_us, max_err, tol} and, per T,
the projection's {T, max_err, tol}, with the device, torch version and commit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

import swa_decode
from swa_decode.limits import GPU_HEAD_DIM, MAX_GPU_HEADS

BLOCK_SIZE = 64          # the engines' SWA cache: 64 slots a block
SPARE_BLOCKS = 4         # blocks no sequence owns: poisoned, never read
MAX_COPIES = 64          # graphs captured per row: 64 cover twice a 60 MB L2 down to ~2 MB a call
E4M3_NAN = 0x7F
BF16_ULP = 2.0 ** -8     # one bf16 ulp relative to a value's binade top (8 significant bits)
EXIT_CHECK_FAILED, EXIT_USAGE = 1, 2


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--heads", type=int, default=128, help="H, all ranks together")
    parser.add_argument("--tokens", default="128,2048", help="T values, comma-separated")
    parser.add_argument("--window", type=int, default=128, help="W")
    parser.add_argument("--hidden", type=int, default=7168,
                        help="width of the output projection (DeepSeek-V3's model width)")
    parser.add_argument("--replays", type=int, default=None,
                        help="timed calls per row (default 500 graph replays; 3 calls on the CPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="rank 0 writes the rows here")
    args = parser.parse_args(argv)
    try:
        args.tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens must be comma-separated integers, got {args.tokens!r}")
    if min(args.tokens) < 1 or args.heads < 1 or args.window < 1 or args.hidden < 1:
        parser.error("--tokens, --heads, --window and --hidden must be positive")
    if args.device == "cuda" and args.heads > MAX_GPU_HEADS:
        parser.error(f"--heads: the one-GPU run of all heads takes at most {MAX_GPU_HEADS} on the "
                     f"GPU, got {args.heads}")
    if args.replays is None:
        args.replays = 500 if args.device == "cuda" else 3
    return parser, args


def make_batch(T: int, H: int, W: int, seed: int):
    """The decode batch every rank builds alike: q (T, H, D) bf16, the cache (num_blocks, 64, D)
    e4m3 bytes, one fp32 scale per slot, indices (T, W) int32 (-1 past the window), lens (T,) int32
    and a sink logit per head. Sequence t has a context of 1..8192 positions and attends to its
    last min(context, W); its positions live in ceil(W / 64) + 1 blocks of its own (a window
    spans at most that many), placed at random in the pool."""
    D = GPU_HEAD_DIM
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = -(-W // BLOCK_SIZE) + 1
    num_blocks = T * blocks_per_seq + SPARE_BLOCKS
    num_slots = num_blocks * BLOCK_SIZE
    q = (torch.randn(T, H, D, generator=g) * 0.5).to(torch.bfloat16)
    kv_cache = (torch.randn(num_blocks, BLOCK_SIZE, D, generator=g) * 2).to(
        torch.float8_e4m3fn).view(torch.uint8)
    inv_scale = torch.rand(num_slots, generator=g) * 0.9 + 0.1
    sink = torch.randn(H, generator=g)
    context = torch.randint(1, 8193, (T,), generator=g)
    lens = context.clamp(max=W)
    table = torch.randperm(num_blocks, generator=g)[:T * blocks_per_seq].view(T, blocks_per_seq)
    col = torch.arange(W)
    first = (context - lens).unsqueeze(1)                         # first position in the window
    pos = first + col
    table_col = (pos // BLOCK_SIZE - first // BLOCK_SIZE).clamp(max=blocks_per_seq - 1)
    slots = table.gather(1, table_col) * BLOCK_SIZE + pos % BLOCK_SIZE
    valid = col < lens.unsqueeze(1)
    indices = torch.where(valid, slots, -1)
    unused = torch.ones(num_slots, dtype=torch.bool)
    unused[indices[valid]] = False
    kv_cache.view(num_slots, D)[unused] = E4M3_NAN
    inv_scale[unused] = float("nan")
    return dict(q=q, kv_cache=kv_cache, inv_scale=inv_scale, indices=indices.to(torch.int32),
                lens=lens.to(torch.int32), sink=sink)


def head_range(rank: int, world: int, H: int) -> range:
    per_rank = H // world
    return range(rank * per_rank, (rank + 1) * per_rank)


def decode_calls(batch, heads: range, copies: int):
    """One decode call per copy of the batch (the cache and q of `heads` at new addresses, same
    values), each writing its own preallocated out; returns (outs, calls)."""
    outs, calls = [], []
    for _ in range(copies):
        q = batch["q"][:, heads.start:heads.stop].clone(memory_format=torch.contiguous_format)
        sink = batch["sink"][heads.start:heads.stop].clone()
        kv, scale, idx, lens = (batch[k].clone() for k in ("kv_cache", "inv_scale", "indices",
                                                            "lens"))
        out = torch.empty_like(q)
        outs.append(out)
        calls.append(lambda q=q, kv=kv, scale=scale, idx=idx, lens=lens, sink=sink, out=out:
                     swa_decode.decode(q, kv, scale, idx, lens, block_size=BLOCK_SIZE,
                                       attn_sink=sink, out=out))
    return outs, calls


def copies_beyond_l2(batch, heads: range, device: torch.device) -> int:
    """How many copies of what one call reads make at least twice the L2 (1 on the CPU), at most
    MAX_COPIES: a smaller call (T of a few tokens) then replays partly from L2."""
    if device.type != "cuda":
        return 1
    per_head = batch["q"][:, 0].nbytes
    read = sum(batch[k].nbytes for k in ("kv_cache", "inv_scale", "indices", "lens"))
    call_bytes = read + 2 * per_head * len(heads)                 # q in, out back
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return min(MAX_COPIES, max(1, -(-2 * l2 // call_bytes)))


def captured(calls):
    """Each call captured once in its own CUDA graph; returns the replays. The warm-up runs on a
    side stream, as torch asks; thread_local capture lets NCCL's watchdog thread query its events
    while this thread captures."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graphs = [torch.cuda.CUDAGraph() for _ in calls]
    for graph, call in zip(graphs, calls):
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            call()
    return [graph.replay for graph in graphs]


def median_us(calls, count: int, device: torch.device) -> float:
    """Median time of one call, in microseconds, cycling over `calls`. On CUDA: the calls are CUDA
    graphs, each between two events, all enqueued before one synchronize; the host enqueues a
    replay and its events in a few us, less than a replay runs (11 us and more in the README's
    table), so past the first few the GPU never waits for the host. On the CPU: wall clock."""
    if device.type != "cuda":
        times = []
        for i in range(count):
            start = time.perf_counter()
            calls[i % len(calls)]()
            times.append((time.perf_counter() - start) * 1e6)
        return statistics.median(times)
    replays = captured(calls)
    for replay in replays * 3:
        replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(count)]
    for i, (start, stop) in enumerate(events):
        start.record()
        replays[i % len(replays)]()
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(stop) * 1e3 for start, stop in events)


def bf16_pipeline(batch, chunk: int = 128):
    """The op at bf16 working precision, as in python/tests (conftest.bf16_baseline), with the
    sink in the softmax: k dequantized and rounded to bf16, p rounded to bf16, fp32 sums. Only for
    the tolerance. Chunks of `chunk` tokens bound the (chunk, W, D) fp32 keys it gathers."""
    q, indices, lens = batch["q"], batch["indices"].long(), batch["lens"].long()
    T, H, D = q.shape
    rows = batch["kv_cache"].view(-1, D)                  # uint8: indexed before the e4m3 view
    out = torch.empty(T, H, D, dtype=torch.float32, device=q.device)
    col = torch.arange(indices.shape[1], device=q.device)
    for t0 in range(0, T, chunk):
        idx, n = indices[t0:t0 + chunk], lens[t0:t0 + chunk]
        valid = ((col < n.unsqueeze(1)) & (idx >= 0)).unsqueeze(-1)    # (t, W, 1)
        slot = idx.clamp(min=0)
        k = rows[slot].view(torch.float8_e4m3fn).float() * batch["inv_scale"][slot].unsqueeze(-1)
        k = torch.where(valid, k.to(torch.bfloat16).float(), 0.0)     # poison must not leak
        s = D ** -0.5 * q[t0:t0 + chunk].float() @ k.transpose(1, 2)   # (t, H, W)
        s = s.masked_fill(~valid.transpose(1, 2), -torch.inf)
        sink = batch["sink"].view(1, H, 1).expand(s.shape[0], H, 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
        out[t0:t0 + chunk] = p.to(torch.bfloat16).float() @ k
    return out.to(torch.bfloat16).float()


def check_shard(out, reference, baseline):
    """(max_err, tol) of one rank's output against the one-GPU run of its heads: tol is twice the
    bf16 pipeline's error against that run plus one bf16 ulp of its magnitude (test_gpu.py's
    assert_close_to_reference). NaN anywhere gives max_err NaN, which fails the check."""
    out, reference = out.float(), reference.float()
    baseline_err = (baseline - reference).abs().max().item()
    tol = 2 * baseline_err + reference.abs().max().item() * BF16_ULP
    if not (torch.isfinite(out).all() and torch.isfinite(reference).all()):
        return float("nan"), tol
    return (out - reference).abs().max().item(), tol


def projection_rows(heads: range, H: int, hidden: int, seed: int, device):
    """This rank's rows of the row-parallel output projection (H * D, hidden), bf16: each head's
    (D, hidden) block from a generator seeded by the head, so every rank's rows are the full
    matrix's without any rank building it all. Scaled by 1/sqrt(H * D) so y stays O(out)."""
    D = GPU_HEAD_DIM
    blocks = [torch.randn(D, hidden, generator=torch.Generator().manual_seed(seed * 1_000_003 + h))
              for h in heads]
    return (torch.cat(blocks) * (H * D) ** -0.5).to(torch.bfloat16).to(device)


def check_projection(out, w_rows, world: int):
    """All-reduces this rank's bf16 partial out @ w_rows, as o_proj would, and checks it against
    the same sum in float64. Each of the N partials is rounded to bf16 once (fp32 accumulation)
    and the ring all-reduce rounds N - 1 running sums: 2N - 1 roundings, each at most half an ulp
    of its value, i.e. at most 2^-8 of it, and every value is at most S = sum over ranks of
    max|partial|; tol = 2N * 2^-8 * S leaves one rounding's worth for the fp32 sums."""
    flat = out.reshape(out.shape[0], -1)
    reduced = flat @ w_rows
    dist.all_reduce(reduced)
    partial = flat.double() @ w_rows.double()
    bound = partial.abs().max().reshape(1)
    dist.all_reduce(partial)
    dist.all_reduce(bound)
    tol = 2 * world * BF16_ULP * bound.item()
    err = (reduced.double() - partial).abs().max().reshape(1)
    dist.all_reduce(err, op=dist.ReduceOp.MAX)
    return err.item(), tol


def source_commit() -> str:
    if os.environ.get("SWA_DECODE_COMMIT"):
        return os.environ["SWA_DECODE_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def init_distributed(device_kind: str) -> torch.device:
    """One process per GPU under torchrun (NCCL; gloo for --device cpu); a plain `python` start is
    one rank of one."""
    backend = "nccl" if device_kind == "cuda" else "gloo"
    if device_kind == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    # Set before NCCL reads its environment: NVLink multicast stays off (KINDS.md).
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    device_id = device if device_kind == "cuda" else None
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend, device_id=device_id)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                device_id=device_id)
    return device


def run_tokens(T: int, args, device, w_rows) -> tuple[list, dict]:
    """Every step above for one T; returns rank 0's rows (empty elsewhere) and the projection's."""
    rank, world = dist.get_rank(), dist.get_world_size()
    H = args.heads
    heads = head_range(rank, world, H)
    batch = {k: v.to(device) for k, v in make_batch(T, H, args.window, args.seed).items()}

    outs, calls = decode_calls(batch, heads, copies_beyond_l2(batch, heads, device))
    dist.barrier()                                  # every rank times its shard at once
    us = median_us(calls, args.replays, device)
    shard = outs[0]

    gathered = [torch.empty_like(shard) for _ in range(world)] if rank == 0 else None
    dist.gather(shard, gathered, dst=0)
    times = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(world)]
    dist.all_gather(times, torch.tensor([us], dtype=torch.float64, device=device))

    rows = []
    if rank == 0:
        if world == 1:
            reference, one_gpu_us = shard, us
        else:
            all_heads = range(H)
            ref_outs, ref_calls = decode_calls(batch, all_heads,
                                               copies_beyond_l2(batch, all_heads, device))
            one_gpu_us = median_us(ref_calls, args.replays, device)
            reference = ref_outs[0]
        baseline = bf16_pipeline(batch)
        for r in range(world):
            hs = head_range(r, world, H)
            sl = slice(hs.start, hs.stop)
            max_err, tol = check_shard(gathered[r], reference[:, sl], baseline[:, sl])
            rows.append(dict(N=world, rank=r, H_per_gpu=len(hs), T=T, us=round(times[r].item(), 2),
                             one_gpu_us=round(one_gpu_us, 2), max_err=max_err, tol=tol))
    dist.barrier()                                  # the other ranks waited out the one-GPU run

    err, tol = check_projection(shard, w_rows, world)
    return rows, dict(T=T, max_err=err, tol=tol)


def passed(entry) -> bool:
    return entry["max_err"] <= entry["tol"]          # False for NaN


def main(argv=None) -> int:
    parser, args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("tensor_parallel.py: no CUDA device; run on GPUs, or with --device cpu for the CPU "
              "backend and gloo", file=sys.stderr)
        return EXIT_USAGE
    world = int(os.environ.get("WORLD_SIZE", 1))
    if args.device == "cuda" and world > torch.cuda.device_count():
        print(f"tensor_parallel.py: {world} processes need {world} GPUs, this machine has "
              f"{torch.cuda.device_count()}", file=sys.stderr)
        return EXIT_USAGE
    if args.heads % world:
        print(f"tensor_parallel.py: --heads ({args.heads}) must be a multiple of the number of "
              f"processes ({world})", file=sys.stderr)
        return EXIT_USAGE
    # The projection's tolerance counts one rounding per bf16 partial: keep cuBLAS's split-K sums
    # in fp32 (an engine may allow bf16 reductions; the check here would then need a wider bound).
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    device = init_distributed(args.device)
    rank, world = dist.get_rank(), dist.get_world_size()
    rows, projections = [], []
    try:
        w_rows = projection_rows(head_range(rank, world, args.heads), args.heads, args.hidden,
                                 args.seed, device)
        for T in args.tokens:
            t_rows, projection = run_tokens(T, args, device, w_rows)
            rows += t_rows
            projections.append(projection)
    finally:
        dist.destroy_process_group()
    if rank != 0:                                    # the projection's check is every rank's
        return 0 if all(passed(p) for p in projections) else EXIT_CHECK_FAILED

    device_name = torch.cuda.get_device_name(device) if args.device == "cuda" else "cpu"
    print(f"device: {device_name}  N = {world}, H = {args.heads}, D = {GPU_HEAD_DIM}, "
          f"W = {args.window}, block_size = {BLOCK_SIZE}, median of {args.replays} "
          f"{'graph replays' if args.device == 'cuda' else 'calls'}")
    print(f"{'N':>2} {'rank':>4} {'H/gpu':>5} {'T':>5} {'us':>9} {'one-GPU us':>10} "
          f"{'speedup':>7} {'max err':>9} {'tol':>9}  check")
    for row in rows:
        print(f"{row['N']:>2} {row['rank']:>4} {row['H_per_gpu']:>5} {row['T']:>5} "
              f"{row['us']:>9.2f} {row['one_gpu_us']:>10.2f} "
              f"{row['one_gpu_us'] / row['us']:>6.2f}x {row['max_err']:>9.3g} {row['tol']:>9.3g}  "
              f"{'ok' if passed(row) else 'FAILED'}")
    for p in projections:
        print(f"all-reduced projection, T = {p['T']}: max err {p['max_err']:.3g}, tol "
              f"{p['tol']:.3g}  {'ok' if passed(p) else 'FAILED'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device_name, "torch": torch.__version__,
                       "commit": source_commit(), "H": args.heads, "W": args.window,
                       "D": GPU_HEAD_DIM, "block_size": BLOCK_SIZE, "hidden": args.hidden,
                       "replays": args.replays, "rows": rows, "projection": projections},
                      f, indent=1)
    ok = all(passed(entry) for entry in rows + projections)
    if not ok:
        print("tensor_parallel.py: a check FAILED", file=sys.stderr)
    return 0 if ok else EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(main())
