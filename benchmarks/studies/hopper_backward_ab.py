"""The Hopper dK/dV (triton_src/backward_sm90.py) against attn_bwd_dkdv (triton_src/backward.py)
on the same inputs, both through Triton's JIT (tuning/launch.py), interleaved: the
measurement behind configs.json's choice of where the Gluon kernel replaces attn_bwd_dkdv on sm_90
(the method of benchmarks/studies/hopper_forward_ab.py).

    python benchmarks/studies/hopper_backward_ab.py [--head-dims 64,128,256] [--out hopper_backward_ab.json]
    python benchmarks/studies/hopper_backward_ab.py --head-dims 128 --softcap 30 --block-n 64   # the wide form at d128
    python benchmarks/studies/hopper_backward_ab.py --dq --head-dims 64,128   # dQ in the dK/dV pass, or split
    python benchmarks/studies/hopper_backward_ab.py --dq --head-dims 128 --alibi   # the same with ALiBi slopes
    python benchmarks/studies/hopper_backward_ab.py --dq-kernel --head-dims 128   # the Hopper dQ kernel

With --dq, the other choice configs.json makes: deterministic=False's dQ accumulated inside
attn_bwd_dkdv_sm90 (ACCUMULATE_DQ, one launch; the grid's tile for it, or --block-n) against the
split path the grid builds without it (its dK/dV kernel, attn_bwd_dkdv_sm90 or attn_bwd_dkdv, then
its dQ kernel, attn_bwd_dq_sm90 or attn_bwd_dq), the accumulator's zeroing and conversion included
as the op does them; TFLOP/s then count all five products (dQ, dK, dV).

With --dq-kernel, the split path's second half: attn_bwd_dq_sm90 (triton_src/backward_dq_sm90.py;
the grid's tile, or 128 x 64 where the grid builds none) against attn_bwd_dq; TFLOP/s count dQ's
three products.

Shapes: bf16, hidden 2048, 16k tokens, each seqlen causal and not; lse and delta from the
forward. Both kernels run with the tiles the grid builds for this GPU (aot_build/tuned/sm90.json
or configs.json for attn_bwd_dkdv, the configs.json "implementations" entry for
attn_bwd_dkdv_sm90); where the grid builds no attn_bwd_dkdv_sm90 for the bucket and score
modification, --block-n picks the form (128: two warpgroups of 64 keys, up to d128; 64: the
wide-head form). TFLOP/s count dK/dV's four products. The two alternate --pairs times, each
sample the median of 10 timed calls; the figure is the median over the samples. Needs a Hopper
GPU (the Gluon kernel is sm_90a code).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


from aot_build import grid  # noqa: E402
from common import alibi_slopes, interleaved_ms, write_ab_rows  # noqa: E402
from triton_src.backward import ATTN_BWD_DKDV, ATTN_BWD_DQ  # noqa: E402
from triton_src.backward_dq_sm90 import ATTN_BWD_DQ_SM90  # noqa: E402
from triton_src.backward_sm90 import ATTN_BWD_DKDV_SM90  # noqa: E402
import tuning.launch as launch  # noqa: E402
from tuning.tune import Problem, current_config  # noqa: E402


def _grid_variants(bucket: int, score_mod: int, accumulate_dq: bool) -> list:
    return [v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": str(bucket)})
            if v.kernel == "attn_bwd_dkdv" and v.constant_dict["BLOCK_D"] == bucket
            and v.constant_dict["SCORE_MOD"] == score_mod and v.constant_dict["ACCUMULATE_DQ"] == accumulate_dq]


def hopper_tiles(bucket: int, score_mod: int, block_n: int | None, accumulate_dq: bool = False) -> launch.Tiles:
    """attn_bwd_dkdv_sm90's tiles for the bucket, score modification and ACCUMULATE_DQ: the grid's
    variant (its BLOCK_N replaced by block_n if given), or 64 x block_n where the grid has none."""
    variants = [v for v in _grid_variants(bucket, score_mod, accumulate_dq) if v.implementation == "attn_bwd_dkdv_sm90"]
    if variants:
        c = variants[0].constant_dict
        return launch.Tiles(c["BLOCK_M"], block_n or c["BLOCK_N"], variants[0].num_warps, variants[0].num_stages)
    if block_n is None:
        raise SystemExit(f"the grid builds attn_bwd_dkdv_sm90 for no {bucket} bucket with SCORE_MOD {score_mod}"
                         f"{' and ACCUMULATE_DQ' if accumulate_dq else ''}: give --block-n (128, or 64 for the "
                         "wide-head form)")
    return launch.Tiles(64, block_n, 4, 1)


def split_dkdv(bucket: int, score_mod: int):
    """(spec, tiles) of the dK/dV kernel the grid builds without ACCUMULATE_DQ: the split path's
    first half (attn_bwd_dkdv_sm90 where configs.json has it, else attn_bwd_dkdv)."""
    if any(v.implementation == "attn_bwd_dkdv_sm90" for v in _grid_variants(bucket, score_mod, False)):
        return ATTN_BWD_DKDV_SM90, hopper_tiles(bucket, score_mod, None)
    return ATTN_BWD_DKDV, launch.Tiles(*current_config("attn_bwd_dkdv", 90, bucket))


def hopper_dq_tiles(bucket: int, score_mod: int) -> launch.Tiles | None:
    """attn_bwd_dq_sm90's tiles where the grid builds it for the bucket and score modification."""
    for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": str(bucket)}):
        c = v.constant_dict
        if v.implementation == "attn_bwd_dq_sm90" and c["BLOCK_D"] == bucket and c["SCORE_MOD"] == score_mod:
            return launch.Tiles(c["BLOCK_M"], c["BLOCK_N"], v.num_warps, v.num_stages)
    return None


