"""Plots bench_variants.py's JSON: fattn's time per variant, forward and backward.

    python benchmarks/plot_variants.py benchmarks/results/variants_h100/variants.json   # writes variants.png

Left: the window study (time against the window at a fixed sequence length; -1 is full causal),
fattn solid, FlexAttention dashed where it ran.
Middle: the score_mod study (time of plain attention, softcap, ALiBi and both, causal and not).
Right: the varlen study (the packed batch against its padded equivalent, per implementation).
"""

import argparse
import json
from pathlib import Path

from plot import pyplot


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="PNG path (default: beside the JSON)")
    args = parser.parse_args()
    data = json.loads(args.json.read_text())
    rows = [r for r in data["rows"] if r["impl"] == "fattn" and r["ms"]]
    plt = pyplot()
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(17, 4.5))
    for direction, marker in (("forward", "o"), ("backward", "s")):
        for impl, style in (("fattn", "-"), ("flex", "--")):
            win = [r for r in data["rows"] if r["study"] == "window" and r["pass"] == direction and r["impl"] == impl
                   and r["ms"]]
            labels = [str(r["window_left"]) if r["window_left"] >= 0 else "causal" for r in win]
            if win:
                left.plot(labels, [r["ms"] for r in win], style, marker=marker, label=f"{impl} {direction}")
    windows = [r for r in rows if r["study"] == "window"]
    if windows:
        left.set_title(f"window (left, 0) at {windows[0]['seqlen']} tokens, d{windows[0]['head_dim']}")
    left.set_xlabel("window_left")
    left.set_ylabel("ms per call (lower is better)")
    left.legend(fontsize=7)
    mods = [r for r in rows if r["study"] == "score_mod"]
    cases = list(dict.fromkeys((r["mod"], r["causal"]) for r in mods))
    width = 0.4
    for i, direction in enumerate(("forward", "backward")):
        ms = {(r["mod"], r["causal"]): r["ms"] for r in mods if r["pass"] == direction}
        middle.bar([c + (i - 0.5) * width for c in range(len(cases))], [ms.get(c, 0) for c in cases], width,
                   label=direction)
    middle.set_xticks(range(len(cases)), [f"{m}\n{'causal' if c else 'full'}" for m, c in cases], fontsize=7)
    middle.set_title("fattn: softcap 30 / ALiBi at 8k tokens")
    middle.set_ylabel("ms per call (lower is better)")
    middle.legend()
    varlen = [r for r in data["rows"] if r["study"] == "varlen" and r["ms"]]
    impls = list(dict.fromkeys(r["impl"] for r in varlen))
    for i, direction in enumerate(("forward", "backward")):
        ms = {r["impl"]: r["ms"] for r in varlen if r["pass"] == direction}
        right.bar([c + (i - 0.5) * width for c in range(len(impls))], [ms.get(c, 0) for c in impls], width,
                  label=direction)
    right.set_xticks(range(len(impls)), [i.replace("-", "\n", 1) for i in impls], fontsize=7)
    if varlen:
        right.set_title(f"causal varlen batch of {varlen[0]['batch']} (longest {varlen[0]['max_seqlen']}) vs padded")
    right.set_ylabel("ms per call (lower is better)")
    right.legend()
    fig.suptitle(f"{data['device']['name']}, torch {data['versions']['torch']}: fattn attention variants")
    fig.tight_layout()
    out = args.out or args.json.with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
