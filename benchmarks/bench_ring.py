"""Ring attention throughput per GPU against the single-GPU kernel, under torchrun.

    torchrun --nproc-per-node=4 benchmarks/bench_ring.py --out benchmarks/results/ring_h200x4.json
    torchrun --nproc-per-node=2 benchmarks/bench_ring.py --device cpu --quick   # gloo smoke run

Forward + backward, causal, bf16, zigzag: each GPU holds --tokens tokens of a sequence
of world x --tokens. Rows (results schema of common.py, written by rank 0):

  fattn_ring             fattn.ring_flash_attn_func over the whole sequence
  fattn_single_gpu       fattn.flash_attn_func at --tokens tokens on one GPU (the same kernels,
                         the same per-GPU sequence length), timed in the same run
  context_parallel_sdpa  PyTorch's context parallel SDPA on the same sizes, where available

tflops is per GPU: the causal FLOPs of the sequence (forward + 2.5x for the backward)
divided by the world size. The ring's row carries efficiency_vs_single_gpu (its TFLOP/s
over the single-GPU row's) and ratio_vs against context parallel SDPA (time ratio).
Each rep starts after a barrier; the slowest rank's median counts.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Results, print_table, short_error, time_ms  # noqa: E402

import fattn  # noqa: E402


def causal_flops(batch, heads, seqlen, head_dim):
    return 3.5 * 2 * batch * heads * seqlen * seqlen * head_dim  # (fwd 4*s^2*d / 2) * (1 + 2.5)


def timed(fn, device):
    """The slowest rank's median ms of fn(); every rank runs it."""
    ms = time_ms(fn, warmup=2, reps=5, device=device, before_rep=dist.barrier)
    t = torch.tensor([ms], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def fwd_bwd(fn, q, k, v, dout):
    def run():
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        fn(qq, kk, vv).backward(dout)
    return run


def context_parallel_sdpa(b, h, n, d, world, device, dtype):
    """fwd + bwd of SDPA under torch's context parallel, on the full sequence sharded over the ranks."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh(device, (world,))
    full = [torch.randn(b, h, n * world, d, device=device, dtype=dtype) for _ in range(3)]

    def run():
        with context_parallel(mesh, buffers=full, buffer_seq_dims=[2, 2, 2]):
            qq, kk, vv = (t.detach().requires_grad_() for t in full)
            out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
            out.backward(torch.ones_like(out))
    return run


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32768, help="tokens per GPU")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: gloo, float32")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (results schema of common.py)")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.heads, args.head_dim = 64, 2, 16
    return args


def main(argv=None):
    args = parse_args(argv)
    device = args.device
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    b, h, d, n = args.batch, args.heads, args.head_dim, args.tokens
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # gloo's collectives: float32
    q, k, v = (torch.randn(b, n, h, d, device=device, dtype=dtype) for _ in range(3))
    dout = torch.randn_like(q)

    results = Results.start("ring", args, device)
    case = {"world": world, "tokens_per_gpu": n, "heads": h, "head_dim": d, "batch": b, "causal": True,
            "sharding": "zigzag", "dtype": str(dtype).removeprefix("torch.")}
    ring = fwd_bwd(lambda q, k, v: fattn.ring_flash_attn_func(q, k, v, causal=True), q, k, v, dout)
    single = fwd_bwd(lambda q, k, v: fattn.flash_attn_func(q, k, v, causal=True), q, k, v, dout)
    ring_row = results.add(case, "fattn_ring", timed(ring, device), flops=causal_flops(b, h, n * world, d) / world)
    single_row = results.add(case, "fattn_single_gpu", timed(single, device), flops=causal_flops(b, h, n, d))
    ring_row["efficiency_vs_single_gpu"] = ring_row["tflops"] / single_row["tflops"]
    if device == "cuda":  # context parallel SDPA needs CUDA; a rank that fails would hang the others
        try:
            cp_ms, error = timed(context_parallel_sdpa(b, h, n, d, world, device, dtype), device), None
        except Exception as e:  # noqa: BLE001  (a torch without it: report, don't hide)
            cp_ms, error = None, short_error(e, 300)
        results.add(case, "context_parallel_sdpa", cp_ms, error, flops=causal_flops(b, h, n * world, d) / world)
    results.compare(case, peers=["context_parallel_sdpa"], ours=["fattn_ring"])
    if rank == 0:
        results.write(args.out)
        print_table(["impl", "ms", "TFLOP/s per GPU", "error"],
                    [[r["impl"], r["ms"], r["tflops"], r["error"]] for r in results.rows],
                    title=f"ring attention, {world} ranks x {n} tokens, causal fwd+bwd; ring efficiency vs one GPU "
                          f"{ring_row['efficiency_vs_single_gpu']:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
