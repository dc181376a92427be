"""One rank of the GPU ring-attention check; run by tests/test_ring_gpu.py through torchrun.

Every rank builds the same full bf16 problem, runs ring attention on its zigzag or
contiguous shard, and checks out, lse and dq/dk/dv against a float64 reference with
the 2x rule (error <= 2 x the error of PyTorch's own bf16 attention + 1e-5), and the
number of point-to-point ops against the schedule's design.
"""

import os
import sys

import torch
import torch.distributed as dist

import fattn
from fattn import _ring_exchange, ring
from fattn.reference import attention_reference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers import designed_p2p_ops  # noqa: E402


def grads(fn, q, k, v, w_out, w_lse):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = fn(q, k, v)
    loss = (out.double() * w_out).sum() + (lse.double() * w_lse).sum()
    return (out, lse, *torch.autograd.grad(loss, (q, k, v)))


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    failures = []
    # (causal, window_size, softcap, sinks, alibi): chunks are 256 rows, so these windows cross shards;
    # ALiBi's distances are global ones (each piece has its alibi_offset).
    for causal, window, softcap, with_sinks, with_alibi in (
            (False, (-1, -1), 0.0, False, False), (True, (-1, -1), 0.0, False, False),
            (True, (300, -1), 0.0, True, False), (False, (100, 400), 30.0, False, False),
            (True, (-1, -1), 0.0, False, True), (False, (100, 400), 30.0, True, True)):
        for sharding in ("zigzag", "contiguous"):
            g = torch.Generator(device="cuda").manual_seed(1234)
            b, n, h, hk, d = 2, 512 * world, 8, 2, 128
            q = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
            k = torch.randn(b, n, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
            v = torch.randn(b, n, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
            w_out = torch.randn(b, n, h, d, device="cuda", dtype=torch.float64, generator=g)
            w_lse = torch.randn(b, h, n, device="cuda", dtype=torch.float64, generator=g)
            sinks = torch.randn(h, device="cuda", generator=g) if with_sinks else None
            slopes = torch.rand(h, device="cuda", generator=g) * 0.05 if with_alibi else None
            variant = dict(window_size=window, softcap=softcap, sinks=sinks, alibi_slopes=slopes)
            ref = grads(lambda q, k, v: attention_reference(q, k, v, None, causal, **variant), q.double(), k.double(),
                        v.double(), w_out, w_lse)
            low = grads(lambda q, k, v: attention_reference(q, k, v, None, causal, dtype=torch.bfloat16, **variant),
                        q, k, v, w_out, w_lse)
            sh = lambda t, dim=1: ring.shard(t, world, rank, sharding, dim)  # noqa: E731
            rings = []
            original = _ring_exchange.Ring.__init__

            def recording(self, group, _orig=original):
                _orig(self, group)
                rings.append(self)

            _ring_exchange.Ring.__init__ = recording
            got = grads(lambda q, k, v: fattn.ring_flash_attn_func(q, k, v, causal=causal, return_lse=True,
                                                                  sharding=sharding, **variant),
                        sh(q), sh(k), sh(v), sh(w_out), sh(w_lse, 2))
            _ring_exchange.Ring.__init__ = original
            posted = sum(r.p2p_ops for r in rings)  # the forward's ring and the backward's
            # The hops the window needs each way (fattn.ring.ring_schedule) and the traffic they are
            # designed to post.
            expected = designed_p2p_ops(*ring.ring_schedule(world, n // world, causal, sharding, window))
            what = f"{sharding} causal={causal} window={window} softcap={softcap} sinks={with_sinks} alibi={with_alibi}"
            if posted != expected:
                failures.append(f"{what}: {posted} P2P ops, designed {expected}")
            names = ("out", "lse", "dq", "dk", "dv")
            dims = (1, 2, 1, 1, 1)
            for name, dim, gv, rv, lv in zip(names, dims, got, ref, low):
                rv, lv = sh(rv, dim).double(), sh(lv, dim).double()
                finite = torch.isfinite(rv)
                err = (gv.double() - rv)[finite].abs().max().item()
                base = (lv - rv)[finite].abs().max().item()
                bound = 2 * base + 1e-5 if name != "lse" else 1e-3
                status = "ok" if err <= bound else "FAIL"
                print(f"rank {rank}/{world} {what} {name}: err {err:.2e} (torch bf16 {base:.2e}) {status}", flush=True)
                if status == "FAIL":
                    failures.append(f"{what} {name}: {err:.3e} > {bound:.3e}")
    dist.destroy_process_group()
    if failures:
        print(f"rank {rank} FAILURES:", *failures, sep="\n  ")
        sys.exit(1)
    print(f"rank {rank}: all ring checks passed")


if __name__ == "__main__":
    main()
