"""Where the cost of the masked kernel paths goes: one shape (bf16, batch 2, 8k, 16 heads, d128),
the forward timed with the same inputs under each option that changes the path taken.

    python benchmarks/masked_path_cost.py [--bias]

- segment ids, all zero: every tile through the masked loop of the plain kernel, nothing hidden;
- softcap + segment ids: the masked loop of the SCORE_MOD 1 kernel;
- dropout 1e-4 and 0.1: SCORE_MOD 2 with the keep-mask in every tile (the two p cost the same);
- --bias: a zero bias [1, heads, s, s], SCORE_MOD 2 with every tile masked.
Times are triton.testing.do_bench medians, the ratio is over the plain run.
"""

import argparse

import torch
from triton.testing import do_bench

import fattn


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bias", action="store_true", help="also time a zero bias (1 GiB at 8k)")
    args = parser.parse_args()
    torch.manual_seed(0)
    b, s, h, d = 2, 8192, 16, 128
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    seg = torch.zeros(b, s, device="cuda", dtype=torch.int32)
    cases = {
        "plain": lambda: fattn.flash_attn_func(q, k, v),
        "softcap": lambda: fattn.flash_attn_func(q, k, v, softcap=30.0),
        "segments (every tile masked, plain kernel)":
            lambda: fattn.flash_attn_func(q, k, v, q_segment_ids=seg, kv_segment_ids=seg),
        "softcap + segments (masked SCORE_MOD)":
            lambda: fattn.flash_attn_func(q, k, v, softcap=30.0, q_segment_ids=seg, kv_segment_ids=seg),
        "dropout 1e-4": lambda: fattn.flash_attn_func(q, k, v, 1e-4),
        "dropout 0.1": lambda: fattn.flash_attn_func(q, k, v, 0.1),
    }
    if args.bias:
        bias = torch.zeros(1, h, s, s, device="cuda", dtype=torch.bfloat16)
        cases["bias zeros [1, h, s, s]"] = lambda: fattn.flash_attn_func(q, k, v, bias=bias)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16 [{b}, {s}, {h}, {d}], forward")
    base = None
    for name, fn in cases.items():
        ms = do_bench(fn, warmup=50, rep=300)
        base = base or ms
        print(f"{name:44s} {ms:7.3f} ms  {ms / base:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
