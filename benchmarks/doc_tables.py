"""The docs' performance tables, generated from committed benchmark JSON so that they cannot drift
from the numbers.

    python benchmarks/doc_tables.py           # rewrites the marked tables in README.md and docs/performance.md
    python benchmarks/doc_tables.py --check   # exits 1 if a marked table differs from what the JSON gives
    python benchmarks/doc_tables.py --plot    # also redraws each run's plot beside it (benchmarks/plot.py)

A marked table sits between `<!-- table: NAME -->` and `<!-- end of table -->`; NAME picks the
generator below. The runs are benchmarks/results/peers_h200/{forward,backward,decode,fp8,variants}.json,
each one run of the benchmark CLI in benchmarks/common.py's schema: fattn's rows carry ratio =
peer's ms / fattn's ms per peer (above 1: fattn is faster); FP8 rows carry it against bf16 fattn
("fattn_bf16").
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "benchmarks" / "results" / "peers_h200"
NAMES = ("forward", "backward", "decode", "fp8", "variants")
DOCS = [ROOT / "README.md", ROOT / "docs" / "performance.md"]
PEER_NAMES = {"sdpa_cudnn": "cuDNN", "fa4": "FA4", "sdpa_flash": "FA2 (SDPA)", "flex": "Flex"}
MARK = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end of table -->)", re.S)


def load() -> dict:
    return {name: json.loads((RUNS / f"{name}.json").read_text()) for name in NAMES}


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def caption(runs, *names) -> str:
    run = runs[names[0]]
    files = ", ".join(f"`{(RUNS / f'{n}.json').relative_to(ROOT)}`" for n in names)
    return (f"{run['device']['name']}, torch {run['versions']['torch']}, fattn kernels by Triton "
            f"{run['versions'].get('fattn_kernels_triton', '?')}, bf16; one run each: {files}.\n\n")


def peers_table(runs, seqlens=None) -> str:
    """Training rows: fattn's TFLOP/s and its ratio to each peer, forward then backward, and the
    ratio to the faster of cuDNN and FA4 (the bar: at least 1); only `seqlens` where given."""
    head = ["case", "pass", "fattn TFLOP/s"] + [f"vs {n}" for n in PEER_NAMES.values()] + ["vs best of cuDNN, FA4"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_pass = {p: {(r["head_dim"], r["seqlen"], r["causal"]): r for r in runs[p]["rows"] if r["impl"] == "fattn"}
               for p in ("forward", "backward")}
    for key in sorted(by_pass["forward"], key=lambda k: (k[0], k[1], k[2])):
        if seqlens is not None and key[1] not in seqlens:
            continue
        for p in ("forward", "backward"):
            row = by_pass[p].get(key)
            if row is None or not row["ms"]:
                continue
            d, s, causal = key
            ratios = [row["ratio"].get(peer) for peer in PEER_NAMES]
            bars = [row["ratio"][peer] for peer in ("sdpa_cudnn", "fa4") if peer in row["ratio"]]
            lines.append(f"| d{d} {_k(s)}{' causal' if causal else ''} | {p} | {row['tflops']:.0f} | "
                         + " | ".join(map(_ratio, ratios)) + f" | {_ratio(min(bars) if bars else None)} |")
    return "\n".join(lines) + "\n"


def variants_table(runs) -> str:
    """The variants against the peers that compute them: fattn's TFLOP/s, its time over its
    plain run's, and its ratio to FA4 and Flex (window rows at 16k, the others at 8k)."""
    lines = ["| variant | pass | fattn TFLOP/s | time vs plain | vs FA4 | vs Flex |", "|---|---|---|---|---|---|"]
    for row in runs["variants"]["rows"]:
        if row["impl"] != "fattn" or not row["ms"] or row["study"] not in ("window", "score_mod"):
            continue
        if not ({"fa4", "flex"} & set(row["ratio"])) or row.get("mod") == "plain":
            continue
        if row["study"] == "window":
            what = f"{_k(row['seqlen'])} causal, " + ("no window" if row["window_left"] < 0 else
                                                      f"window {row['window_left']}")
            plain = None
        else:
            what = f"{_k(row['seqlen'])} {row['mod']}{' causal' if row['causal'] else ''}"
            plain = next((r for r in runs["variants"]["rows"] if r["study"] == "score_mod" and r["impl"] == "fattn"
                          and r.get("mod") == "plain" and r["pass"] == row["pass"] and r["causal"] == row["causal"]),
                         None)
        vs_plain = _ratio(row["ms"] / plain["ms"]) if plain and plain["ms"] else "-"
        lines.append(f"| {what} | {row['pass']} | {row['tflops']:.0f} | {vs_plain} | "
                     f"{_ratio(row['ratio'].get('fa4'))} | {_ratio(row['ratio'].get('flex'))} |")
    return "\n".join(lines) + "\n"


