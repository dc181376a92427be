"""One rank of the GPU context-parallel check; run by tests/test_context_parallel_gpu.py through
torchrun, one process per GPU, over NCCL.

Every rank builds the same bf16 problem: packed documents of odd and mixed lengths (an empty one,
one shorter than the world), 8 query heads over 2 KV heads (split at world 2, replicated at world
4), head dim 128. It runs the packed ring, the packed and dense all-to-all (Ulysses) and, at world
4, their product on its shard, and checks out, lse and every gradient (dsinks summed over the
ranks) against float64 attention of each document with the 2x rule: error <= 2 x the error of
PyTorch's own bf16 attention + 1e-5 (lse: 1e-3). Then torch.compile (fullgraph: a graph break
raises) and a CUDA graph that captures a whole step, replayed on new data.
"""

import os
import sys
import traceback

import torch
import torch.distributed as dist

import fattn
from fattn.reference import attention_reference
from fattn.ring import shard

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 128
LENGTHS = [700, 0, 1, 1537, 3, 913, 64, 2]
# (causal, window_size, softcap, sinks, alibi): windows shorter and longer than a rank's chunks,
# one- and two-sided; per-document ALiBi slopes.
VARIANTS = [(False, (-1, -1), 0.0, False, False), (True, (-1, -1), 0.0, False, False),
            (True, (300, -1), 0.0, True, False), (False, (100, 400), 30.0, False, False),
            (True, (-1, -1), 0.0, False, True), (False, (100, 400), 30.0, True, True)]


