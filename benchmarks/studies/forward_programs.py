"""How many programs per (head, batch) the Hopper forward's looping kernel should get at short
lengths: the op's rule (fattn::query_tile_programs, through the built library) against every
power of two from 2 to one query tile per program, on bench_attention.py's shapes.

    python benchmarks/studies/forward_programs.py --head-dims 64,128 --seqlens 1024,2048,4096 --out progs.json

attn_fwd_sm90 through Triton's JIT with the tiles the grid builds (tuning/tune_tile_loop.py's
choice of variant), each program count held to the accuracy rule first (the same output as the
rule's count, to the bit: the programs only reorder which tiles run where), captured in a CUDA
graph and replayed, the counts alternating --pairs times (benchmarks/common.py's interleaved_ms). Needs an sm_90 GPU
and a built library.
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

from forward_cases import add_case_arguments  # noqa: E402


def counts(tiles: int, rule: int) -> list[int]:
    out, g = {rule}, 2
    while g < tiles:
        out.add(g)
        g *= 2
    out.add(tiles)
    return sorted(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(parser)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import torch

    import fattn._library as library
    from aot_build.signatures import kernel_spec
    from common import interleaved_ms
    from tuning import launch
    from tuning.tune import Problem, graph_replay
    from tuning.tune_tile_loop import _looping_tiles

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("forward_programs needs a Hopper GPU (sm_90)", file=sys.stderr)
        return 2

    # Descriptors made inside the kernel need global scratch (the library's launcher gives it).
    launch.use_torch_scratch()
    arch, sms = 90, torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for d in (int(x) for x in args.head_dims.split(",")):
        implementation, tiles_cfg, _ = _looping_tiles(arch, d)
        spec = kernel_spec(implementation)
        for s in (int(x) for x in args.seqlens.split(",")):
            for causal in (False, True):
                p = Problem(max(1, args.tokens // s), s, args.hidden // d, args.hidden // d, d, causal)
                tiles = -(-s // tiles_cfg.block_m)
                pairs_per_call = p.q.shape[0] * p.q.shape[2]
                rule = library.query_tile_programs(tiles, pairs_per_call, sms, causal)
                variant = launch.Variant(causal=causal)

                def call(g):
                    return lambda: launch.forward(p.q, p.k, p.v, tiles_cfg, variant, spec=spec, programs=g)

                want = call(rule)()[0]
                replays = {}
                for g in counts(tiles, rule):
                    got = call(g)()[0]
                    if not torch.equal(got, want):
                        raise RuntimeError(f"d{d} s{s} causal={causal}: {g} programs per pair give another output")
                    replays[g] = graph_replay(call(g))
                ms = interleaved_ms(replays, pairs=args.pairs)
                best = min(ms, key=ms.get)
                row = {"head_dim": d, "seqlen": s, "causal": causal, "tiles": tiles, "pairs": pairs_per_call,
                       "rule": rule, "best": best, "rule_over_best": round(ms[rule] / ms[best], 3),
                       "ms": {str(g): round(t, 4) for g, t in ms.items()}}
                print(json.dumps(row), flush=True)
                rows.append(row)
                p = replays = None  # free the problem before the next shape
                torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
