"""Times swa_decode.native_swa_decode_attention (the drop-in) against the seed's PyTorch fallback.

    python python/bench_vs_seed.py [--tokens 1 128 512] [--heads 128] [--json FILE]

DeepSeek-V4 shape: H = 128, D = 512, W = 128, block_size = 256, fp8 cache, bf16 (slots, 1) scales,
int64 indices; each token has its own context length in [1, 8192] and the window is its last
min(len, 128) positions, spread over two random blocks of the pool, -1 padded.

Times are medians of CUDA-event intervals. The drop-in is timed both eagerly (one Python call per
step, what a plain engine loop pays) and as a CUDA-graph replay (what an engine with graphs pays).
The seed's fallback cannot be captured (its boolean-mask assignment synchronizes with the host), so
it is timed eagerly only, as the seed runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess

import torch

import swa_decode
from swa_decode.limits import GPU_HEAD_DIM


# ---- The seed's fallback: `_fallback_batched_sdp` from the seed's swa_decode_kernel.py
# (shared/seed/seed_swa_decode_kernel.txt), copied verbatim but for comments. It is the baseline
# this package replaces, and the tests compare the drop-in to it. ----
def seed_fallback_batched_sdp(q, swa_kv_cache, swa_inv_scale, swa_indices, swa_lens,
                              block_size, scale, window_size):
    num_tokens, NH, HD = q.shape
    device = q.device

    if swa_indices.dim() == 3:
        swa_indices = swa_indices.squeeze(0)

    safe_indices = swa_indices[:num_tokens].clamp(min=0)
    block_indices = safe_indices // block_size
    offsets = safe_indices % block_size

    kv_raw = swa_kv_cache[block_indices, offsets]
    if swa_kv_cache.dtype == torch.uint8:
        kv_raw = kv_raw.view(torch.float8_e4m3fn)
    inv_scales = swa_inv_scale[safe_indices]
    kv_bf16 = (kv_raw.to(torch.bfloat16) * inv_scales).to(torch.bfloat16)

    pos_range = torch.arange(window_size, device=device).unsqueeze(0)
    len_mask = pos_range >= swa_lens[:num_tokens].unsqueeze(1)
    invalid_mask = swa_indices[:num_tokens] < 0
    attn_mask = len_mask | invalid_mask
    float_mask = torch.zeros(attn_mask.shape, dtype=torch.bfloat16, device=device)
    float_mask[attn_mask] = float('-inf')

    q_t = q.permute(1, 0, 2)
    q_batch = q_t.reshape(NH * num_tokens, 1, HD)
    kv_expanded = kv_bf16.unsqueeze(0).expand(NH, num_tokens, window_size, HD)
    k_batch = kv_expanded.reshape(NH * num_tokens, window_size, HD)
    v_batch = k_batch

    mask_batch = float_mask.unsqueeze(0).unsqueeze(2).expand(
        NH, num_tokens, 1, window_size
    ).reshape(NH * num_tokens, 1, window_size)

    out = torch.nn.functional.scaled_dot_product_attention(
        q_batch, k_batch, v_batch,
        attn_mask=mask_batch,
        is_causal=False,
        scale=scale,
    )

    return out.reshape(NH, num_tokens, HD).permute(1, 0, 2)
# ---- end of the seed's code ----


def make_inputs(T: int, H: int, D: int = GPU_HEAD_DIM, W: int = 128, block_size: int = 256,
                seed: int = 0, device: str = "cuda"):
    """A realistic decode batch: per-token context lengths, windows over random pool blocks."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = 2 * T + 64
    q = (torch.randn(T, H, D, generator=g) * 0.5).to(torch.bfloat16)
    kv = (torch.randn(num_blocks, block_size, D, generator=g) * 2).to(torch.float8_e4m3fn)
    inv_scale = (torch.rand(num_blocks * block_size, 1, generator=g) * 0.9 + 0.1).to(torch.bfloat16)
    lens_ctx = torch.randint(1, 8193, (T,), generator=g)
    w = torch.clamp(lens_ctx, max=W)
    indices = torch.full((T, W), -1, dtype=torch.int64)
    for t in range(T):
        blocks = torch.randperm(num_blocks, generator=g)[:2]  # the window spans <= 2 blocks
        first = int(lens_ctx[t] - w[t])
        pos = torch.arange(first, int(lens_ctx[t]))
        block = torch.where(pos // block_size == first // block_size, blocks[0], blocks[1])
        indices[t, : int(w[t])] = block * block_size + pos % block_size
    to = dict(device=device)
    return (q.to(**to), kv.view(torch.uint8).to(**to), inv_scale.to(**to), indices.to(**to),
            w.to(torch.int64).to(**to), block_size, D ** -0.5, W)


def median_us(fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)


def graph_of(fn):
    """fn captured in a CUDA graph (after a warm-up on a side stream, as torch recommends)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def source_commit() -> str:
    """The tree's commit: $SWA_DECODE_COMMIT where the tree has no .git (the device copy), else git."""
    if os.environ.get("SWA_DECODE_COMMIT"):
        return os.environ["SWA_DECODE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 128, 512])
    parser.add_argument("--heads", type=int, default=128)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_vs_seed.py needs a CUDA device")

    rows = []
    print(f"device: {torch.cuda.get_device_name()}  H={args.heads} D={GPU_HEAD_DIM} W=128 "
          "block_size=256")
    print(f"{'T':>5} {'seed eager us':>14} {'drop-in eager us':>17} {'drop-in graph us':>17} "
          f"{'speedup (graph)':>16} {'rel L2 vs seed':>15}")
    for T in args.tokens:
        inputs = make_inputs(T, args.heads)
        drop_in = lambda: swa_decode.native_swa_decode_attention(*inputs)  # noqa: E731
        seed = lambda: seed_fallback_batched_sdp(*inputs)  # noqa: E731
        ref = seed().float()
        got = drop_in().float()
        rel_l2 = ((got - ref).norm() / ref.norm()).item()
        seed_us = median_us(seed, max(5, args.iters // 5))
        eager_us = median_us(drop_in, args.iters)
        graph_us = median_us(graph_of(drop_in), args.iters)
        rows.append(dict(T=T, H=args.heads, W=128, seed_us=seed_us, dropin_eager_us=eager_us,
                         dropin_graph_us=graph_us, speedup_graph=seed_us / graph_us,
                         rel_l2_vs_seed=rel_l2))
        print(f"{T:>5} {seed_us:>14.1f} {eager_us:>17.1f} {graph_us:>17.1f} "
              f"{seed_us / graph_us:>15.1f}x {rel_l2:>15.2e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "commit": source_commit(), "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
