"""The Hopper forward with Q, K, V and Out as TMA maps the host made (HOST_MAPS) against the same
kernel making its four descriptors in each program: equal output, then their times.

    python benchmarks/studies/forward_host_maps.py --head-dims 64,128 --seqlens 1024,2048,4096 --out maps.json

Each program of triton_src/forward_sm90.py otherwise makes four TMA descriptors over its
(sequence, head) before its consumers start: 3.0-3.3 us of a 3.6-3.9 us setup at d128
(docs/notes/tuning.md T36). The HOST_MAPS variants take rank-4 maps over the dense [batch,
seqlen, heads, head_dim] tensors instead (triton_src/row_tiles.py); the op takes them for dense
calls up to kHostMapsUpToRows (csrc/attention/host_maps.h), the length this study sets.
Both launch through Triton's JIT (tuning/launch.py, whose host_maps makes the maps as the op's
csrc/runtime/tensor_maps.cpp does), on the op's programs per (head, batch); the output must be
the same to the bit; then they alternate --pairs times in CUDA-graph replays. Dense bf16 calls
of plain attention, causal and not. Needs an sm_90 GPU and a built library (the programs per
pair).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from forward_cases import add_case_arguments, forward_cases  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(parser)
    parser.add_argument("--pairs", type=int, default=4, help="interleaved timing pairs per case")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("forward_host_maps needs a Hopper GPU (sm_90)", file=sys.stderr)
        return 2

    from common import interleaved_ms, write_ab_rows
    from triton_src.forward_sm90 import ATTN_FWD_SM90
    from tuning import launch
    from tuning.tune import graph_replay

    launch.use_torch_scratch()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for case in forward_cases(args.head_dims, args.seqlens, args.tokens, args.hidden, sms):
        d, s, causal, tiles, p, programs, variant = case

        def call(maps: bool):
            return launch.forward(p.q, p.k, p.v, tiles, variant, spec=ATTN_FWD_SM90, programs=programs, maps=maps)[0]

        want, got = call(False), call(True)
        if not torch.equal(got, want):
            raise RuntimeError(f"d{d} s{s} causal={causal}: the maps' output differs in "
                               f"{(got != want).sum().item()} elements")
        ms = interleaved_ms({"in_kernel": graph_replay(lambda: call(False)), "host_maps": graph_replay(lambda: call(True))},
                            pairs=args.pairs)
        row = {"head_dim": d, "seqlen": s, "causal": causal, "programs_per_pair": programs,
               "ms": {k: round(v, 4) for k, v in ms.items()}, "speedup": round(ms["in_kernel"] / ms["host_maps"], 3)}
        print(json.dumps(row), flush=True)
        rows.append(row)
        if args.out:  # after each case: a run cut short keeps what it measured
            write_ab_rows(args.out, rows)
        case = p = want = got = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
