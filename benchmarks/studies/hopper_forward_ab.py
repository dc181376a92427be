"""The Hopper forward (triton_src/forward_sm90.py) against attn_fwd (triton_src/forward.py) on the
same inputs, both through Triton's JIT (tuning/launch.py), interleaved: the measurement
behind configs.json's choice of where the Gluon kernel replaces attn_fwd on sm_90.

    python benchmarks/studies/hopper_forward_ab.py [--head-dims 128,256] [--out hopper_forward_ab.json]
    python benchmarks/studies/hopper_forward_ab.py --head-dims 64 --block-n 64   # another key tile than the grid's
    python benchmarks/studies/hopper_forward_ab.py --programs 2   # 2 programs per (head, batch), as the op may

Shapes: bf16, hidden 2048, 16k tokens, each seqlen causal and not. Both kernels run with the tiles
the grid builds for this GPU (aot_build/tuned/sm90.json for attn_fwd, the configs.json
"implementations" entry for attn_fwd_sm90); for a bucket the grid does not build attn_fwd_sm90 in,
--block-n gives its key tile (128 query rows: two warpgroups of 64). attn_fwd_sm90 runs one
query tile per program unless --programs gives it that many per (head, batch) (its programs loop
over query tiles; the op picks the number itself, csrc/attention/query_tile_programs.cpp, which
the benchmark CLI measures). The two alternate --pairs times, each sample the median of 10 timed
calls; the figure is the median over the samples. Needs a Hopper GPU (the Gluon kernel is sm_90a
code).
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
from common import interleaved_ms, write_ab_rows  # noqa: E402
from triton_src.forward import ATTN_FWD  # noqa: E402
from triton_src.forward_sm90 import ATTN_FWD_SM90  # noqa: E402
import tuning.launch as launch  # noqa: E402
from tuning.tune import Problem, current_config  # noqa: E402


def _hopper_tiles(bucket: int, block_n: int | None) -> launch.Tiles:
    """attn_fwd_sm90's tiles for the bucket: the grid's variant, or 128 x block_n where it has none."""
    variants = [v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": str(bucket)})
                if v.implementation == "attn_fwd_sm90" and v.constant_dict["BLOCK_D"] == bucket]
    if variants:
        c = variants[0].constant_dict
        return launch.Tiles(c["BLOCK_M"], block_n or c["BLOCK_N"], variants[0].num_warps, variants[0].num_stages)
    if block_n is None:
        raise SystemExit(f"the grid builds attn_fwd_sm90 for no {bucket} bucket: give --block-n")
    return launch.Tiles(128, block_n, 4, 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="128,256")
    parser.add_argument("--block-n", type=int, default=None, help="attn_fwd_sm90's key tile (default: the grid's)")
    parser.add_argument("--seqlens", default="512,1024,4096,16384")
    parser.add_argument("--programs", type=int, default=None,
                        help="attn_fwd_sm90's programs per (head, batch) (default: one per query tile)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        parser.error("times the sm_90 kernel: needs a Hopper GPU")
    # The Gluon kernel builds its TMA descriptors in global scratch, which the JIT launch allocates.
    launch.use_torch_scratch()
    rows = []
    for d in (int(x) for x in args.head_dims.split(",")):
        kernels = {"attn_fwd": (ATTN_FWD, launch.Tiles(*current_config("attn_fwd", 90, d)), None),
                   "attn_fwd_sm90": (ATTN_FWD_SM90, _hopper_tiles(d, args.block_n), args.programs)}
        for seqlen in (int(x) for x in args.seqlens.split(",")):
            for causal in (False, True):
                p = Problem(16384 // seqlen, seqlen, 2048 // d, 2048 // d, d, causal)
                variant = launch.Variant(causal=causal)
                ms = interleaved_ms({name: (lambda spec=spec, tiles=tiles, programs=programs: launch.forward(
                    p.q, p.k, p.v, tiles, variant, spec=spec, programs=programs))
                    for name, (spec, tiles, programs) in kernels.items()}, args.pairs)
                row = {"head_dim": d, "seqlen": seqlen, "causal": causal,
                       **{f"{name}_tflops": round(p.flops / t / 1e9, 1) for name, t in ms.items()},
                       "speedup": round(ms["attn_fwd"] / ms["attn_fwd_sm90"], 3)}
                print(json.dumps(row), flush=True)
                rows.append(row)
                del p
                torch.cuda.empty_cache()
    if args.out:
        write_ab_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
