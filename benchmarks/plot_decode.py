"""Plots a decode benchmark JSON (from bench_decode.py) as GB/s of K+V read against context length.

    python benchmarks/plot_decode.py benchmarks/results/decode_h100.json   # writes decode_h100.png
    python benchmarks/plot_decode.py decode.json --num-splits 0            # fattn at one num_splits

One panel per batch size; one line per implementation (fattn contiguous, fattn paged, SDPA
flash, SDPA cuDNN) and the device's read ceiling measured in the same run (dashed). Rows
that failed (a backend that refused, a wrong result) are left out of their line. fattn's
line uses num_splits 0 (automatic) when the run has it, else the best value of the sweep
at each point; --num-splits picks one value.

Reads the results schema of benchmarks/common.py, and the layout of
benchmarks/results/decode_h100.json (GB/s as "GBps", the settings under "setting" and "environment").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LINES = [  # impl, label, style
    ("fattn", "fattn (contiguous)", {"linewidth": 2.5, "marker": "o"}),
    ("fattn_paged", "fattn (paged)", {"linewidth": 2.0, "marker": "s"}),
    ("sdpa_flash", "SDPA flash", {"linewidth": 1.2, "marker": "^"}),
    ("sdpa_cudnn", "SDPA cuDNN", {"linewidth": 1.2, "marker": "v"}),
    ("ceiling", "read ceiling (reduction)", {"linewidth": 1.2, "linestyle": "--", "marker": "x", "color": "black"}),
]


def fmt_ctx(n):
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def gb_s(row):
    return row.get("gb_s", row.get("GBps"))


def points(rows, impl, num_splits):
    """(context, GB/s) of one implementation; fattn rows filtered or maximised over num_splits."""
    by_ctx = {}
    for r in rows:
        if r.get("impl") != impl or not gb_s(r):
            continue
        if impl.startswith("fattn") and num_splits is not None and r.get("num_splits") != num_splits:
            continue
        if r["context"] not in by_ctx or gb_s(r) > by_ctx[r["context"]]:
            by_ctx[r["context"]] = gb_s(r)
    return sorted(by_ctx.items())


def title(data):
    if "setting" in data:  # the layout of benchmarks/results/decode_h100.json
        env, st = data.get("environment", {}), data["setting"]
        device, torch_version, splits = env.get("device", "?"), env.get("torch", "?"), st.get("num_splits", [0])
    else:
        st = data["config"]
        device, torch_version, splits = data["device"]["name"], data["versions"]["torch"], st.get("splits", [0])
    row = data["rows"][0] if data["rows"] else {}
    heads, kv_heads, d = (row.get(k, st.get(k, "?")) for k in ("heads", "kv_heads", "head_dim"))
    text = (f"decode, {device}, torch {torch_version}, bf16, {heads} q / {kv_heads} kv heads, d{d}, "
            f"page {st.get('page_size', '?')}, {'CUDA graphs' if st.get('graph', True) else 'eager'}")
    return text, splits


def plot(path, num_splits=None, out=None):
    path = Path(path)
    data = json.loads(path.read_text())
    rows = [r for r in data["rows"] if r.get("batch") is not None]
    suptitle, splits = title(data)
    if num_splits is None and 0 in splits:
        num_splits = 0
    batches = sorted({r["batch"] for r in rows})
    if not batches:
        raise SystemExit(f"{path}: no rows to plot")
    import matplotlib  # here, so that --help works without it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(batches), figsize=(4.6 * len(batches), 3.8), squeeze=False)
    axes = axes[0]
    for ax, b in zip(axes, batches):
        sel = [r for r in rows if r["batch"] == b]
        missing = []
        for impl, label, style in LINES:
            pts = points(sel, impl, num_splits)
            if not pts:
                if any(r.get("impl") == impl for r in sel):
                    missing.append(label)
                continue
            if impl.startswith("fattn") and len(splits) > 1:
                label += f" (n={num_splits})" if num_splits is not None else " (best n)"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
        ctxs = sorted({r["context"] for r in sel})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ctxs)
        ax.set_xticklabels([fmt_ctx(c) for c in ctxs], rotation=45 if len(ctxs) > 5 else 0)
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_title(f"batch {b}")
        if missing:  # a backend that refused every case of the panel (its errors are in the JSON)
            ax.text(0.02, 0.02, "no data: " + ", ".join(missing), transform=ax.transAxes, fontsize=7)
        ax.set_xlabel("context (tokens per sequence)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s of K+V read")
    axes[0].legend(fontsize=8)
    fig.suptitle(suptitle, fontsize=9)
    fig.tight_layout()
    out = Path(out) if out else path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {out}")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", type=Path)
    p.add_argument("--num-splits", type=int, default=None, help="fattn rows with this num_splits only")
    p.add_argument("--out", type=Path, default=None, help="image path (default: the JSON's, .png)")
    args = p.parse_args(argv)
    plot(args.json, args.num_splits, args.out)


if __name__ == "__main__":
    main()
