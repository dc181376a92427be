"""DRAM read rate of a [keys, heads, row_bytes] cache-like tensor (8 heads, rows of 128 bytes as an FP8
d128 cache's, 256 as a bf16 one's), read two ways with the same bytes and tiles: per head (each
program one head's rows, strided by heads * row_bytes, as the decode split kernel reads) and per
key range (each program all heads' rows, contiguous). A plain fp32 sum, Triton's JIT, 4 and 8
warps, CUDA-graph replays: it asks whether the access pattern or the warps in flight bound a
streaming read (docs/notes/decode.md D13).

    python benchmarks/read_rate_probe.py
"""

import torch
import triton
import triton.language as tl

@triton.jit
def per_head(X, Out, keys, heads: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr, CHUNK):
    h = tl.program_id(0)
    c = tl.program_id(1)
    offs_k = tl.arange(0, BLOCK)
    offs_r = tl.arange(0, ROW)
    acc = tl.zeros([BLOCK, ROW], tl.float32)
    for k0 in range(c * CHUNK, c * CHUNK + CHUNK, BLOCK):
        x = tl.load(X + ((k0 + offs_k)[:, None].to(tl.int64) * heads + h) * ROW + offs_r[None, :])
        acc += x.to(tl.float32)
    tl.store(Out + (h * tl.num_programs(1) + c), tl.sum(acc))


@triton.jit
def per_range(X, Out, keys, heads: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr, CHUNK):
    c = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    offs = tl.arange(0, BLOCK * ROW)
    acc = tl.zeros([BLOCK * ROW], tl.float32)
    span = CHUNK // heads  # same bytes per program as per_head
    for k0 in range(c * span, c * span + span, BLOCK // heads if BLOCK >= heads else 1):
        x = tl.load(X + k0.to(tl.int64) * heads * ROW + offs)
        acc += x.to(tl.float32)
    tl.store(Out + c, tl.sum(acc))



def graph_ms(fn):
    """Median ms per call over CUDA-graph replays of 10 calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    times = []
    for _ in range(10):
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 10)
    return sorted(times)[5]


WARPS_STAGES = [(4, 3), (8, 3), (4, 5), (4, 8)]


def main():
    keys, heads, chunks, block = 1 << 20, 8, 33, 128
    for row_bytes, name in [(128, "fp8 d128 (128 B rows)"), (256, "bf16 d128 (256 B rows)")]:
        x = torch.randint(0, 100, (keys, heads, row_bytes), dtype=torch.uint8, device="cuda")
        chunk = keys // chunks // block * block
        out = torch.empty(heads * chunks, device="cuda")
        used = heads * chunks * chunk * row_bytes
        for warps, stages in WARPS_STAGES:
            launch = dict(num_warps=warps, num_stages=stages)
            t1 = graph_ms(lambda: per_head[(heads, chunks)](x, out, keys, heads, row_bytes, block, chunk, **launch))
            t2 = graph_ms(lambda: per_range[(heads, chunks)](x, out, keys, heads, row_bytes, block, chunk, **launch))
            print(f"{name} warps {warps} stages {stages}: per head {used / t1 / 1e6:.0f} GB/s ({t1 * 1e3:.1f} us), "
                  f"per key range {used / t2 / 1e6:.0f} GB/s ({t2 * 1e3:.1f} us)")


if __name__ == "__main__":
    main()
