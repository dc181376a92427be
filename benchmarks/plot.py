"""Plots a benchmark JSON from bench_attention.py as TFLOP/s against sequence length.

    python benchmarks/plot.py benchmarks/results/forward_h100.json   # writes forward_h100.png

Reads the results schema of benchmarks/common.py, and the layout of the forward and backward
JSON in benchmarks/results/ (rows holding a "tflops" dict per case, the environment under "env").
A decode JSON (from bench_decode.py) is handed to plot_decode.py (GB/s against context).
"""

import argparse
import json
import sys
from pathlib import Path


def pyplot():
    """matplotlib, imported when a plot is drawn, so that --help works without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def flat_rows(data):
    """[{head_dim, seqlen, causal, impl, tflops}], whichever layout the file has."""
    rows = data["rows"]
    if rows and "impl" in rows[0]:
        return [r for r in rows if r.get("tflops")]
    return [{"head_dim": r["d"], "seqlen": r["s"], "causal": r["causal"], "impl": impl, "tflops": tf}
            for r in rows for impl, tf in r["tflops"].items() if tf]


def title(data):
    if "env" in data:
        device, torch_version = data["env"]["device"], data["env"]["torch"]
    else:
        device, torch_version = data["device"]["name"], data["versions"]["torch"]
    return f"{device}, torch {torch_version}, bf16, hidden {data.get('config', {}).get('hidden', 2048)}"


def plot(path, out=None):
    path = Path(path)
    data = json.loads(path.read_text())
    if data.get("benchmark") == "decode":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import plot_decode
        return plot_decode.plot(path, out=out)
    rows = flat_rows(data)
    plt = pyplot()
    panels = sorted({(r["head_dim"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, (d, causal) in zip(axes, panels):
        sel = [r for r in rows if r["head_dim"] == d and r["causal"] == causal]
        for impl in dict.fromkeys(r["impl"] for r in sel):
            pts = sorted((r["seqlen"], r["tflops"]) for r in sel if r["impl"] == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                    linewidth=2.5 if impl == "fattn" else 1.2, label=impl)
        ax.set_xscale("log", base=2)
        ax.set_title(f"d={d} {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("sequence length (16k tokens per batch)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"{data['benchmark']} TFLOP/s")
    axes[0].legend()
    fig.suptitle(title(data), fontsize=10)
    fig.tight_layout()
    out = Path(out) if out else path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {out}")
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="image path (default: the JSON's, .png)")
    args = parser.parse_args(argv)
    plot(args.json, args.out)


if __name__ == "__main__":
    main()
