"""Plots a benchmark JSON (from bench_attention.py) as TFLOP/s against sequence length.

    python benchmarks/plot.py benchmarks/results/forward_h100.json   # writes forward_h100.png

A decode JSON (from bench_decode.py) is handed to plot_decode.py (GB/s against context).
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path):
    path = Path(path)
    data = json.loads(path.read_text())
    if data.get("benchmark") == "decode":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import plot_decode
        return plot_decode.plot(path)
    rows = data["rows"]
    panels = sorted({(r["d"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), sharey=True)
    for ax, (d, causal) in zip(axes, panels):
        sel = [r for r in rows if r["d"] == d and r["causal"] == causal]
        for impl in sel[0]["tflops"]:
            pts = [(r["s"], r["tflops"][impl]) for r in sel if r["tflops"].get(impl)]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                    linewidth=2.5 if impl == "fattn" else 1.2, label=impl)
        ax.set_xscale("log", base=2)
        ax.set_title(f"d={d} {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("sequence length (16k tokens per batch)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"{data['benchmark']} TFLOP/s")
    axes[0].legend()
    env = data["env"]
    fig.suptitle(f"{env['device']}, torch {env['torch']}, bf16, hidden 2048", fontsize=10)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1])