def split_dq(bucket: int, score_mod: int):
    """(spec, tiles) of the dQ kernel the grid builds: the split path's second half."""
    hopper = hopper_dq_tiles(bucket, score_mod)
    if hopper is not None:
        return ATTN_BWD_DQ_SM90, hopper
    return ATTN_BWD_DQ, launch.Tiles(*current_config("attn_bwd_dq", 90, bucket))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--softcap", type=float, default=0.0, help="> 0: the softcap_alibi variants")
    parser.add_argument("--alibi", action="store_true",
                        help="ALiBi slopes: the softcap_alibi variants, alone or with --softcap")
    parser.add_argument("--block-n", type=int, default=None, choices=(64, 128),
                        help="attn_bwd_dkdv_sm90's key tile, which picks its form (default: the grid's)")
    parser.add_argument("--dq", action="store_true",
                        help="time dQ accumulated in the dK/dV pass against attn_bwd_dkdv_sm90 + attn_bwd_dq")
    parser.add_argument("--dq-kernel", action="store_true", help="time attn_bwd_dq_sm90 against attn_bwd_dq")
    parser.add_argument("--seqlens", default="1024,4096,16384")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        parser.error("times the sm_90 kernel: needs a Hopper GPU")
    # The Gluon kernel builds its TMA descriptors in global scratch, which the JIT launch allocates.
    launch.use_torch_scratch()
    score_mod = int(args.softcap > 0 or args.alibi)
    rows = []
    baseline, candidate = (("split", "accumulate_dq") if args.dq else ("attn_bwd_dq", "attn_bwd_dq_sm90")
                           if args.dq_kernel else ("attn_bwd_dkdv", "attn_bwd_dkdv_sm90"))
    for d in (int(x) for x in args.head_dims.split(",")):
        triton_tiles = launch.Tiles(*current_config("attn_bwd_dkdv", 90, d))
        hopper = None if args.dq_kernel else hopper_tiles(d, score_mod, args.block_n, accumulate_dq=args.dq)
        split_spec, split_tiles = split_dkdv(d, score_mod)
        dq_spec, dq_tiles = split_dq(d, score_mod)
        triton_dq_tiles = launch.Tiles(*current_config("attn_bwd_dq", 90, d))
        hopper_dq = hopper_dq_tiles(d, score_mod) or launch.Tiles(128, 64, 4, 1)
        for seqlen in (int(x) for x in args.seqlens.split(",")):
            for causal in (False, True):
                p = Problem(16384 // seqlen, seqlen, 2048 // d, 2048 // d, d, causal)
                p.prepare_backward()
                slopes = alibi_slopes(p.q.shape[2], "cuda") if args.alibi else None
                variant = launch.Variant(causal=causal, softcap=args.softcap, alibi=slopes)
                grads = (p.q, p.k, p.v, p.dout, p.lse, p.delta)
                if args.dq:
                    calls = {"split": lambda: (launch.backward_dkdv(*grads, split_tiles, variant, spec=split_spec),
                                               launch.backward_dq(*grads, dq_tiles, variant, spec=dq_spec)),
                             "accumulate_dq": lambda: launch.backward_dkdv(*grads, hopper, variant,
                                                                           spec=ATTN_BWD_DKDV_SM90, accumulate_dq=True)}
                elif args.dq_kernel:
                    calls = {"attn_bwd_dq": lambda: launch.backward_dq(*grads, triton_dq_tiles, variant),
                             "attn_bwd_dq_sm90": lambda: launch.backward_dq(*grads, hopper_dq, variant,
                                                                            spec=ATTN_BWD_DQ_SM90)}
                else:
                    calls = {"attn_bwd_dkdv": lambda: launch.backward_dkdv(*grads, triton_tiles, variant),
                             "attn_bwd_dkdv_sm90": lambda: launch.backward_dkdv(*grads, hopper, variant,
                                                                                spec=ATTN_BWD_DKDV_SM90)}
                ms = interleaved_ms(calls, args.pairs)
                products = 2.5 if args.dq else 1.5 if args.dq_kernel else 2  # in units of the forward's two
                row = {"head_dim": d, "seqlen": seqlen, "causal": causal, "softcap": args.softcap, "alibi": args.alibi,
                       **{f"{name}_tflops": round(products * p.flops / t / 1e9, 1) for name, t in ms.items()},
                       "speedup": round(ms[baseline] / ms[candidate], 3)}
                print(json.dumps(row), flush=True)
                rows.append(row)
                del p
                torch.cuda.empty_cache()
    if args.out:
        write_ab_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
