"""What the padded head-dim code costs a head dim that fills its bucket: the attention kernels
with PAD_D=1 (every head-dim load and store masked by head_dim) against the exact-dim code
(PAD_D=0), both at head_dim == BLOCK_D, through Triton's JIT (tuning/launch.py).

    python benchmarks/studies/padded_code_cost.py [--out padded_code_cost.json]

The build compiles only the padded code of the large kernel families, which then serves every
head dim of its bucket (aot_build/configs.json, common/kernel_choice.h); this is the measurement
that decision rests on. Shapes: bf16, hidden 2048, 16k tokens, head dims 64 and 128, seqlen 4k and
16k, causal and not; the sm tiles the grid builds for this GPU. Forward = attn_fwd; backward =
attn_bwd_dkdv + attn_bwd_dq. The two codes alternate (A B A B ...) --pairs times, each sample the
median of 10 timed calls; the reported figure is the median over the samples, so clock drift
touches both alike.
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

from common import interleaved_ms, write_ab_rows  # noqa: E402
import tuning.launch as launch  # noqa: E402
from tuning.tune import Problem, current_config  # noqa: E402

_exact_shape = launch._shape


def _with_pad_d(pad: bool):
    """tuning/launch.py's shape arguments with PAD_D forced on (pad) or left as the head dim says."""
    def shape(q, k, seqlen_q, seqlen_k):
        sizes, constants = _exact_shape(q, k, seqlen_q, seqlen_k)
        return sizes, dict(constants, PAD_D=pad or constants["PAD_D"])
    return shape


def _padded(pad: bool, fn):
    """fn with tuning/launch.py's shape arguments set to the padded (pad) or exact-dim code first."""
    def run():
        launch._shape = _with_pad_d(pad)
        return fn()
    return run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("times kernels: needs a CUDA GPU")
    major, minor = torch.cuda.get_device_capability()
    arch = 10 * major + minor
    rows = []
    for d in (64, 128):
        tiles = {k: launch.Tiles(*current_config(k, arch, d)) for k in ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq")}
        for seqlen, causal in ((4096, False), (4096, True), (16384, False), (16384, True)):
            p = Problem(16384 // seqlen, seqlen, 2048 // d, 2048 // d, d, causal)
            p.prepare_backward()
            variant = launch.Variant(causal=causal)
            grads = (p.q, p.k, p.v, p.dout, p.lse, p.delta)
            passes = {
                "forward": lambda: launch.forward(p.q, p.k, p.v, tiles["attn_fwd"], variant),
                "backward": lambda: (launch.backward_dkdv(*grads, tiles["attn_bwd_dkdv"], variant),
                                     launch.backward_dq(*grads, tiles["attn_bwd_dq"], variant)),
            }
            for name, fn in passes.items():
                ms = interleaved_ms({pad: _padded(pad, fn) for pad in (False, True)}, args.pairs)
                launch._shape = _exact_shape
                exact, padded = ms[False], ms[True]
                row = {"head_dim": d, "seqlen": seqlen, "causal": causal, "pass": name, "exact_ms": round(exact, 4),
                       "padded_ms": round(padded, 4), "padded_over_exact": round(padded / exact, 4)}
                print(json.dumps(row), flush=True)
                rows.append(row)
            del p
            torch.cuda.empty_cache()
    if args.out:
        write_ab_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
