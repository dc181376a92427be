"""Whether the split backward gains from running its dQ kernel beside its dK/dV kernel, on a
second stream, instead of after it: both read only q, k, v, dout, lse and delta and write
different tensors, so they may overlap, and at short lengths each leaves a tail of idle SMs
(one 12-warp program per SM, programs of uneven causal work) that the other could fill.

    python benchmarks/studies/backward_streams_ab.py [--head-dims 64,128] [--seqlens 512,1024,2048,4096] [--out FILE]

Each way is captured once in a CUDA graph (the JIT launches' host time left out, as the library's
launches are cheaper) and replayed: "sequential" (dK/dV, then dQ, on one stream), "two_streams"
(dQ forked onto a second stream before dK/dV is launched, joined after), and at d64, where
deterministic=False accumulates dQ inside the dK/dV pass, "accumulate_dq" (the one kernel, the
accumulator's zeroing and conversion included). The kernels are those the grid builds for sm_90
(benchmarks/studies/hopper_backward_ab.py's split_dkdv, split_dq, hopper_tiles). Shapes: bf16, hidden
2048, 16k tokens, causal and not; the replays alternate --pairs times (benchmarks/common.py's
interleaved_ms). Needs a Hopper GPU.
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
from hopper_backward_ab import _grid_variants, hopper_tiles, split_dkdv, split_dq  # noqa: E402
from triton_src.backward_sm90 import ATTN_BWD_DKDV_SM90  # noqa: E402
import tuning.launch as launch  # noqa: E402
from tuning.tune import Problem, graph_replay  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlens", default="512,1024,2048,4096")
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        parser.error("times the sm_90 kernels: needs a Hopper GPU")
    launch.use_torch_scratch()
    side = torch.cuda.Stream()
    rows = []
    for d in (int(x) for x in args.head_dims.split(",")):
        dkdv_spec, dkdv_tiles = split_dkdv(d, 0)
        dq_spec, dq_tiles = split_dq(d, 0)
        accumulates = bool(_grid_variants(d, 0, True))
        for seqlen in (int(x) for x in args.seqlens.split(",")):
            for causal in (False, True):
                p = Problem(16384 // seqlen, seqlen, 2048 // d, 2048 // d, d, causal)
                p.prepare_backward()
                variant = launch.Variant(causal=causal)
                grads = (p.q, p.k, p.v, p.dout, p.lse, p.delta)

                def dkdv():
                    return launch.backward_dkdv(*grads, dkdv_tiles, variant, spec=dkdv_spec)

                def dq():
                    return launch.backward_dq(*grads, dq_tiles, variant, spec=dq_spec)

                def two_streams():
                    main_stream = torch.cuda.current_stream()
                    side.wait_stream(main_stream)
                    dkdv()
                    with torch.cuda.stream(side):
                        dq()
                    main_stream.wait_stream(side)

                calls = {"sequential": graph_replay(lambda: (dkdv(), dq())), "two_streams": graph_replay(two_streams)}
                if accumulates:
                    tiles = hopper_tiles(d, 0, None, accumulate_dq=True)
                    calls["accumulate_dq"] = graph_replay(lambda: launch.backward_dkdv(
                        *grads, tiles, variant, spec=ATTN_BWD_DKDV_SM90, accumulate_dq=True))
                ms = interleaved_ms(calls, args.pairs)
                row = {"head_dim": d, "seqlen": seqlen, "causal": causal,
                       **{f"{name}_ms": round(t, 4) for name, t in ms.items()},
                       "two_streams_speedup": round(ms["sequential"] / ms["two_streams"], 3)}
                if accumulates:
                    row["two_streams_over_accumulate_dq"] = round(ms["accumulate_dq"] / ms["two_streams"], 3)
                print(json.dumps(row), flush=True)
                rows.append(row)
                del p, calls
                torch.cuda.empty_cache()
    if args.out:
        write_ab_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