def decode_table(runs) -> str:
    """Decode (one query token): GB/s of K and V read, contiguous and paged caches, against cuDNN and FA2."""
    lines = ["| batch x context | fattn GB/s | vs cuDNN | vs FA2 (SDPA) | paged GB/s | paged vs cuDNN |",
             "|---|---|---|---|---|---|"]
    rows = runs["decode"]["rows"]
    for row in (r for r in rows if r["impl"] == "fattn" and r.get("num_splits", 0) == 0 and r["ms"]):
        paged = next((r for r in rows if r["impl"] == "fattn_paged" and r["batch"] == row["batch"]
                      and r["context"] == row["context"] and r.get("num_splits", 0) == 0 and r["ms"]), None)
        lines.append(f"| {row['batch']} x {_k(row['context'])} | {row['gb_s']:.0f} | "
                     f"{_ratio(row['ratio'].get('sdpa_cudnn'))} | {_ratio(row['ratio'].get('sdpa_flash'))} | "
                     + (f"{paged['gb_s']:.0f} | {_ratio(paged['ratio'].get('sdpa_cudnn'))} |" if paged else "- | - |"))
    return "\n".join(lines) + "\n"


def fp8_table(runs) -> str:
    """The FP8 forward: TFLOP/s of e4m3 and e5m2 inputs and their speedup over bf16 fattn."""
    lines = ["| case | bf16 TFLOP/s | e4m3 TFLOP/s | e4m3 / bf16 | e5m2 TFLOP/s | e5m2 / bf16 |",
             "|---|---|---|---|---|---|"]
    rows = runs["fp8"]["rows"]
    for bf16 in (r for r in rows if r["impl"] == "fattn" and r["ms"]):
        cells = []
        for fmt in ("e4m3", "e5m2"):
            fp8 = next((r for r in rows if r["impl"] == f"fattn-fp8-{fmt}" and r["ms"] and all(
                r[k] == bf16[k] for k in ("head_dim", "seqlen", "causal"))), None)
            cells += [f"{fp8['tflops']:.0f}", _ratio(fp8["ratio"].get("fattn_bf16"))] if fp8 else ["-", "-"]
        lines.append(f"| d{bf16['head_dim']} {_k(bf16['seqlen'])}{' causal' if bf16['causal'] else ''} | "
                     f"{bf16['tflops']:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


PROFILES = RUNS / "profiles"
PROFILE_FILES = ("forward_decode", "backward_fp8", "forward_fa4", "backward_fa4", "variants")


def _profiles():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import profile_rows

    return profile_rows, [PROFILES / f"{name}.json" for name in PROFILE_FILES]


def profiles_mix_table(_runs) -> str:
    """fattn's instructions over the faster peer's, in all and by pipe (profile_rows.mix_table)."""
    profile_rows, paths = _profiles()
    return profile_rows.mix_table(paths) + "\n"


def profiles_table(_runs) -> str:
    """What bounds each row: benchmarks/profile_rows.py's table over the profiles of record."""
    profile_rows, paths = _profiles()
    runs = [json.loads(p.read_text()) for p in paths]
    versions = runs[0]["versions"]
    fa4 = next((r["versions"]["flash_attn_4"] for r in runs if r["versions"].get("flash_attn_4")), "-")
    files = ", ".join(f"`{p.relative_to(ROOT)}`" for p in paths)
    return (f"{runs[0]['device']['name']}, torch {versions['torch']}, fattn kernels by Triton "
            f"{versions.get('fattn_kernels_triton', '?')}, FA4 {fa4}, "
            f"Nsight Compute, one call per row: {files}.\n\n" + profile_rows.table(paths) + "\n")


TABLES = {
    # The front page: three lengths; docs/performance.md: every length the runs hold.
    "peers-h200": lambda r: caption(r, "forward", "backward") + peers_table(r, seqlens=(1024, 4096, 16384)),
    "peers-h200-all": lambda r: caption(r, "forward", "backward") + peers_table(r),
    "variants-h200": lambda r: caption(r, "variants") + variants_table(r),
    "decode-h200": lambda r: caption(r, "decode") + decode_table(r),
    "fp8-h200": lambda r: caption(r, "fp8") + fp8_table(r),
    "profiles-h200": profiles_table,
    "profiles-mix-h200": profiles_mix_table,
}


def render(text: str, runs) -> str:
    return MARK.sub(lambda m: m.group(1) + TABLES[m.group("name")](runs) + m.group(4), text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a marked table differs")
    parser.add_argument("--plot", action="store_true", help="also redraw each run's plot beside it")
    args = parser.parse_args(argv)
    runs = load()
    stale = []
    for doc in DOCS:
        text = doc.read_text()
        new = render(text, runs)
        if new != text:
            stale.append(doc.relative_to(ROOT))
            if not args.check:
                doc.write_text(new)
    if args.plot:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from plot import plot

        for name in NAMES:
            plot(RUNS / f"{name}.json")
    if args.check and stale:
        print("stale tables in " + ", ".join(map(str, stale)) + ": run python benchmarks/doc_tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
