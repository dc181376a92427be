"""Ring attention over the processes of a group: each rank holds a zigzag shard of one long
sequence, and fattn.ring_flash_attn_func gives its shard of exact causal attention (with the
backward) while K/V blocks travel the ring.

    torchrun --nproc-per-node 2 examples/ring_attention.py          # CPU: gloo
    torchrun --nproc-per-node 4 examples/ring_attention.py --cuda   # GPUs: NCCL, one per rank

Every rank checks its shard of out and of the gradients against attention of the whole sequence
computed alone.
"""

import argparse
import os

import torch
import torch.distributed as dist

import fattn
from fattn import ring


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--tokens-per-rank", type=int, default=64)
    args = parser.parse_args(argv)
    if args.cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if args.cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device, dtype = ("cuda", torch.bfloat16) if args.cuda else ("cpu", torch.float32)
    torch.manual_seed(0)  # every rank builds the same sequence
    seqlen = args.tokens_per_rank * world
    q, k, v = (torch.randn(1, seqlen, h, 64, device=device, dtype=dtype) for h in (8, 2, 2))

    shards = [ring.shard(t, world, rank).detach().requires_grad_() for t in (q, k, v)]
    out = fattn.ring_flash_attn_func(*shards, causal=True)
    out.float().square().sum().backward()

    whole = [t.detach().requires_grad_() for t in (q, k, v)]
    want = fattn.flash_attn_func(*whole, causal=True)
    want.float().square().sum().backward()
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    for name, got, ref in zip(("out", "dq", "dk", "dv"), (out, *(s.grad for s in shards)),
                              (ring.shard(want, world, rank), *(ring.shard(t.grad, world, rank) for t in whole))):
        error = (got.float() - ref.float()).abs().max().item()
        assert error <= tolerance, f"rank {rank}: {name} differs by {error:.2e}"
    print(f"rank {rank}/{world}: {args.tokens_per_rank} of {seqlen} tokens, out and gradients match")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
