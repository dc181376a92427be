"""Every op's sample calls (tests/helpers/samples.py: ragged lengths, head dims inside a bucket,
GQA, paged caches, appends, varlen, windows, softcap, ALiBi, sinks, bias, dropout) on the GPU,
in bf16 and fp16, and a chunked-prefill call with rotary: the workload that
test_hardening_gpu.py runs under compute-sanitizer. Prints one line per op with its call count."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import fattn  # noqa: E402
from helpers import OPS, SAMPLE_INPUTS  # noqa: E402


def main():
    torch.manual_seed(0)
    for name, samples in SAMPLE_INPUTS.items():
        calls = 0
        for dtype in (torch.bfloat16, torch.float16):
            for sample in samples("cuda", dtype):
                OPS[name](*sample.args)
                calls += 1
        torch.cuda.synchronize()
        print(f"{name}: {calls} calls", flush=True)
    # The wide (chunked-prefill) tile with rotary, left padding and a paged cache.
    q = torch.randn(2, 40, 8, 80, dtype=torch.bfloat16, device="cuda")
    pages = torch.randn(12, 16, 2, 80, dtype=torch.bfloat16, device="cuda")
    table = torch.randperm(12, device="cuda")[:10].view(2, 5).int()
    k = torch.randn(2, 40, 2, 80, dtype=torch.bfloat16, device="cuda")
    angles = torch.rand(80, 16, device="cuda")
    fattn.flash_attn_with_kvcache(q, pages, pages.clone(), k, torch.randn_like(k), angles.cos().bfloat16(),
                                  angles.sin().bfloat16(), torch.tensor([3, 37], dtype=torch.int32, device="cuda"),
                                  None, torch.tensor([0, 5], dtype=torch.int32, device="cuda"), table, causal=True)
    torch.cuda.synchronize()
    print("decode (wide tile, rotary, paged): 1 call", flush=True)


if __name__ == "__main__":
    main()
