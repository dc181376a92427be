"""Draws a benchmark JSON as a PNG beside it (or at --out); what ran picks the plot.

    python benchmarks/plot.py benchmarks/results/forward_h100.json          # TFLOP/s against length
    python benchmarks/plot.py benchmarks/results/decode_h100.json           # GB/s against context
    python benchmarks/plot.py decode.json --num-splits 0                     # fattn at one num_splits
    python benchmarks/plot.py benchmarks/results/host_h100.json             # microseconds per eager call
    python benchmarks/plot.py benchmarks/results/variants_h100/variants.json  # what the variants cost

The JSON's "benchmark" field says what ran (benchmarks/common.py's results schema):
- forward, backward (bench_attention.py): TFLOP/s against sequence length, a panel per head dim
  and causal flag, a line per implementation;
- decode (bench_decode.py): GB/s of K+V read against context, a panel per batch size; fattn
  contiguous and paged, SDPA flash and cuDNN, and the read ceiling measured in the same run
  (dashed). fattn's line uses num_splits 0 (automatic) when the run has it, else the best value of
  the sweep at each point; --num-splits picks one value. Rows that failed are left out;
- host (bench_host.py): microseconds per eager call, fattn against SDPA, per case;
- variants (bench_variants.py): fattn's time per window (FlexAttention dashed where it ran), per
  score modification (forward and backward), and the packed batch against its padded equivalent.

Older layouts are read too: benchmarks/results/forward_h100.json's (rows holding a "tflops" dict
per case, the environment under "env") and benchmarks/results/decode_h100.json's (GB/s as
"GBps", the settings under "setting" and "environment").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def pyplot():
    """matplotlib, imported when a plot is drawn, so that --help works without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def run_title(data) -> str:
    """The device and torch version, whichever layout the file has."""
    if "env" in data:
        return f"{data['env']['device']}, torch {data['env']['torch']}"
    if "environment" in data:
        return f"{data['environment'].get('device', '?')}, torch {data['environment'].get('torch', '?')}"
    return f"{data['device']['name']}, torch {data['versions']['torch']}"


# ----------------------------------------------------------------------------- forward, backward


def attention_rows(data):
    """[{head_dim, seqlen, causal, impl, tflops}], whichever layout the file has."""
    rows = data["rows"]
    if rows and "impl" in rows[0]:
        return [r for r in rows if r.get("tflops")]
    return [{"head_dim": r["d"], "seqlen": r["s"], "causal": r["causal"], "impl": impl, "tflops": tf}
            for r in rows for impl, tf in r["tflops"].items() if tf]


def plot_attention(plt, data, options):
    rows = attention_rows(data)
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
    hidden = data.get("config", {}).get("hidden", 2048)
    fig.suptitle(f"{run_title(data)}, bf16, hidden {hidden}", fontsize=10)
    return fig


# ----------------------------------------------------------------------------- decode

DECODE_LINES = [  # impl, label, style
    ("fattn", "fattn (contiguous)", {"linewidth": 2.5, "marker": "o"}),
    ("fattn_paged", "fattn (paged)", {"linewidth": 2.0, "marker": "s"}),
    ("sdpa_flash", "SDPA flash", {"linewidth": 1.2, "marker": "^"}),
    ("sdpa_cudnn", "SDPA cuDNN", {"linewidth": 1.2, "marker": "v"}),
    ("ceiling", "read ceiling (reduction)", {"linewidth": 1.2, "linestyle": "--", "marker": "x", "color": "black"}),
]


def _gb_s(row):
    return row.get("gb_s", row.get("GBps"))


def decode_points(rows, impl, num_splits):
    """(context, GB/s) of one implementation; fattn rows filtered or maximised over num_splits."""
    by_ctx = {}
    for r in rows:
        if r.get("impl") != impl or not _gb_s(r):
            continue
        if impl.startswith("fattn") and num_splits is not None and r.get("num_splits") != num_splits:
            continue
        if r["context"] not in by_ctx or _gb_s(r) > by_ctx[r["context"]]:
            by_ctx[r["context"]] = _gb_s(r)
    return sorted(by_ctx.items())


