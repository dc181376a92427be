"""python -m tuning.tune_tile_loop [--buckets 64,128] [--seqlens 512,...,16384] [--out FILE]

The offline tuner's choice between implementations by length: where the grid builds attn_fwd both
ways for a bucket on this GPU's arch (TILE_LOOP false: attn_fwd, one query tile per program;
TILE_LOOP true: attn_fwd_sm90, whose programs loop over query tiles), it times both on the
benchmark's shapes at each length, causal and not, and writes from which query rows the looping
kernel ran faster, without and with a right edge, into aot_build/tuned/sm<arch>.json's
"tile_loop" (every measurement beside the choice). The build emits them into the kernel table
(aot_build/emit.py), where the op's prefers_tile_loop reads them
(csrc/attention/query_tile_programs.h); one compiled variant of each serves every length, so this
is the one choice the op makes by length.

How: both kernels through Triton's JIT with the tiles the grid builds (aot_build/tuned/sm<arch>.json and
configs.json's "implementations"), the looping one with the programs per (head, batch) the op
would give it and, up to the rows the op takes them for, with host-made maps where the grid
builds them (HOST_MAPS; fattn's own rules, through the built library: build it first). Each is captured
in a CUDA graph and replayed, so that the JIT's host time does not count (the library's launches
cost far less), the two alternating --pairs times. Before timing, each must hold the accuracy
rule (tuning/tune.py's: within 2x of PyTorch's own bf16 error against float64, causal and
not, ragged lengths and GQA). Shapes: bf16, --tokens per step, heads = --hidden / head dim.

The crossover: the shortest measured length from which the looping kernel was faster at that
length and every longer one (its rows are the geometric mean of that length and the one before,
rounded up to a multiple of 64, when a shorter length lost; 1 when none lost; never, written as
2**62, when it lost at the longest).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
from pathlib import Path

from triton_src.variants import score_mod_value
from tuning.tune import TUNED_DIR, Problem, _max_err, accuracy_checks, current_config, graph_replay, read_tuned

NEVER = 1 << 62


def crossover(rows: list[tuple[int, float]]) -> int:
    """The query rows from which the looping kernel is asked for, from (seqlen, speedup of the
    looping kernel) measurements: see the module docstring."""
    rows = sorted(rows)
    if not rows or rows[-1][1] <= 1.0:
        return NEVER
    first = len(rows) - 1
    while first > 0 and rows[first - 1][1] > 1.0:
        first -= 1
    if first == 0:
        return 1
    between = math.sqrt(rows[first - 1][0] * rows[first][0])
    return int(math.ceil(between / 64) * 64)


def buckets_built_both_ways(arch: int) -> list[int]:
    """attn_fwd's buckets that the grid builds for `arch`, without score modifications, both as
    attn_fwd (TILE_LOOP false) and as its looping implementation (TILE_LOOP true)."""
    from aot_build import grid

    ways: dict[int, set] = {}
    for v in grid.expand(env={"FATTN_CUDA_ARCHS": str(arch)}):
        c = v.constant_dict
        if v.kernel == "attn_fwd" and v.dtype == "bf16" and c["SCORE_MOD"] == score_mod_value("plain") and not c.get("FP8"):
            ways.setdefault(c["BLOCK_D"], set()).add(bool(c["TILE_LOOP"]))
    return sorted(d for d, w in ways.items() if w == {False, True})


def _looping_tiles(arch: int, bucket: int):
    """(implementation, tiles, whether the grid also builds it with host-made maps) of the
    bucket's looping attn_fwd without score modifications."""
    from aot_build import grid
    from tuning.launch import Tiles

    found, maps = None, False
    for v in grid.expand(env={"FATTN_CUDA_ARCHS": str(arch), "FATTN_HEAD_DIMS": str(bucket)}):
        c = v.constant_dict
        if (v.kernel == "attn_fwd" and c["BLOCK_D"] == bucket and c["SCORE_MOD"] == score_mod_value("plain") and c["TILE_LOOP"]
                and not c["FP8"]):
            maps = maps or bool(c.get("HOST_MAPS"))
            found = found or (v.implementation, Tiles(c["BLOCK_M"], c["BLOCK_N"], v.num_warps, v.num_stages))
    if found is None:
        raise SystemExit(f"the grid builds no looping attn_fwd for sm{arch} bucket {bucket}")
    return (*found, maps)


