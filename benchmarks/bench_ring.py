"""Ring attention throughput per GPU against the single-GPU kernel, under torchrun.

    torchrun --nproc-per-node=4 benchmarks/bench_ring.py --out benchmarks/results/ring_h200x4.json
    torchrun --nproc-per-node=4 benchmarks/bench_ring.py --windows=-1,4096   # full causal and a 4k window
    torchrun --nproc-per-node=2 benchmarks/bench_ring.py --device cpu --quick   # gloo smoke run

Forward + backward, causal, bf16: each GPU holds --tokens tokens of a sequence of world x
--tokens; --windows adds sliding windows (left size, right edge 0), run over contiguous shards
(zigzag for full causal; --sharding overrides), so that the ring sends K/V only as far as the
window reaches (fattn.ring.ring_schedule). Rows per window (results schema of common.py, written
by rank 0):

  fattn_ring             fattn.ring_flash_attn_func over the whole sequence
  fattn_single_gpu       fattn.flash_attn_func at --tokens tokens on one GPU (the same kernels,
                         the same per-GPU sequence length), timed in the same run
  context_parallel_sdpa  PyTorch's context parallel SDPA on the same sizes, where available

tflops is per GPU: the FLOPs of the visible (query, key) pairs of the sequence (forward + 2.5x
for the backward) divided by the world size; context parallel SDPA runs full causal only. The ring's row carries efficiency_vs_single_gpu (its TFLOP/s
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


def visible_pairs(seqlen, window_left):
    """(query, key) pairs a causal mask with a left window (-1: none) leaves visible."""
    if window_left < 0 or window_left >= seqlen:
        return seqlen * (seqlen + 1) // 2
    return seqlen * (window_left + 1) - window_left * (window_left + 1) // 2


def flops(batch, heads, seqlen, head_dim, window_left=-1):
    return 3.5 * 4 * batch * heads * visible_pairs(seqlen, window_left) * head_dim  # fwd 4*d a pair, bwd 2.5x


def start_group(device):
    """(rank, world, dtype) after joining torchrun's process group: NCCL and the local GPU with
    bf16 on CUDA, gloo with float32 (its collectives') on a CPU."""
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    return dist.get_rank(), dist.get_world_size(), torch.bfloat16 if device == "cuda" else torch.float32


def end_group():
    dist.barrier()  # no rank tears its group down while another still uses it (rank 0 writes, prints)
    dist.destroy_process_group()


def leave():
    """Exit now, all output written and flushed. After a clean destroy_process_group, gloo's worker
    threads can still abort the interpreter's finalization ("terminate called without an active
    exception", SIGABRT), rarely and under load, and torchrun then reports the rank as failed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
    parser.add_argument("--windows", default="-1", help="left window sizes, comma-separated; -1: full causal")
    parser.add_argument("--sharding", choices=["zigzag", "contiguous"], default=None,
                        help="default: zigzag for full causal, contiguous for windows")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: gloo, float32")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (results schema of common.py)")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.heads, args.head_dim = 64, 2, 16
    args.windows = [int(w) for w in args.windows.split(",")]
    return args


def main(argv=None):
    args = parse_args(argv)
    device = args.device
    rank, world, dtype = start_group(device)
    b, h, d, n = args.batch, args.heads, args.head_dim, args.tokens
    q, k, v = (torch.randn(b, n, h, d, device=device, dtype=dtype) for _ in range(3))
    dout = torch.randn_like(q)

    results = Results.start("ring", args, device)
    summary = []
    for left in args.windows:
        window = (left, 0) if left >= 0 else (-1, -1)
        sharding = args.sharding or ("contiguous" if left >= 0 else "zigzag")
        case = {"world": world, "tokens_per_gpu": n, "heads": h, "head_dim": d, "batch": b, "causal": True,
                "window_left": left, "sharding": sharding, "dtype": str(dtype).removeprefix("torch."),
                "hops": list(fattn.ring.ring_schedule(world, n, True, sharding, window))}
        ring = fwd_bwd(lambda q, k, v: fattn.ring_flash_attn_func(q, k, v, causal=True, window_size=window,
                                                                  sharding=sharding), q, k, v, dout)
        single = fwd_bwd(lambda q, k, v: fattn.flash_attn_func(q, k, v, causal=True, window_size=window),
                         q, k, v, dout)
        ring_row = results.add(case, "fattn_ring", timed(ring, device), flops=flops(b, h, n * world, d, left) / world)
        single_row = results.add(case, "fattn_single_gpu", timed(single, device), flops=flops(b, h, n, d, left))
        ring_row["efficiency_vs_single_gpu"] = ring_row["tflops"] / single_row["tflops"]
        summary.append(f"window {left}: {ring_row['efficiency_vs_single_gpu']:.2f}")
        if device == "cuda" and left < 0:  # context parallel SDPA needs CUDA; a rank that fails would hang the others
            try:
                cp_ms, error = timed(context_parallel_sdpa(b, h, n, d, world, device, dtype), device), None
            except Exception as e:  # noqa: BLE001  (a torch without it: report, don't hide)
                cp_ms, error = None, short_error(e, 300)
            results.add(case, "context_parallel_sdpa", cp_ms, error, flops=flops(b, h, n * world, d) / world)
            results.compare(case, peers=["context_parallel_sdpa"], ours=["fattn_ring"])
    if rank == 0:
        results.write(args.out)
        print_table(["impl", "window", "sharding", "hops", "ms", "TFLOP/s per GPU", "error"],
                    [[r["impl"], r["window_left"], r["sharding"], r["hops"], r["ms"], r["tflops"], r["error"]]
                     for r in results.rows],
                    title=f"ring attention, {world} ranks x {n} tokens, causal fwd+bwd; ring efficiency vs one GPU: "
                          + ", ".join(summary))
    end_group()


if __name__ == "__main__":
    main()
    leave()
