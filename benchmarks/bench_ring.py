"""Ring attention throughput per GPU against the single-GPU kernel, under torchrun.

    torchrun --nproc-per-node=4 benchmarks/bench_ring.py --out benchmarks/results/ring_h200x4.json

Forward + backward, causal, bf16, zigzag: each GPU holds --tokens tokens of a sequence
of world x --tokens. Per-GPU throughput counts the causal FLOPs of the whole sequence
(forward + 2.5x for the backward) divided by the world size; the single-GPU baseline
is fattn's own forward + backward, causal, at --tokens tokens on one GPU (the same
kernels, the same per-GPU sequence length), timed in the same run. PyTorch's context
parallel SDPA (torch.distributed.tensor.experimental.context_parallel) runs on the
same data when it is available.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment  # noqa: E402

import fattn  # noqa: E402
from fattn import ring  # noqa: E402


def causal_flops(batch, heads, seqlen, head_dim):
    return 3.5 * 2 * batch * heads * seqlen * seqlen * head_dim  # (fwd 4*s^2*d / 2) * (1 + 2.5)


def timed(fn, warmup=2, reps=5):
    """Median ms of fn() across ranks' barriers (every rank runs it)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        dist.barrier()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    t = torch.tensor([statistics.median(times)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    return t.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=32768, help="tokens per GPU")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    b, h, d, n = args.batch, args.heads, args.head_dim, args.tokens

    def fwd_bwd(fn, q, k, v):
        def run():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            out = fn(qq, kk, vv)
            out.backward(dout)
        return run

    q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn_like(q)
    ring_ms = timed(fwd_bwd(lambda q, k, v: fattn.ring_flash_attn_func(q, k, v, causal=True), q, k, v))
    single_ms = timed(fwd_bwd(lambda q, k, v: fattn.flash_attn_func(q, k, v, causal=True), q, k, v))
    ring_tflops = causal_flops(b, h, n * world, d) / world / ring_ms / 1e9
    single_tflops = causal_flops(b, h, n, d) / single_ms / 1e9
    result = {"world": world, "tokens_per_gpu": n, "heads": h, "head_dim": d, "batch": b,
              "ring_ms": ring_ms, "ring_tflops_per_gpu": ring_tflops,
              "single_gpu_ms": single_ms, "single_gpu_tflops": single_tflops,
              "ratio": ring_tflops / single_tflops}

    try:  # PyTorch's own context parallel SDPA on the same sizes
        import torch.nn.functional as F
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel

        mesh = init_device_mesh("cuda", (world,))
        full = [torch.randn(b, h, n * world, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]

        def cp_run():
            with context_parallel(mesh, buffers=full, buffer_seq_dims=[2, 2, 2]):
                qq, kk, vv = (t.detach().requires_grad_() for t in full)
                out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
                out.backward(torch.ones_like(out))

        cp_ms = timed(cp_run)
        result["context_parallel_sdpa_ms"] = cp_ms
        result["context_parallel_sdpa_tflops_per_gpu"] = causal_flops(b, h, n * world, d) / world / cp_ms / 1e9
    except Exception as e:  # report, don't hide
        result["context_parallel_sdpa_error"] = f"{type(e).__name__}: {str(e)[:300]}"

    if rank == 0:
        result["env"] = environment()
        print(json.dumps(result, indent=1))
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