def measure_bucket(arch: int, bucket: int, seqlens, tokens: int, hidden: int, pairs: int, log=print) -> dict:
    import torch

    import fattn._library as library
    from aot_build.signatures import kernel_spec
    from tuning import launch

    one_tile = launch.Tiles(*current_config("attn_fwd", arch, bucket))
    implementation, looping, has_maps = _looping_tiles(arch, bucket)
    maps_up_to = library.host_maps_up_to_rows() if has_maps else 0
    one_tile_spec, looping_spec = kernel_spec("attn_fwd"), kernel_spec(implementation)
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def call(p, loop: bool):
        variant = launch.Variant(causal=p.causal)
        if not loop:
            return lambda: launch.forward(p.q, p.k, p.v, one_tile, variant, spec=one_tile_spec)
        tiles = -(-p.q.shape[1] // looping.block_m)
        programs = library.query_tile_programs(tiles, p.q.shape[0] * p.q.shape[2], sms, p.causal)
        # As the op runs it: with host-made maps up to its rows, where the grid builds them.
        maps = p.q.shape[1] <= maps_up_to
        return lambda: launch.forward(p.q, p.k, p.v, looping, variant, spec=looping_spec, programs=programs, maps=maps)

    accuracy = []
    for p, exact, bounds in accuracy_checks(bucket):
        for loop in (False, True):
            err = _max_err(call(p, loop)()[0], exact["out"])
            accuracy.append({"tile_loop": loop, "causal": p.causal, "out_error": err, "bound": bounds["out"]})
            if not err <= bounds["out"]:
                raise RuntimeError(f"attn_fwd bucket {bucket} TILE_LOOP {loop} causal {p.causal}: out error "
                                   f"{err:.3g} above {bounds['out']:.3g} (2x torch's)")
    cases = []
    for s in seqlens:
        for causal in (False, True):
            p = Problem(max(1, tokens // s), s, hidden // bucket, hidden // bucket, bucket, causal)
            replays = {False: graph_replay(call(p, False)), True: graph_replay(call(p, True))}
            samples = {False: [], True: []}
            for _ in range(pairs):
                for loop, replay in replays.items():
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(10):
                        replay()
                    end.record()
                    end.synchronize()
                    samples[loop].append(start.elapsed_time(end) / 10)
            one_ms, loop_ms = (sorted(samples[k])[len(samples[k]) // 2] for k in (False, True))
            case = {"seqlen": s, "causal": causal, "one_tile_ms": round(one_ms, 4), "tile_loop_ms": round(loop_ms, 4),
                    "tile_loop_speedup": round(one_ms / loop_ms, 3)}
            log(f"attn_fwd d{bucket} {json.dumps(case)}")
            cases.append(case)
            del p, replays
            torch.cuda.empty_cache()
    return {
        "from_rows": crossover([(c["seqlen"], c["tile_loop_speedup"]) for c in cases if not c["causal"]]),
        "from_rows_right_edge": crossover([(c["seqlen"], c["tile_loop_speedup"]) for c in cases if c["causal"]]),
        "one_tile": _tile_dict(one_tile),
        "tile_loop": {"implementation": implementation, **_tile_dict(looping)},
        "accuracy": accuracy, "cases": cases,
    }


def _tile_dict(tiles) -> dict:
    return {"BLOCK_M": tiles.block_m, "BLOCK_N": tiles.block_n, "num_warps": tiles.num_warps,
            "num_stages": tiles.num_stages}


def merge(path: Path, arch: int, found: dict, meta: dict) -> dict:
    data = read_tuned(path, arch)
    section = data.get("tile_loop", {})
    section.pop("source", None)  # measured now
    section.update(meta)
    section.setdefault("kernels", {}).setdefault("attn_fwd", {}).update(found)
    data["tile_loop"] = section
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuning.tune_tile_loop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--buckets", default=None, help="default: every bucket the grid builds both ways")
    parser.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--tokens", type=int, default=16384, help="batch = tokens / seqlen")
    parser.add_argument("--hidden", type=int, default=2048, help="heads = hidden / head_dim")
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None, help="default: aot_build/tuned/sm<arch>.json")
    args = parser.parse_args(argv)
    import torch
    import triton

    if not torch.cuda.is_available():
        parser.error("the tuner times kernels: it needs a CUDA GPU")
    major, minor = torch.cuda.get_device_capability()
    arch = 10 * major + minor
    from tuning import launch

    launch.use_torch_scratch()
    buckets = [int(b) for b in args.buckets.split(",")] if args.buckets else buckets_built_both_ways(arch)
    if not buckets:
        parser.error(f"the grid builds attn_fwd both ways for no bucket on sm{arch}")
    seqlens = [int(s) for s in args.seqlens.split(",")]
    found = {str(b): measure_bucket(arch, b, seqlens, args.tokens, args.hidden, args.pairs) for b in buckets}
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "dtype": "bf16", "date": datetime.date.today().isoformat(),
            "shapes": {"tokens": args.tokens, "hidden": args.hidden, "seqlens": seqlens, "causal": [False, True]},
            "timing": f"CUDA graph replays, 10 per sample, the median of {args.pairs} alternating samples"}
    out = args.out or TUNED_DIR / f"sm{arch}.json"
    merge(out, arch, found, meta)
    for b, entry in found.items():
        print(f"tuning.tune_tile_loop: d{b} from {entry['from_rows']} rows, {entry['from_rows_right_edge']} "
              "with a right edge")
    print(f"tuning.tune_tile_loop: wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