def cu_of(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def problem(shape_q, shape_kv, shape_lse, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(*shape_q, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(*shape_kv, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    w_out = torch.randn(*shape_q, device="cuda", dtype=torch.float64, generator=g)
    w_lse = torch.randn(*shape_lse, device="cuda", dtype=torch.float64, generator=g)
    return q, k, v, w_out, w_lse


def variant_args(variant, slopes_rows):
    causal, window, softcap, with_sinks, with_alibi = variant
    sinks = torch.linspace(-1.0, 1.5, HEADS, device="cuda") if with_sinks else None
    slopes = (torch.linspace(0.01, 0.1, slopes_rows * HEADS, device="cuda").reshape(slopes_rows, HEADS)
              if with_alibi else None)
    return dict(causal=causal, window_size=window, softcap=softcap, sinks=sinks, alibi_slopes=slopes)


def packed_reference(q, k, v, cu, dtype, causal, window_size, softcap, sinks, alibi_slopes):
    """Attention of every document on its own in `dtype`: out [total, heads, d], lse [heads, total]."""
    outs, lses = [], []
    for d, (a, b) in enumerate(zip(cu, cu[1:])):
        if a == b:
            continue
        slopes = None if alibi_slopes is None else alibi_slopes[d]
        out, lse = attention_reference(q[None, a:b], k[None, a:b], v[None, a:b], None, causal, dtype=dtype,
                                       window_size=window_size, softcap=softcap, sinks=sinks, alibi_slopes=slopes)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def with_grads(fn, inputs, sinks, w_out, w_lse):
    """fn's out and lse, and the gradients of sum(out * w_out) + sum(lse * w_lse) for the inputs
    (and the sinks)."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    sinks = None if sinks is None else sinks.detach().clone().requires_grad_()
    out, lse = fn(*leaves, sinks)
    loss = (out.double() * w_out).sum() + (lse.double() * w_lse).sum()
    grads = torch.autograd.grad(loss, leaves + ([sinks] if sinks is not None else []))
    return [out, lse, *grads]


class Checker:
    def __init__(self, rank, world):
        self.rank, self.world, self.failures = rank, world, []

    def compare(self, what, got, ref, low, sharded):
        """got (this rank's parts) against the float64 and bf16 references (whole, cut by `sharded`)."""
        names = ("out", "lse", "dq", "dk", "dv", "dsinks")
        for name, g, r, lo in zip(names, got, ref, low):
            if name == "dsinks":  # this rank's share; summed, the whole
                g = g.clone()
                dist.all_reduce(g)
            else:
                r, lo = sharded(r, name), sharded(lo, name)
            r, lo, g = r.double(), lo.double(), g.double()
            finite = torch.isfinite(r)
            err = (g - r)[finite].abs().max().item() if finite.any() else 0.0
            base = (lo - r)[finite].abs().max().item() if finite.any() else 0.0
            bound = 1e-3 if name == "lse" else 2 * base + 1e-5
            ok = err <= bound and torch.equal(torch.isfinite(g), finite)
            if not ok:
                self.failures.append(f"{what} {name}: error {err:.3e} > {bound:.3e} (or non-finite where the "
                                     f"reference is finite)")
            if self.rank == 0:
                print(f"world {self.world} {what} {name}: err {err:.2e} (torch bf16 {base:.2e}) "
                      f"{'ok' if ok else 'FAIL'}", flush=True)

    def run(self, what, check, *args):
        try:
            check(self, *args)
        except Exception:  # noqa: BLE001  (report every check's failure, not the first)
            self.failures.append(f"{what}: {traceback.format_exc()}")


def check_packed(c, attention, variants, part=None, groups=None, label=""):
    """`attention` (a packed context-parallel function) against each document's attention."""
    cu = cu_of(LENGTHS)
    total = cu[-1]
    q, k, v, w_out, w_lse = problem((total, HEADS, HEAD_DIM), (total, KV_HEADS, HEAD_DIM), (HEADS, total), 11)
    part = part or (lambda t, dim=0: fattn.shard_varlen(t, cu, c.world, c.rank, dim))
    groups = groups or {}
    cu_host = torch.tensor(cu, dtype=torch.int32)
    for variant in variants:
        args = variant_args(variant, len(LENGTHS))
        sinks = args.pop("sinks")

        def reference(dtype):
            return lambda q, k, v, s: packed_reference(q, k, v, cu, dtype, sinks=s, **args)

        ref = with_grads(reference(torch.float64), [q.double(), k.double(), v.double()], sinks, w_out, w_lse)
        low = with_grads(reference(torch.bfloat16), [q, k, v], sinks, w_out, w_lse)
        got = with_grads(lambda q, k, v, s: attention(q, k, v, cu_host, return_lse=True, sinks=s, **groups, **args),
                         [part(q), part(k), part(v)], sinks, part(w_out), part(w_lse, 1))
        c.compare(f"{attention.__name__}{label} {variant}", got, ref, low,
                  lambda t, name: part(t, 1 if name == "lse" else 0))


def check_dense(c, variants, part=None, groups=None, label=""):
    """ulysses_flash_attn_func over zigzag and contiguous shards against attention of the whole sequence."""
    b, n = 2, 384 * c.world
    q, k, v, w_out, w_lse = problem((b, n, HEADS, HEAD_DIM), (b, n, KV_HEADS, HEAD_DIM), (b, HEADS, n), 12)
    groups = groups or {}
    for variant in variants:
        args = variant_args(variant, b)
        sinks = args.pop("sinks")
        causal = args.pop("causal")

        def reference(dtype):
            return lambda q, k, v, s: attention_reference(q, k, v, None, causal, dtype=dtype, sinks=s, **args)

        ref = with_grads(reference(torch.float64), [q.double(), k.double(), v.double()], sinks, w_out, w_lse)
        low = with_grads(reference(torch.bfloat16), [q, k, v], sinks, w_out, w_lse)
        for sharding in ("zigzag", "contiguous"):
            sh = part or (lambda t, s, dim=1: shard(t, c.world, c.rank, s, dim))
            got = with_grads(lambda q, k, v, s: fattn.ulysses_flash_attn_func(
                q, k, v, causal=causal, return_lse=True, sharding=sharding, sinks=s, **groups, **args),
                [sh(q, sharding), sh(k, sharding), sh(v, sharding)], sinks, sh(w_out, sharding), sh(w_lse, sharding, 2))
            c.compare(f"ulysses_flash_attn_func{label} {sharding} {variant}", got, ref, low,
                      lambda t, name: sh(t, sharding, 2 if name == "lse" else 1))


def check_product(c):
    """The all-to-all over pairs of consecutive ranks, the ring across the pairs (world 4)."""
    pairs, ring_world = 2, c.world // 2
    ring_rank, pair_rank = divmod(c.rank, pairs)
    pair_groups = [dist.new_group([r * pairs + u for u in range(pairs)]) for r in range(ring_world)]
    ring_groups = [dist.new_group([r * pairs + u for r in range(ring_world)]) for u in range(pairs)]
    groups = dict(group=pair_groups[ring_rank], ring_group=ring_groups[pair_rank])
    cu = cu_of(LENGTHS)

    def dense_part(t, sharding, dim=1):
        return shard(t, ring_world, ring_rank, sharding, dim).tensor_split(pairs, dim)[pair_rank]

    def packed_part(t, dim=0):
        return fattn.shard_varlen(t, cu, ring_world, ring_rank, dim).tensor_split(pairs, dim)[pair_rank]

    variants = [VARIANTS[2], VARIANTS[5]]
    check_dense(c, variants, dense_part, groups, " x ring")
    check_packed(c, fattn.ulysses_flash_attn_varlen_func, variants, packed_part, groups, " x ring")


def _cases(c):
    """(name, function of local q, k, v, local inputs) for compile and capture: the dense and
    packed rings and the packed all-to-all, causal with a window and sinks."""
    cu = cu_of(LENGTHS)
    total = cu[-1]
    cu_host = torch.tensor(cu, dtype=torch.int32)
    sinks = torch.linspace(-1.0, 1.0, HEADS, device="cuda")
    options = dict(causal=True, window_size=(300, -1), sinks=sinks, deterministic=True)
    packed = problem((total, HEADS, HEAD_DIM), (total, KV_HEADS, HEAD_DIM), (1,), 13)[:3]
    local = [fattn.shard_varlen(t, cu, c.world, c.rank) for t in packed]
    n = 384 * c.world
    dense = problem((2, n, HEADS, HEAD_DIM), (2, n, KV_HEADS, HEAD_DIM), (1,), 14)[:3]
    return [("ring_flash_attn_func", lambda q, k, v: fattn.ring_flash_attn_func(q, k, v, **options),
             [shard(t, c.world, c.rank) for t in dense]),
            ("ring_flash_attn_varlen_func", lambda q, k, v: fattn.ring_flash_attn_varlen_func(
                q, k, v, cu_host, **options), local),
            # A list: the all-to-all reads the offsets on the host, so under torch.compile they
            # are constants of the graph (the ring's op takes them as a tensor input)
            ("ulysses_flash_attn_varlen_func", lambda q, k, v: fattn.ulysses_flash_attn_varlen_func(
                q, k, v, cu, **options), local)]


def step(fn, leaves, dout):
    out = fn(*leaves)
    out.backward(dout)
    return out


def close(c, what, got, want):
    # The same kernels in deterministic mode on the same data: equal up to the rounding of a
    # different schedule of the merges (the compiled graph may fuse them).
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        err = (g.double() - w.double()).abs().max().item()
        scale = w.double().abs().max().item()
        if not err <= 1e-2 * scale:
            c.failures.append(f"{what} {name}: differs from eager by {err:.3e} (scale {scale:.3e})")


def check_compiled(c):
    for name, fn, local in _cases(c):
        dout = torch.randn_like(local[0])
        results = []
        for f in (fn, torch.compile(fn, fullgraph=True)):
            leaves = [t.clone().requires_grad_() for t in local]
            out = step(f, leaves, dout)
            results.append([out] + [t.grad for t in leaves])
        close(c, f"compiled {name}", results[1], results[0])


def check_graph_capture(c):
    # A whole step (forward and backward) captured once, then replayed on new data copied into
    # its inputs: the replay computes what an eager step computes on that data.
    for name, fn, local in _cases(c):
        leaves = [t.clone().requires_grad_() for t in local]
        dout = torch.randn_like(local[0])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: communicators, plans and constants made before the capture
            for _ in range(2):
                for t in leaves:
                    t.grad = None
                step(fn, leaves, dout)
        torch.cuda.current_stream().wait_stream(side)
        for t in leaves:
            t.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step(fn, leaves, dout)
        fresh = [torch.randn_like(t) for t in local]
        with torch.no_grad():
            for t, f in zip(leaves, fresh):
                t.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
        captured = [out.clone()] + [t.grad.clone() for t in leaves]
        eager_leaves = [f.clone().requires_grad_() for f in fresh]
        eager = [step(fn, eager_leaves, dout)] + [t.grad for t in eager_leaves]
        close(c, f"graph-captured {name}", captured, eager)


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    c = Checker(rank, world)
    c.run("packed ring", check_packed, fattn.ring_flash_attn_varlen_func, VARIANTS)
    c.run("packed all-to-all", check_packed, fattn.ulysses_flash_attn_varlen_func, VARIANTS)
    c.run("dense all-to-all", check_dense, [VARIANTS[i] for i in (1, 2, 5)])
    if world == 4:
        c.run("all-to-all x ring", check_product)
    c.run("torch.compile", check_compiled)
    c.run("CUDA graph capture", check_graph_capture)
    dist.barrier()
    dist.destroy_process_group()
    if c.failures:
        print(f"rank {rank} FAILURES:", *c.failures, sep="\n  ", flush=True)
        sys.exit(1)
    print(f"rank {rank}: all context-parallel checks passed", flush=True)


if __name__ == "__main__":
    main()
