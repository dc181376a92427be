"""The Hopper speed bars, checked against one forward and one backward run of bench_attention.py.

    python benchmarks/check_bars.py benchmarks/results/<dir>/forward_h100.json \
        benchmarks/results/<dir>/backward_h100.json [more runs ...]

Each file is one run (its "benchmark" says forward or backward); a run may cover some head dims
and another the rest, but a (head dim, seqlen, causal) row must come from one run only.

Each bar is a minimum of fattn's `ratio` (peer ms / fattn ms, the same run) against one peer:

- forward, head dims 64 and 128, seqlen 4k / 8k / 16k, causal and not: >= 1.0 x SDPA cuDNN;
- backward, the same rows: >= 0.9 x SDPA cuDNN;
- every forward and backward row from 512 to 16k: >= 1.0 x FlexAttention;
- head dim 256, forward and backward: rows present and >= 1.0 x SDPA flash.

Prints one line per bar row (met, unmet, or missing: a row or peer the run lacks) and exits 1
if any bar is unmet or missing, so a run that did not measure a bar cannot pass for one that met it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

LONG = (4096, 8192, 16384)


@dataclass(frozen=True)
class Bar:
    direction: str
    peer: str
    need: float
    head_dims: tuple[int, ...] | None  # None: every head dim the run has
    seqlens: tuple[int, ...] | None    # None: every seqlen the run has


BARS = [
    Bar("forward", "sdpa_cudnn", 1.0, (64, 128), LONG),
    Bar("backward", "sdpa_cudnn", 0.9, (64, 128), LONG),
    Bar("forward", "flex", 1.0, None, None),
    Bar("backward", "flex", 1.0, None, None),
    Bar("forward", "sdpa_flash", 1.0, (256,), None),
    Bar("backward", "sdpa_flash", 1.0, (256,), None),
]


def fattn_rows(runs: list[dict]) -> dict:
    """{(head_dim, seqlen, causal): fattn's row} over runs of one direction."""
    rows = {}
    for results in runs:
        for r in results["rows"]:
            if r["impl"] != "fattn":
                continue
            key = (r["head_dim"], r["seqlen"], r["causal"])
            if key in rows:
                raise ValueError(f"{results['benchmark']} row d{key[0]} s{key[1]} causal={key[2]} is in two runs")
            rows[key] = r
    return rows


def check(runs: dict) -> list[dict]:
    """One record per (bar, row): runs = {"forward": [results, ...], "backward": [...]}."""
    out = []
    for bar in BARS:
        rows = fattn_rows(runs.get(bar.direction, []))
        head_dims = bar.head_dims or sorted({d for d, _, _ in rows})
        seqlens = bar.seqlens or sorted({s for _, s, _ in rows}) or LONG
        for d in head_dims:
            for s in seqlens:
                for causal in (False, True):
                    row = rows.get((d, s, causal))
                    ratio = None if row is None else row.get("ratio", {}).get(bar.peer)
                    status = "missing" if ratio is None else "met" if ratio >= bar.need else "unmet"
                    out.append({"direction": bar.direction, "peer": bar.peer, "need": bar.need, "head_dim": d,
                                "seqlen": s, "causal": causal, "ratio": ratio, "status": status})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="bench_attention.py JSON files")
    args = parser.parse_args(argv)
    runs = {}
    for path in args.runs:
        data = json.loads(path.read_text())
        if data.get("benchmark") not in ("forward", "backward"):
            parser.error(f"{path} holds a {data.get('benchmark')!r} run, not a bench_attention.py one")
        runs.setdefault(data["benchmark"], []).append(data)
    records = check(runs)
    for r in records:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(f"{r['status']:>7}  {r['direction']:<8} d{r['head_dim']:<3} s{r['seqlen']:<5} "
              f"{'causal' if r['causal'] else 'non-causal':<10} vs {r['peer']:<10} {ratio:>5} (need {r['need']})")
    counts = {s: sum(r["status"] == s for r in records) for s in ("met", "unmet", "missing")}
    print(f"bars: {counts['met']} met, {counts['unmet']} unmet, {counts['missing']} missing of {len(records)}")
    return 0 if counts["unmet"] == counts["missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
