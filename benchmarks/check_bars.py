"""The Hopper speed bars, checked against one forward and one backward run of bench_attention.py.

    python benchmarks/check_bars.py benchmarks/results/<dir>/forward_h100.json \
        benchmarks/results/<dir>/backward_h100.json [more runs ...]
    python benchmarks/check_bars.py --bars hopper_peers forward.json backward.json

Each file is one run (its "benchmark" says forward or backward); a run may cover some head dims
and another the rest, but a (head dim, seqlen, causal) row must come from one run only.

Each bar is a minimum of fattn's `ratio` (peer ms / fattn ms, the same run) against one peer, or
against the faster of several (the smallest of their ratios). --bars picks the sets (default
hopper; "all" for every set):

hopper, the first speed bars:
- forward, head dims 64 and 128, seqlen 4k / 8k / 16k, causal and not: >= 1.0 x SDPA cuDNN;
- backward, the same rows: >= 0.9 x SDPA cuDNN;
- every forward and backward row from 512 to 16k: >= 1.0 x FlexAttention;
- head dim 256, forward and backward: rows present and >= 1.0 x SDPA flash.

hopper_peers, the bars of the Hopper-speed issue:
- every forward and backward row at head dims 64 and 128, seqlen 1k / 2k / 4k / 8k / 16k, causal
  and not: >= 1.0 x the faster of FlashAttention-4 (fa4) and SDPA cuDNN. A row without a time
  for either (fa4 not installed, say) is missing: it cannot show that fattn beats both.

Prints one line per bar row (met, unmet, or missing: a row or peer the run lacks; for a bar
against several peers, which of them was the faster) and exits 1 if any bar is unmet or missing,
so a run that did not measure a bar cannot pass for one that met it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

LONG = (4096, 8192, 16384)
FROM_1K = (1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True)
class Bar:
    direction: str
    peer: str | tuple[str, ...]  # several: against the fastest of them (the smallest ratio)
    need: float
    head_dims: tuple[int, ...] | None  # None: every head dim the run has
    seqlens: tuple[int, ...] | None    # None: every seqlen the run has

    @property
    def peers(self) -> tuple[str, ...]:
        return (self.peer,) if isinstance(self.peer, str) else self.peer

    @property
    def label(self) -> str:
        """One word (the printed line is read by its spaces): "best(fa4,sdpa_cudnn)" for several."""
        return self.peer if isinstance(self.peer, str) else f"best({','.join(self.peer)})"


BAR_SETS = {
    "hopper": [
        Bar("forward", "sdpa_cudnn", 1.0, (64, 128), LONG),
        Bar("backward", "sdpa_cudnn", 0.9, (64, 128), LONG),
        Bar("forward", "flex", 1.0, None, None),
        Bar("backward", "flex", 1.0, None, None),
        Bar("forward", "sdpa_flash", 1.0, (256,), None),
        Bar("backward", "sdpa_flash", 1.0, (256,), None),
    ],
    # The Hopper-speed issue: fattn at least as fast as the best peer a user could pick instead,
    # at the head dims and lengths training uses, both passes.
    "hopper_peers": [
        Bar("forward", ("fa4", "sdpa_cudnn"), 1.0, (64, 128), FROM_1K),
        Bar("backward", ("fa4", "sdpa_cudnn"), 1.0, (64, 128), FROM_1K),
    ],
}


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


def check(runs: dict, sets=("hopper",)) -> list[dict]:
    """One record per (bar, row) of each named set: runs = {"forward": [results, ...], "backward": [...]}.
    A bar against several peers takes the smallest ratio (the fastest peer), named in "against"."""
    out = []
    for name in sets:
        for bar in BAR_SETS[name]:
            rows = fattn_rows(runs.get(bar.direction, []))
            head_dims = bar.head_dims or sorted({d for d, _, _ in rows})
            seqlens = bar.seqlens or sorted({s for _, s, _ in rows}) or LONG
            for d in head_dims:
                for s in seqlens:
                    for causal in (False, True):
                        row = rows.get((d, s, causal))
                        ratios = {} if row is None else row.get("ratio", {})
                        have = {p: ratios.get(p) for p in bar.peers}
                        # A peer without a time leaves the row unjudged: the faster of the peers is unknown.
                        against = None if None in have.values() else min(have, key=have.get)
                        ratio = None if against is None else have[against]
                        status = "missing" if ratio is None else "met" if ratio >= bar.need else "unmet"
                        out.append({"set": name, "direction": bar.direction, "peer": bar.label,
                                    "against": against, "need": bar.need, "head_dim": d, "seqlen": s,
                                    "causal": causal, "ratio": ratio, "status": status})
    return out


def bar_sets(text: str) -> tuple[str, ...]:
    """--bars: comma-separated names of BAR_SETS, or "all"."""
    names = list(BAR_SETS) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BAR_SETS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown bar set(s) {unknown}; the sets: {', '.join(BAR_SETS)} or all")
    return tuple(dict.fromkeys(names))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="bench_attention.py JSON files")
    parser.add_argument("--bars", type=bar_sets, default=("hopper",),
                        help=f"comma-separated bar sets of {', '.join(BAR_SETS)}, or all (default hopper)")
    args = parser.parse_args(argv)
    runs = {}
    for path in args.runs:
        data = json.loads(path.read_text())
        if data.get("benchmark") not in ("forward", "backward"):
            parser.error(f"{path} holds a {data.get('benchmark')!r} run, not a bench_attention.py one")
        runs.setdefault(data["benchmark"], []).append(data)
    records = check(runs, args.bars)
    for r in records:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        faster = f" {r['against']} faster" if r["against"] and r["against"] != r["peer"] else ""
        print(f"{r['status']:>7}  {r['direction']:<8} d{r['head_dim']:<3} s{r['seqlen']:<5} "
              f"{'causal' if r['causal'] else 'non-causal':<10} vs {r['peer']:<10} {ratio:>5} (need {r['need']})"
              f"{faster} [{r['set']}]")
    counts = {s: sum(r["status"] == s for r in records) for s in ("met", "unmet", "missing")}
    print(f"bars: {counts['met']} met, {counts['unmet']} unmet, {counts['missing']} missing of {len(records)}")
    return 0 if counts["unmet"] == counts["missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
