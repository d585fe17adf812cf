"""examples/tensor_parallel.py, the tensor-parallel decode example: started by torchrun (as
`python -m torch.distributed.run`) on the CPU backend with gloo for N = 1 and 2 processes, on
CUDA for N = 1 and, where two GPUs exist, N = 2; its check itself on wrong heads and on a read of
a poisoned slot; and its message without CUDA.
"""

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest
import torch

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "tensor_parallel.py"


def load_example():
    spec = importlib.util.spec_from_file_location("tensor_parallel", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tp = load_example()


def run_example(tmp_path, nproc, *args, timeout):
    """The script under torchrun with `nproc` processes; returns its JSON after asserting exit 0."""
    result = tmp_path / f"tp_{nproc}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(SCRIPT), *args, "--json", str(result)]
    # One thread a process: two gloo ranks share CI's 2 cores.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(result.read_text())


def check_result(result, nproc, heads, tokens):
    """Every rank of every T reported once, within its tolerance, and the projection checked."""
    rows = result["rows"]
    assert sorted((r["T"], r["rank"]) for r in rows) == sorted(
        (T, rank) for T in tokens for rank in range(nproc))
    for r in rows:
        assert r["N"] == nproc and r["H_per_gpu"] == heads // nproc
        assert math.isfinite(r["max_err"]) and 0 < r["tol"], r
        assert r["max_err"] <= r["tol"], r
        assert r["us"] > 0 and r["one_gpu_us"] > 0, r
    assert sorted(p["T"] for p in result["projection"]) == sorted(tokens)
    for p in result["projection"]:
        assert math.isfinite(p["max_err"]) and p["max_err"] <= p["tol"], p
    return rows


@pytest.mark.parametrize("nproc", [1, 2])
def test_cpu_backend_with_gloo(tmp_path, nproc):
    heads, tokens = 8, [3, 9]
    result = run_example(tmp_path, nproc, "--device", "cpu", "--heads", str(heads), "--tokens",
                         ",".join(map(str, tokens)), "--window", "32", "--hidden", "64",
                         timeout=120)
    assert result["device"] == "cpu"
    # The CPU backend computes each head alone in float64: splitting the heads changes no bit.
    assert all(r["max_err"] == 0 for r in check_result(result, nproc, heads, tokens))


def run_heads(batch, heads: range):
    """The example's decode call for `heads` (one copy), run once; returns its output."""
    outs, calls = tp.decode_calls(batch, heads, copies=1)
    calls[0]()
    return outs[0]


def shard_and_reference(T=5, H=8, W=32):
    batch = tp.make_batch(T, H, W, seed=3)
    heads = tp.head_range(0, 2, H)
    shard, reference = run_heads(batch, heads), run_heads(batch, range(H))
    return batch, heads, shard, reference, tp.bf16_pipeline(batch)


def test_check_catches_wrong_heads():
    batch, heads, shard, reference, baseline = shard_and_reference()
    sl = slice(heads.start, heads.stop)
    err, tol = tp.check_shard(shard, reference[:, sl], baseline[:, sl])
    assert err <= tol
    shifted = slice(heads.start + 1, heads.stop + 1)            # the neighbour's heads
    err, tol = tp.check_shard(reference[:, shifted], reference[:, sl], baseline[:, sl])
    assert not err <= tol


def test_check_catches_a_read_of_a_poisoned_slot():
    T, H, W = 4, 8, 32
    batch = tp.make_batch(T, H, W, seed=5)
    num_slots = batch["inv_scale"].shape[0]
    named = torch.zeros(num_slots, dtype=torch.bool)
    for t in range(T):
        named[batch["indices"][t, :batch["lens"][t]].long()] = True
    assert batch["inv_scale"][~named].isnan().all() and batch["inv_scale"][named].isfinite().all()
    assert (batch["kv_cache"].view(num_slots, -1)[~named] == tp.E4M3_NAN).all()
    reference, baseline = run_heads(batch, range(H)), tp.bf16_pipeline(batch)
    batch["indices"][2, 0] = (~named).nonzero()[0, 0].item()   # an entry on a poisoned slot
    err, tol = tp.check_shard(run_heads(batch, range(H)), reference, baseline)
    assert not err <= tol


def test_bf16_pipeline_is_the_op_at_bf16():
    """The tolerance rests on it: close to the float64 op (a few bf16 ulps), not equal to it."""
    batch, _, _, reference, baseline = shard_and_reference()
    err = (baseline - reference.float()).abs().max().item()
    assert 0 < err <= 8 * tp.BF16_ULP * reference.float().abs().max().item()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_without_cuda_says_so_and_exits_2():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == tp.EXIT_USAGE
    assert "no CUDA device" in proc.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_one_gpu(tmp_path):
    heads, tokens = 128, [1, 128]
    result = run_example(tmp_path, 1, "--heads", str(heads), "--tokens", "1,128", "--hidden",
                         "1024", "--replays", "50", timeout=300)
    assert result["device"] == torch.cuda.get_device_name()
    rows = check_result(result, 1, heads, tokens)
    assert all(r["us"] == r["one_gpu_us"] and r["max_err"] == 0 for r in rows)


# H = 32: 16 heads a GPU run the portable kernel against the one-GPU run's sm90 kernel at T = 128
# (README, "Which kernel runs"); H = 128: 64 a GPU, both on the sm90 family.
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("heads", [32, 128])
def test_cuda_two_gpus(tmp_path, heads):
    tokens = [1, 128]
    result = run_example(tmp_path, 2, "--heads", str(heads), "--tokens", "1,128", "--hidden",
                         "1024", "--replays", "50", timeout=300)
    check_result(result, 2, heads, tokens)

