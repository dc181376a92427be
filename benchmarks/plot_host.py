"""Plots bench_host.py's JSON: microseconds per eager call, fattn against SDPA, per case.

    python benchmarks/plot_host.py benchmarks/results/host_h100.json   # writes host_h100.png
"""

import argparse
import json
from pathlib import Path

from plot import pyplot

IMPLS = ("fattn", "fattn_op", "sdpa_flash", "sdpa_cudnn")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="PNG path (default: beside the JSON)")
    args = parser.parse_args()
    data = json.loads(args.json.read_text())
    us = {}
    for r in data["rows"]:
        if r.get("us_per_call"):
            case = f"{r['op']}\ns{r['seqlen_q']} d{r['head_dim']}"
            us.setdefault(case, {})[r["impl"]] = r["us_per_call"]
    cases = list(us)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(cases)), 4.5))
    width = 0.8 / len(IMPLS)
    for i, impl in enumerate(IMPLS):
        xs = [c + (i - 1.5) * width for c in range(len(cases))]
        ax.bar(xs, [us[c].get(impl, 0) for c in cases], width, label=impl)
    ax.set_xticks(range(len(cases)), cases, fontsize=7)
    ax.set_ylabel("host time per call (us, lower is better)")
    ax.set_title(f"{data['device']['name']}, torch {data['versions']['torch']}: eager host cost per call")
    ax.legend()
    fig.tight_layout()
    out = args.out or args.json.with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
