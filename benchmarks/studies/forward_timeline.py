"""Where the Hopper forward's time goes inside a program: per query tile, per key tile, and between
the programs an SM runs in turn.

    python benchmarks/studies/forward_timeline.py --head-dims 128 --seqlens 1024,4096 --out timeline.json

A copy of triton_src/forward_sm90.py with clock reads added (timed_source; imported as a module
of triton_src by kernel_copy.py and launched through Triton's JIT) records, per program, in a buffer the
plain variant's unused Bias pointer carries:
- %globaltimer at the kernel's entry (before the descriptors), after the descriptors, at the
  first consumer's entry and at its exit, and the SM it ran on;
- per query tile (round) the first consumer's %clock64 at its start, after Q's wait, after the
  key loop and after the store, and the tile's key-tile count;
- per key tile, each consumer's %clock64 when its S product has landed and when its P V product
  has, and the producer's before it waits for the tile's ring slot.
The copy must give the library kernel's output to the bit, and its time is printed beside the
plain kernel's (the clock reads cost 1-10 %; both launch through tuning/launch.py's forward, whose
NaN-filled outputs are part of each call's time, as in the other JIT studies). The summary: the gap between the programs an SM
runs, the setup before the consumers start (and its descriptors' share), and per key-tile count
the medians of Q's wait, the key loop and the epilogue; --records keeps the raw clocks (.npz per
case).
Needs an sm_90 GPU and a built library (for the op's programs per pair).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from forward_cases import add_case_arguments, forward_cases  # noqa: E402

SLOTS = 8192  # int64 clock slots per program
ROUNDS, CONSUMER0, CONSUMER1, PRODUCER, Q_ISSUE = 8, 1024, 3072, 5120, 7168  # where each record starts
_GLOBALTIMER = 'gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)'
_CLOCK = 'gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)'
_SMID = 'gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)'


def timed_source(src: str) -> str:
    """triton_src/forward_sm90.py's text with the clock reads added. Each insertion is anchored on
    a line of the kernel; a missing anchor raises (the kernel changed: move the anchor)."""

    def replace(old: str, new: str) -> None:
        nonlocal src
        if src.count(old) != 1:
            raise ValueError(f"forward_timeline: anchor not found once in forward_sm90.py: {old!r}")
        src = src.replace(old, new)

    def insert(anchor: str, text: str, after: bool = False) -> None:
        replace(anchor, anchor + text if after else text + anchor)

    program = "(pid + num_programs * (head + gl.num_programs(1) * batch)) * " + str(SLOTS)
    insert("    # Each tensor's rows as row_tiles.py's sources", f"    gl.store(Bias + {program} + 5, {_GLOBALTIMER})\n")
    insert("    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, WG_M, D0], tile_layout)\n",
           f"    gl.store(Bias + {program} + 6, {_GLOBALTIMER})\n")
    insert("    if CONSUMERS == 2:\n        gl.warp_specialize([",
           f"    ts_base = Bias + {program}\n    if SCORE_MOD == PLAIN:\n        mods_0 = (ts_base,)\n"
           "        mods_1 = (ts_base,)\n        mods_2 = (ts_base,)\n")
    replace("use_segments, span_base, bias_load, BLOCK_M: gl.constexpr",
            "use_segments, span_base, bias_load, ts, BLOCK_M: gl.constexpr")
    src = src.replace("bias_load, BLOCK_M, WG_M, BLOCK_N, STAGES, D1, FP8 != 0)",  # one per consumer count
                      "bias_load, ts_base, BLOCK_M, WG_M, BLOCK_N, STAGES, D1, FP8 != 0)")
    insert("            mbarrier.wait(q_empty.index(wg), (k & 1) ^ 1)\n",
           f"            gl.store(ts + {Q_ISSUE} + 2 * k + wg, {_CLOCK})\n", after=True)
    insert("            start_n = _tile_start(i, lo, full_lo, full_hi, n_full, BLOCK_N)\n",
           f"            gl.store(ts + {PRODUCER} + it, {_CLOCK})\n", after=True)
    def consumer(indent: str, slot: str) -> str:  # the first two consumers' key-tile clocks
        return (f"{indent}if WG < 2:\n{indent}    gl.store(mods[0] + {CONSUMER0} + {CONSUMER1 - CONSUMER0} * WG + {slot}, "
                f"{_CLOCK})\n")

    insert("    mbarrier.arrive(k_empty.index(it % STAGES), count=1)\n", consumer("    ", "2 * it"))
    insert("        mbarrier.arrive(k_empty.index(stage), count=1)\n", consumer("        ", "2 * (it + j)"))
    insert("        mbarrier.arrive(v_empty.index(prev), count=1)\n", consumer("        ", "1 + 2 * (it + j - 1)"))
    insert("    mbarrier.arrive(v_empty.index(last), count=1)\n", consumer("    ", "1 + 2 * (it + n_tiles - 1)"))
    insert("    mbarrier.wait(q_ready.index(WG), k & 1)\n",
           f"    if WG == 0:\n        if SCORE_MOD == PLAIN:\n            gl.store(mods[0] + {ROUNDS + 2} + 6 * k, {_CLOCK})\n"
           f"            gl.store(mods[0] + {ROUNDS + 5} + 6 * k, n_tiles.to(gl.int64))\n", after=True)
    insert("    # softmax.softmax_finish: rows that saw no key",
           f"    if WG == 0:\n        if SCORE_MOD == PLAIN:\n            gl.store(mods[0] + {ROUNDS + 3} + 6 * k, {_CLOCK})\n")
    insert("    if WG == BLOCK_M // WG_M - 1:\n        mbarrier.arrive(turn.index(0), count=1)",
           f"    if WG == 0:\n        gl.store(mods[0], {_GLOBALTIMER})\n        gl.store(mods[0] + 3, {_CLOCK})\n"
           f"        gl.store(mods[0] + 1, {_SMID}.to(gl.int64))\n")
    insert("        it, turn_phase = _attend_tile(\n",
           f"        if WG == 0:\n            gl.store(mods[0] + {ROUNDS} + 6 * k, {_GLOBALTIMER})\n"
           f"            gl.store(mods[0] + {ROUNDS + 1} + 6 * k, {_CLOCK})\n")
    end = "            BLOCK_D, STAGES, SCORE_MOD, O_IN_Q_BUFFER, D1)\n    tma.store_wait(0)\n"
    replace(end, end.replace("    tma.store_wait(0)\n",
                             f"        if WG == 0:\n            gl.store(mods[0] + {ROUNDS + 4} + 6 * k, {_CLOCK})\n"
                             f"    tma.store_wait(0)\n    if WG == 0:\n        gl.store(mods[0] + 2, {_GLOBALTIMER})\n"
                             f"        gl.store(mods[0] + 4, {_CLOCK})\n"))
    return src


def summary(rec) -> dict:
    """The summary of one case's clocks (rec: programs x SLOTS, a numpy array)."""
    import numpy as np

    ns_per_cycle = float(np.median((rec[:, 2] - rec[:, 0]) / np.maximum(rec[:, 4] - rec[:, 3], 1)))
    us = lambda cycles: float(cycles) * ns_per_cycle / 1e3  # noqa: E731
    by_sm = defaultdict(list)
    for r in rec:
        by_sm[int(r[1])].append(r)
    ordered = [sorted(rs, key=lambda r: r[5]) for rs in by_sm.values()]
    gaps = [(b[5] - a[2]) / 1e3 for rs in ordered for a, b in zip(rs, rs[1:])]
    per_n = defaultdict(lambda: defaultdict(list))
    for r in rec:
        for k in range((CONSUMER0 - ROUNDS) // 6):
            b = ROUNDS + 6 * k
            if r[b] == 0:
                break
            start, q_ready, loop_end, end, n = r[b + 1], r[b + 2], r[b + 3], r[b + 4], int(r[b + 5])
            per_n[n]["q_wait"].append(us(q_ready - start))
            per_n[n]["key_loop"].append(us(loop_end - q_ready))
            per_n[n]["epilogue"].append(us(end - loop_end))
    med = lambda xs: round(statistics.median(xs), 3) if xs else None  # noqa: E731
    return {
        "programs": int(rec.shape[0]), "sms": len(by_sm),
        "span_us": round(float(rec[:, 2].max() - rec[:, 0].min()) / 1e3, 2),
        "setup_us": med(list((rec[:, 0] - rec[:, 5]) / 1e3)),
        "descriptors_us": med(list((rec[:, 6] - rec[:, 5]) / 1e3)) if rec[:, 6].any() else None,
        "gap_between_programs_us": med(gaps),
        "rounds_by_key_tiles": {str(n): {name: med(v) for name, v in d.items()} | {"count": len(d["key_loop"])}
                                for n, d in sorted(per_n.items())},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_case_arguments(parser, head_dims="128", seqlens="1024,4096")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--records", type=Path, default=None, help="a folder for each case's raw clocks (.npz)")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("forward_timeline needs a Hopper GPU (sm_90)", file=sys.stderr)
        return 2
    import triton

    from common import interleaved_ms
    from triton_src.forward_sm90 import ATTN_FWD_SM90
    from tuning import launch
    from tuning.tune import graph_replay

    from kernel_copy import import_copy

    timed = import_copy("forward_sm90_timed", timed_source((ROOT / "triton_src" / "forward_sm90.py").read_text())
                        ).ATTN_FWD_SM90
    launch.use_torch_scratch()
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def run(spec, p, tiles, variant, programs, clocks=None):
        replace = None if clocks is None else {"Bias": clocks}
        return launch.forward(p.q, p.k, p.v, tiles, variant, spec=spec, programs=programs, replace=replace)[0]

    rows = []
    for case in forward_cases(args.head_dims, args.seqlens, args.tokens, args.hidden, sms):
        d, s, causal, tiles, p, programs, variant = case
        heads, batch = p.q.shape[2], p.q.shape[0]
        clocks = torch.zeros(programs * heads * batch * SLOTS, dtype=torch.int64, device="cuda")
        want = run(ATTN_FWD_SM90, p, tiles, variant, programs)
        if not torch.equal(run(timed, p, tiles, variant, programs, clocks), want):
            raise RuntimeError(f"d{d} s{s} causal={causal}: the timed copy gives another output")
        ms = interleaved_ms({"plain": graph_replay(lambda: run(ATTN_FWD_SM90, p, tiles, variant, programs)),
                             "timed": graph_replay(lambda: run(timed, p, tiles, variant, programs, clocks))},
                            pairs=3)
        clocks.zero_()
        run(timed, p, tiles, variant, programs, clocks)
        rec = clocks.view(-1, SLOTS).cpu().numpy()
        row = {"head_dim": d, "seqlen": s, "causal": causal, "programs_per_pair": programs,
               "ms": {k: round(v, 4) for k, v in ms.items()}, **summary(rec)}
        print(json.dumps({k: v for k, v in row.items() if k != "rounds_by_key_tiles"}), flush=True)
        rows.append(row)
        if args.records:
            args.records.mkdir(parents=True, exist_ok=True)
            used = np.flatnonzero((rec != 0).any(0))
            np.savez_compressed(args.records / f"d{d}_s{s}_{'causal' if causal else 'full'}.npz",
                                slots=used, clocks=rec[:, used])
        case = p = clocks = None
        torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "triton": triton.__version__, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