def _decode_settings(data):
    """(suptitle, the num_splits values the run swept)."""
    settings = data.get("setting") or data["config"]
    splits = settings.get("num_splits", [0]) if "setting" in data else settings.get("splits", [0])
    row = data["rows"][0] if data["rows"] else {}
    heads, kv_heads, d = (row.get(k, settings.get(k, "?")) for k in ("heads", "kv_heads", "head_dim"))
    text = (f"decode, {run_title(data)}, bf16, {heads} q / {kv_heads} kv heads, d{d}, "
            f"page {settings.get('page_size', '?')}, {'CUDA graphs' if settings.get('graph', True) else 'eager'}")
    return text, splits


def _context(n):
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def plot_decode(plt, data, options):
    rows = [r for r in data["rows"] if r.get("batch") is not None]
    suptitle, splits = _decode_settings(data)
    num_splits = options.num_splits
    if num_splits is None and 0 in splits:
        num_splits = 0
    batches = sorted({r["batch"] for r in rows})
    if not batches:
        raise SystemExit("a decode run without rows: nothing to plot")
    fig, axes = plt.subplots(1, len(batches), figsize=(4.6 * len(batches), 3.8), squeeze=False)
    axes = axes[0]
    for ax, b in zip(axes, batches):
        sel = [r for r in rows if r["batch"] == b]
        missing = []
        for impl, label, style in DECODE_LINES:
            pts = decode_points(sel, impl, num_splits)
            if not pts:
                if any(r.get("impl") == impl for r in sel):
                    missing.append(label)
                continue
            if impl.startswith("fattn") and len(splits) > 1:
                label += f" (n={num_splits})" if num_splits is not None else " (best n)"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
        contexts = sorted({r["context"] for r in sel})
        ax.set_xscale("log", base=2)
        ax.set_xticks(contexts)
        ax.set_xticklabels([_context(c) for c in contexts], rotation=45 if len(contexts) > 5 else 0)
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
    return fig


# ----------------------------------------------------------------------------- host

HOST_IMPLS = ("fattn", "fattn_op", "sdpa_flash", "sdpa_cudnn")


def plot_host(plt, data, options):
    us = {}
    for r in data["rows"]:
        if r.get("us_per_call"):
            us.setdefault(f"{r['op']}\ns{r['seqlen_q']} d{r['head_dim']}", {})[r["impl"]] = r["us_per_call"]
    cases = list(us)
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(cases)), 4.5))
    width = 0.8 / len(HOST_IMPLS)
    for i, impl in enumerate(HOST_IMPLS):
        xs = [c + (i - 1.5) * width for c in range(len(cases))]
        ax.bar(xs, [us[c].get(impl, 0) for c in cases], width, label=impl)
    ax.set_xticks(range(len(cases)), cases, fontsize=7)
    ax.set_ylabel("host time per call (us, lower is better)")
    ax.set_title(f"{run_title(data)}: eager host cost per call")
    ax.legend()
    return fig


# ----------------------------------------------------------------------------- variants


def plot_variants(plt, data, options):
    rows = [r for r in data["rows"] if r["impl"] == "fattn" and r["ms"]]
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
    fig.suptitle(f"{run_title(data)}: fattn attention variants")
    return fig


PLOTS = {"forward": plot_attention, "backward": plot_attention, "decode": plot_decode, "host": plot_host,
         "variants": plot_variants}


def plot(path, out=None, num_splits=None) -> Path:
    path = Path(path)
    data = json.loads(path.read_text())
    draw = PLOTS.get(data.get("benchmark"))
    if draw is None:
        raise SystemExit(f"{path}: no plot for benchmark {data.get('benchmark')!r} (plots: {', '.join(PLOTS)})")
    plt = pyplot()
    fig = draw(plt, data, argparse.Namespace(num_splits=num_splits))
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
    parser.add_argument("--num-splits", type=int, default=None, help="decode: fattn rows with this num_splits only")
    args = parser.parse_args(argv)
    plot(args.json, args.out, args.num_splits)


if __name__ == "__main__":
    main()
