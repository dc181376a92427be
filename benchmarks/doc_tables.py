"""The docs' performance tables, generated from committed benchmark JSON so that they cannot drift
from the numbers.

    python benchmarks/doc_tables.py           # rewrites the marked tables in README.md and docs/performance.md
    python benchmarks/doc_tables.py --check   # exits 1 if a marked table differs from what the JSON gives
    python benchmarks/doc_tables.py --plot    # also draws benchmarks/results/peers_h200/forward_backward.png

A marked table sits between `<!-- table: NAME -->` and `<!-- end of table -->`; NAME picks the
generator below. The peers JSON holds one run of fattn and its peers on the same inputs (rows of
`<impl>_fwd` / `<impl>_bwd` TFLOP/s for prefill, GB/s of K and V read for decode); a ratio is the
peer's time over fattn's (above 1: fattn is faster).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "benchmarks" / "results" / "peers_h200" / "fattn_0.3.0_2026-11-28.json"
DOCS = [ROOT / "README.md", ROOT / "docs" / "performance.md"]
PEER_NAMES = {"sdpa_cudnn": "cuDNN", "fa4": "FA4", "sdpa_flash": "FA2 (SDPA)", "flex": "Flex"}
MARK = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end of table -->)", re.S)


def _ratio(fattn, peer):
    return "-" if not peer or not fattn else f"{fattn / peer:.2f}"  # time ratio = throughput ratio


def _case(row):
    case = f"d{row['d']} {row['s'] // 1024}k"
    if row["hq"] != row["hk"]:
        case += f" GQA {row['hq']}/{row['hk']}"
    if row.get("window"):
        case += f" window {row['window'][0] + 1}"
    if row.get("softcap"):
        case += f" softcap {row['softcap']:g}"
    return case + (" causal" if row["causal"] else "")


def peers_table(data) -> str:
    """Prefill rows: fattn's TFLOP/s and its ratio to each peer, forward then backward."""
    head = ["case", "pass", "fattn TFLOP/s"] + [f"vs {n}" for n in PEER_NAMES.values()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in (r for r in data["rows"] if r["kind"] == "prefill"):
        for direction, label in (("fwd", "forward"), ("bwd", "backward")):
            fattn = row.get(f"fattn_{direction}")
            if not fattn:
                continue
            ratios = [_ratio(fattn, row.get(f"{peer}_{direction}")) for peer in PEER_NAMES]
            lines.append(f"| {_case(row)} | {label} | {fattn:.0f} | " + " | ".join(ratios) + " |")
    return "\n".join(lines) + "\n"


def decode_table(data) -> str:
    """Decode rows (one query token): GB/s of K and V read, fattn's ratio to cuDNN and FA2."""
    lines = ["| batch x context | fattn GB/s | vs cuDNN | vs FA2 (SDPA) |", "|---|---|---|---|"]
    for row in (r for r in data["rows"] if r["kind"] == "decode"):
        lines.append(f"| {row['b']} x {row['L'] // 1024}k | {row['fattn']:.0f} | "
                     f"{_ratio(row['fattn'], row.get('sdpa_cudnn'))} | {_ratio(row['fattn'], row.get('sdpa_flash'))} |")
    return "\n".join(lines) + "\n"


def caption(data) -> str:
    return f"{data['device']}, torch {data['torch']}, bf16; one run, `{PEERS.relative_to(ROOT)}`.\n\n"


TABLES = {"peers-h200": lambda d: caption(d) + peers_table(d), "decode-h200": lambda d: caption(d) + decode_table(d)}


def render(text: str, data) -> str:
    return MARK.sub(lambda m: m.group(1) + TABLES[m.group("name")](data) + m.group(4), text)


def plot(data, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if r["kind"] == "prefill" and r["hq"] == r["hk"] and not r.get("window")
            and not r.get("softcap") and r["d"] in (64, 128)]
    fig, axes = plt.subplots(2, 4, figsize=(16, 7), sharex=True)
    for col, (d, causal) in enumerate([(64, False), (64, True), (128, False), (128, True)]):
        for line, direction in enumerate(("fwd", "bwd")):
            ax = axes[line][col]
            sel = sorted((r for r in rows if r["d"] == d and r["causal"] == causal), key=lambda r: r["s"])
            for impl in ("fattn", *PEER_NAMES):
                points = [(r["s"], r.get(f"{impl}_{direction}")) for r in sel if r.get(f"{impl}_{direction}")]
                if points:
                    ax.plot(*zip(*points), marker="o", linewidth=2.5 if impl == "fattn" else 1.2,
                            label=PEER_NAMES.get(impl, impl))
            ax.set_xscale("log", base=2)
            ax.set_title(f"d{d} {'causal' if causal else 'full'} {'forward' if direction == 'fwd' else 'backward'}")
            ax.set_ylabel("TFLOP/s")
    axes[0][0].legend()
    fig.suptitle(f"{data['device']}, torch {data['torch']}, bf16, 16k tokens per step, heads = 2048 / head dim")
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a marked table differs")
    parser.add_argument("--plot", action="store_true", help="also draw the peers plot")
    args = parser.parse_args(argv)
    data = json.loads(PEERS.read_text())
    stale = []
    for doc in DOCS:
        text = doc.read_text()
        new = render(text, data)
        if new != text:
            stale.append(doc.relative_to(ROOT))
            if not args.check:
                doc.write_text(new)
    if args.plot:
        plot(data, PEERS.with_name("forward_backward.png"))
    if args.check and stale:
        print("stale tables in " + ", ".join(map(str, stale)) + ": run python benchmarks/doc_tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
