"""What bounds each row of the speed bars: Nsight Compute over one call of fattn and of each peer,
for every row of the forward, backward, decode, FP8 and variant (window, softcap) runs of record.

    python benchmarks/profile_rows.py --sets forward,decode --impls fattn,sdpa_cudnn \\
        --out benchmarks/results/peers_h200/profiles/forward_decode.json
    python benchmarks/profile_rows.py --sets backward --impls fa4 --out .../backward_fa4.json
    python benchmarks/profile_rows.py --table benchmarks/results/peers_h200/profiles/*.json
    python benchmarks/profile_rows.py --dry-run --sets forward     # the row list; no GPU needed

The rows are the benchmark CLIs' own shapes (bench_attention.py: bf16, 16k tokens per step, hidden
2048; bench_decode.py: 32 query heads over 8 KV heads, d128, one token; the FP8 rows: e4m3 with a
descale per sequence and head; bench_variants.py's window and softcap rows). One process runs them
all under ncu (`--profile-from-start off`): each row's call runs twice outside the profiled range
(module loads, FA4's compiles, cuDNN's plan), then once inside a cudaProfilerStart/Stop range
opened by a marker kernel (torch.cuda._sleep), so the kernels after marker i are row i's. The
backward's range holds the gradient computation only (autograd.grad of a kept forward graph, as
bench_attention.py times it).

Each kernel keeps the metrics that say what bounds it (METRIC_PATTERNS, ncu's raw names): time,
the SMs' and DRAM's throughput, the tensor pipe's busy cycles, the L2 hit rate, cycles between a
warp's instructions and what they were stalled on, registers, spills, and the instructions
executed, in all and by pipe. --table prints two tables: per row, fattn's call against the faster
peer's and the bound its longest kernel points to (`bound_of`); and each call's instructions over
the faster peer's (`mix_table`). Clocks are left to the GPU (--clock-control none), as in the
timed runs, so durations compare with the JSON results; ncu serialises kernels, so they are a
single call's, not the steady state's.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECTIONS = ["SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "WarpStateStats",
            "LaunchStats", "Occupancy"]
# The pipes whose instruction counts tell the kernels' work apart: uniform (the warp-uniform
# datapath: loop counters, addresses, barrier and mbarrier bookkeeping), adu (branches, CTA
# barriers, constant loads), fma and alu (FP32 and integer arithmetic), xu (exp2, conversions),
# lsu (shared and global memory), the warpgroup MMA.
PIPES = ("uniform", "adu", "fma", "alu", "xu", "lsu", "tensor_op_gmma")
# The raw metric names kept per kernel (the sections collect several hundred).
METRIC_PATTERNS = [r"^gpu__time_duration\.sum$", r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$",
                   r"^gpu__dram_throughput\.avg\.pct_of_peak_sustained_elapsed$", r"^dram__bytes\.sum\.per_second$",
                   r"^lts__t_sector_hit_rate\.pct$", r"^smsp__average_warp_latency_per_inst_issued\.ratio$",
                   r"^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$",
                   r"^smsp__issue_active\.avg\.per_cycle_active$", r"^sm__warps_active\.avg\.pct_of_peak_sustained_active$",
                   r"^sm__pipe_tensor\S*_cycles_active\.avg\.pct_of_peak_sustained_active$",
                   r"^launch__(registers_per_thread|grid_size|block_size|shared_mem_per_block_allocated)$",
                   r"^derived__local_spilling_requests$", r"^sass__inst_executed_register_spilling$",
                   r"^sass__inst_executed_per_opcode$", rf"^sm__inst_executed_pipe_({'|'.join(PIPES)})\.avg\."
                   r"pct_of_peak_sustained_elapsed$"]
TENSOR_METRIC = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"  # every tensor op, wgmma included
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel: opens each row's profiled range
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(.*)_per_issue_active\.ratio$")
SETS = ("forward", "backward", "decode", "fp8", "variants")
IMPLS = ("fattn", "sdpa_cudnn", "fa4")


# ----------------------------------------------------------------------------- rows


def rows_of(sets: list[str]) -> list[dict]:
    rows = []
    for direction in ("forward", "backward"):
        if direction in sets:
            rows += [dict(set=direction, head_dim=d, seqlen=s, causal=c) for d in (64, 128) for c in (False, True)
                     for s in (1024, 2048, 4096, 8192, 16384)]
    if "decode" in sets:
        from bench_decode import DEFAULT_CASES
        from common import parse_size
        rows += [dict(set="decode", batch=b, context=parse_size(c), paged=paged)
                 for b, contexts in DEFAULT_CASES.items() for c in contexts for paged in (False, True)]
    if "fp8" in sets:
        rows += [dict(set="fp8", head_dim=d, seqlen=s, causal=c) for d in (128, 256) for c in (False, True)
                 for s in (4096, 8192, 16384)]
    if "variants" in sets:  # bench_variants.py's rows against FA4: windows at 16k causal, softcap 30 at 8k
        for direction in ("forward", "backward"):
            rows += [dict(set="variants", direction=direction, head_dim=128, seqlen=16384, causal=True, window=w,
                          softcap=0.0) for w in (1024, 4096)]
            rows += [dict(set="variants", direction=direction, head_dim=128, seqlen=8192, causal=c, window=-1,
                          softcap=30.0) for c in (False, True)]
    return rows


def row_name(row: dict) -> str:
    if row["set"] == "variants":
        what = f"window {row['window']}" if row["window"] >= 0 else f"softcap {row['softcap']:g}"
        return (f"{row['direction']} {what} (d{row['head_dim']} {row['seqlen'] // 1024}k"
                f"{' causal' if row['causal'] else ''})")
    if row["set"] == "decode":
        return f"decode b{row['batch']} {row['context'] // 1024}k{' paged' if row['paged'] else ''}"
    return f"{row['set']} d{row['head_dim']} {row['seqlen'] // 1024}k {'causal' if row['causal'] else 'non-causal'}"


def impls_of(row: dict, impls: list[str]) -> list[str]:
    """FP8 rows compare fattn's e4m3 call with its bf16 one; decode has no FA4 row; a paged decode
    row is fattn's alone (the peers read the contiguous cache of the row before it)."""
    if row["set"] == "fp8":
        return ["fattn_fp8", "fattn"]
    if row["set"] == "decode":
        return ["fattn"] if row["paged"] else [i for i in impls if i != "fa4"]
    if row["set"] == "variants":  # SDPA has neither a sliding window nor a softcap
        return [i for i in impls if i != "sdpa_cudnn"]
    return impls


def attention_call(row, impl):
    import torch
    from bench_attention import fp8_impls, make_impls, timed_call
    d, s, causal = row["head_dim"], row["seqlen"], row["causal"]
    b, h = max(1, 16384 // s), 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    if impl == "fattn_fp8":
        fn = fp8_impls(q, k, v, causal)["fattn-fp8-e4m3"]
    elif row["set"] == "variants":  # as bench_variants.py calls them
        import fattn
        from common import fa4_peer
        options = dict(softcap=row["softcap"]) if row["softcap"] else dict(window_size=(row["window"], 0))
        call = fattn.flash_attn_func if impl == "fattn" else fa4_peer("cuda")
        fn = (lambda q, k, v, *_: call(q, k, v, causal=causal, **options))
    else:
        fn = make_impls(causal, False, "cuda", use_fa4=impl == "fa4")[impl]
    direction = row.get("direction") or ("backward" if row["set"] == "backward" else "forward")
    return timed_call(fn, direction, (q, k, v, qt, kt, vt))


def decode_call(row, impl):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import fattn
    from bench_decode import HEAD_DIM, HEADS, KV_HEADS
    from common import paginate
    b, ctx = row["batch"], row["context"]
    q = torch.randn(b, 1, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, b, ctx, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    if impl == "sdpa_cudnn":
        qt, kt, vt = q.transpose(1, 2).contiguous(), kv[0].transpose(1, 2), kv[1].transpose(1, 2)

        def call():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        return call
    if row["paged"]:
        (k, v), table = paginate(kv, 256)
        return lambda: fattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, block_table=table)
    return lambda: fattn.flash_attn_with_kvcache(q, kv[0], kv[1], cache_seqlens=seqlens)


def run_rows(rows: list[dict], impls: list[str], manifest: Path, budget_s: float) -> None:
    """The process ncu profiles: every (row, impl) call, each in its own profiled range. Past
    budget_s the rest are recorded as not profiled, and the process ends normally, so that ncu
    writes what it measured (it writes nothing when killed)."""
    import torch
    done, start = [], time.monotonic()
    for row in rows:
        for impl in impls_of(row, impls):
            entry = dict(row, impl=impl, error=None, marked=False)
            if time.monotonic() - start > budget_s:
                entry["error"] = f"not profiled: the run's budget of {budget_s:.0f} s was spent"
                done.append(entry)
                continue
            try:
                call = (decode_call if row["set"] == "decode" else attention_call)(row, impl)
                call(), call()
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                torch.cuda._sleep(1000)
                entry["marked"] = True
                call()
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
                del call
            except Exception as e:  # noqa: BLE001  (a peer without this shape, FA4 not installed)
                torch.cuda.profiler.stop()
                entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            done.append(entry)
            print(f"{row_name(row)} {impl}: {entry['error'] or 'profiled'} ({time.monotonic() - start:.0f} s)",
                  flush=True)
            torch.cuda.empty_cache()
    manifest.write_text(json.dumps(done))


# ----------------------------------------------------------------------------- ncu's output


def number(text: str):
    """A metric's value: a float to 4 significant digits (ncu prints more than it measures), or the
    text where it is not a number ("n/a")."""
    text = text.strip().replace(",", "")
    try:
        return float(f"{float(text):.4g}")
    except ValueError:
        return text or None


def kept(name: str, value) -> bool:
    """Of METRIC_PATTERNS' metrics, all but the stall reasons that cost a warp under 0.05 cycles."""
    return not (STALL.match(name) and isinstance(value, float) and value < 0.05)


def read_raw_csv(text: str) -> tuple[list[dict], dict]:
    """ncu --csv --page raw: a header line, a units line, then one line per kernel (lines that do
    not start with a quote, ncu's own ==PROF== messages, are skipped). Returns the kernels, each
    with the metrics METRIC_PATTERNS keep, and those metrics' units."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    if len(lines) < 2:
        return [], {}
    table = list(csv.reader(lines))
    header, units = table[0], table[1]
    column = {h: i for i, h in enumerate(header)}
    name = column.get("Kernel Name", column.get("Function Name"))
    keep = [i for i, h in enumerate(header) if any(re.search(p, h) for p in METRIC_PATTERNS)]
    kernels = []
    for values in table[2:]:
        metrics = {header[i]: number(values[i]) for i in keep if i < len(values)}
        kernels.append({"name": values[name][:160], "metrics": {n: v for n, v in metrics.items() if kept(n, v)}})
    return kernels, {header[i]: units[i] for i in keep if units[i]}


def assign_kernels(manifest: list[dict], kernels: list[dict]) -> list[dict]:
    """The kernels after the i-th marker belong to the i-th profiled entry of the manifest."""
    groups, current = [], None
    for k in kernels:
        if MARKER in k["name"]:
            current = []
            groups.append(current)
        elif current is not None:
            current.append(k)
    profiled = [e for e in manifest if e["marked"]]
    if len(groups) != len(profiled):
        raise SystemExit(f"{len(groups)} profiled ranges in ncu's output, {len(profiled)} in the manifest: "
                         "the run was cut short or a range lost its marker")
    for entry, group in zip(profiled, groups):
        entry["kernels"] = group
    return manifest


def packed(entries: list[dict], units: dict) -> dict:
    """The entries as stored: the metric names once, each kernel's values in their order (None
    where a kernel lacks one), which keeps a run's file a tenth of the size of one dict per kernel."""
    names = sorted({n for e in entries for k in e.get("kernels", []) for n in k["metrics"]})
    stored = [dict(e, kernels=[{"name": k["name"], "values": [k["metrics"].get(n) for n in names]}
                               for k in e["kernels"]]) if "kernels" in e else e for e in entries]
    return {"metrics": names, "units": [units.get(n, "") for n in names], "entries": stored}


def unpacked(run: dict) -> list[dict]:
    """A stored run's entries with each kernel's metrics as a dict again."""
    names = run["metrics"]
    return [dict(e, kernels=[{"name": k["name"], "metrics": {n: v for n, v in zip(names, k["values"]) if v is not None}}
                             for k in e["kernels"]]) if "kernels" in e else e for e in run["entries"]]


def ncu_command(ncu: str, log: Path, child: list[str]) -> list[str]:
    sections = [a for s in SECTIONS for a in ("--section", s)]
    return [ncu, "--profile-from-start", "off", "--clock-control", "none", "--csv", "--page", "raw",
            "--print-units", "base", "--log-file", str(log), *sections, *child]


def tensor_metrics(ncu: str) -> list[str]:
    """The tensor pipe's busy-cycle metrics this GPU has (Hopper: the warpgroup MMA pipe beside the
    older ones), asked of ncu, since their names differ by chip and a name ncu lacks fails the run."""
    out = subprocess.run([ncu, "--query-metrics"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    names = sorted({m for m in re.findall(r"^(sm__pipe_tensor\S*_cycles_active)\b", out, re.MULTILINE)})
    return [f"{n}.avg.pct_of_peak_sustained_active" for n in names]


# ----------------------------------------------------------------------------- the table

# Whom each set's rows are measured against: the faster of these under ncu.
PEERS = {"forward": ("fa4", "sdpa_cudnn"), "backward": ("fa4", "sdpa_cudnn"), "decode": ("sdpa_cudnn",),
         "fp8": ("fattn",), "variants": ("fa4",)}


def kernel_time_us(k: dict) -> float:
    return (k["metrics"].get("gpu__time_duration.sum") or 0) / 1e3


def summary(entry: dict) -> dict | None:
    """The call's time (all its kernels) and its longest kernel's figures."""
    kernels = entry.get("kernels") or []
    if not kernels:
        return None
    k = max(kernels, key=kernel_time_us)
    m = k["metrics"]
    stalls = {STALL.match(n)[1]: v for n, v in m.items() if STALL.match(n) and isinstance(v, float)}
    stalls.pop("selected", None)  # the cycle of the issue itself: one per instruction, always
    issue = m.get("smsp__issue_active.avg.per_cycle_active")
    bandwidth = m.get("dram__bytes.sum.per_second")
    return {"kernel": k["name"].split("(")[0].split("::")[-1], "us": kernel_time_us(k),
            "total_us": sum(map(kernel_time_us, kernels)), "tensor_pct": m.get(TENSOR_METRIC),
            "dram_pct": m.get("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
            "dram_tb_s": bandwidth / 1e12 if isinstance(bandwidth, float) else None,
            "issue_pct": 100 * issue if isinstance(issue, float) else None,
            "stalls": sorted(stalls.items(), key=lambda kv: -kv[1])[:2],
            "registers": m.get("launch__registers_per_thread"), "spill": m.get("derived__local_spilling_requests")}


def bound_of(s: dict) -> str:
    """The resource the longest kernel is closest to: DRAM or the tensor pipe where one is busy 60 %
    of the time or more; else issue, named by the stall that costs a warp the most cycles between
    its instructions (barrier: a CTA barrier; wait: a fixed-latency dependency or an mbarrier's
    try-wait; long_scoreboard: a global or local memory load; gmma: a warpgroup MMA's result)."""
    if (s["dram_pct"] or 0) >= 60:
        return "memory"
    if (s["tensor_pct"] or 0) >= 60:
        return "tensor pipe"
    return f"issue ({s['stalls'][0][0] if s['stalls'] else '?'})"


def per_tensor(s: dict) -> str:
    """Instructions issued per tensor-busy cycle (both per active cycle): how much other work each
    unit of matrix work costs the schedulers."""
    return "-" if not s["issue_pct"] or not s["tensor_pct"] else f"{s['issue_pct'] / s['tensor_pct']:.2f}"


def instructions(entry: dict) -> dict | None:
    """The call's instructions executed, in all and by pipe (all its kernels). ncu gives each
    pipe's count as a share of its peak over the kernel's elapsed cycles, so the count is that
    share times the kernel's time (at the clocks of the run, which two calls share): comparable
    between two calls, pipe by pipe, not across pipes."""
    kernels = entry.get("kernels") or []
    if not kernels:
        return None
    total = sum(k["metrics"].get("sass__inst_executed_per_opcode") or 0 for k in kernels)
    by_pipe = {p: sum((k["metrics"].get(f"sm__inst_executed_pipe_{p}.avg.pct_of_peak_sustained_elapsed") or 0)
                      * kernel_time_us(k) for k in kernels) for p in PIPES}
    return {"total": total, **by_pipe} if total else None


def faster_peer(row: dict, impls: dict) -> tuple[str, dict] | tuple[None, None]:
    """(name, summary) of the faster of the row's peers (PEERS) that ran, by their call's time."""
    peers = [(p, summary(impls[p])) for p in PEERS[row["set"]] if p in impls]
    return min(((p, s) for p, s in peers if s), key=lambda x: x[1]["total_us"], default=(None, None))


def mix_table(paths: list[Path]) -> str:
    """Training and variant rows: fattn's instructions over the faster peer's, in all and by pipe."""
    rows = grouped(paths)
    lines = ["| row | faster peer | fattn instructions (M) | over the peer's | " + " | ".join(PIPES) + " |",
             "|" + "---|" * (4 + len(PIPES))]
    for name, (row, impls) in rows.items():
        if row["set"] not in ("forward", "backward", "variants") or "fattn" not in impls:
            continue
        peer = faster_peer(row, impls)[0]
        if peer is None:
            continue
        ours, theirs = instructions(impls["fattn"]), instructions(impls[peer])
        if not ours or not theirs:
            continue
        ratio = (lambda p: "-" if not theirs[p] else f"{ours[p] / theirs[p]:.2f}")
        lines.append(f"| {name} | {peer} | {ours['total'] / 1e6:.0f} | {ratio('total')} | "
                     + " | ".join(ratio(p) for p in PIPES) + " |")
    return "\n".join(lines)


def grouped(paths: list[Path]) -> dict:
    """{row name: (row, {impl: entry})}, in the order the files hold them."""
    rows = {}
    for path in paths:
        for entry in unpacked(json.loads(Path(path).read_text())):
            rows.setdefault(row_name(entry), (entry, {}))[1][entry["impl"]] = entry
    return rows


def table(paths: list[Path]) -> str:
    """One line per row: fattn's call against the faster peer's under ncu, and what bounds fattn's
    longest kernel. A paged decode row's peer is the contiguous row's cuDNN (as in decode.json)."""
    rows = grouped(paths)
    f = (lambda v, fmt="{:.0f}": "-" if v is None else fmt.format(v))
    lines = ["| row | fattn us | its longest kernel, us | tensor % | DRAM % (TB/s) | issue % (per tensor %) | stalls "
             "(cycles per instruction) | regs, spill | faster peer, us | peer / fattn | peer's tensor %, DRAM %, issue % "
             "(per tensor %) | bound |", "|" + "---|" * 12]
    for name, (row, impls) in rows.items():
        ours = impls.get("fattn_fp8" if row["set"] == "fp8" else "fattn")
        s = summary(ours) if ours else None
        if s is None:
            lines.append(f"| {name} | {(ours or {}).get('error') or 'not profiled'} |" + " |" * 10)
            continue
        peer_impls = dict(impls)
        if row["set"] == "decode" and row["paged"]:
            peer_impls.update(rows.get(name.replace(" paged", ""), (None, {}))[1])
        p, ps = faster_peer(row, peer_impls)
        stalls = ", ".join(f"{n} {v:.1f}" for n, v in s["stalls"])
        peer = (f"{p} {ps['total_us']:.0f} | {ps['total_us'] / s['total_us']:.2f} | {f(ps['tensor_pct'])}, "
                f"{f(ps['dram_pct'])}, {f(ps['issue_pct'])} ({per_tensor(ps)})") if ps else "- | - | -"
        lines.append(f"| {name} | {s['total_us']:.0f} | {s['kernel'][:32]} {s['us']:.0f} | {f(s['tensor_pct'])} "
                     f"| {f(s['dram_pct'])} ({f(s['dram_tb_s'], '{:.2f}')}) | {f(s['issue_pct'])} ({per_tensor(s)}) "
                     f"| {stalls} "
                     f"| {f(s['registers'])}, {f(s['spill'])} | {peer} | {bound_of(s)} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- entry points


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sets", default="forward,backward", help=f"comma list of {', '.join(SETS)}")
    p.add_argument("--impls", default="fattn,sdpa_cudnn,fa4", help=f"comma list of {', '.join(IMPLS)}")
    p.add_argument("--out", type=Path, help="the profiles' JSON")
    p.add_argument("--ncu", default=os.environ.get("NCU", "ncu"))
    p.add_argument("--budget-s", type=float, default=1e9,
                   help="start no call after this many seconds of profiling; the rest are recorded unprofiled")
    p.add_argument("--dry-run", action="store_true", help="print the rows and the ncu command; run nothing")
    p.add_argument("--table", type=Path, nargs="+", help="print the table of these profiles' JSON files")
    p.add_argument("--reread", type=Path, help="parse a run's JSON again from the ncu CSV beside it "
                   "(after a change to METRIC_PATTERNS)")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # the profiled process's manifest
    args = p.parse_args(argv)
    args.sets, args.impls = args.sets.split(","), args.impls.split(",")
    for name, given, allowed in (("--sets", args.sets, SETS), ("--impls", args.impls, IMPLS)):
        if set(given) - set(allowed):
            p.error(f"{name}: unknown {sorted(set(given) - set(allowed))}; choose from {', '.join(allowed)}")
    if not (args.table or args.dry_run or args.child or args.out or args.reread):
        p.error("--out is required to profile")
    return args


def main(argv=None):
    args = parse_args(argv)
    sys.path.insert(0, str(HERE))
    if args.table:
        print(table(args.table))
        print()
        print(mix_table(args.table))
        return
    if args.reread:
        run = json.loads(args.reread.read_text())
        manifest = [{k: v for k, v in e.items() if k != "kernels"} for e in run["entries"]]
        kernels, units = read_raw_csv(args.reread.with_suffix(".ncu.csv").read_text())
        run.update(packed(assign_kernels(manifest, kernels), units))
        args.reread.write_text(json.dumps(run))
        print(table([args.reread]))
        return
    rows = rows_of(args.sets)
    if args.child:
        run_rows(rows, args.impls, args.child, args.budget_s)
        return
    out = args.out or Path("profiles.json")
    manifest, log = out.with_suffix(".manifest.json"), out.with_suffix(".ncu.csv")
    child = [sys.executable, str(Path(__file__).resolve()), "--sets", ",".join(args.sets), "--impls",
             ",".join(args.impls), "--budget-s", str(args.budget_s), "--child", str(manifest)]
    if args.dry_run:
        for row in rows:
            print(row_name(row), "|", ", ".join(impls_of(row, args.impls)))
        print(" ".join(ncu_command(args.ncu, log, child)))
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    extra = tensor_metrics(args.ncu)
    command = ncu_command(args.ncu, log, child)
    if extra:
        command[1:1] = ["--metrics", ",".join(extra)]
    print(" ".join(command), flush=True)
    run = subprocess.run(command)
    kernels, units = read_raw_csv(log.read_text())
    entries = assign_kernels(json.loads(manifest.read_text()), kernels)
    from common import device_info, versions
    out.write_text(json.dumps({"benchmark": "profile_rows", "device": device_info("cuda"), "versions": versions(),
                               "config": {"sets": args.sets, "impls": args.impls, "sections": SECTIONS,
                                          "tensor_metrics": extra, "ncu_rc": run.returncode},
                               **packed(entries, units)}))
    manifest.unlink()
    print(table([out]))
    print(f"wrote {out} (ncu rc {run.returncode})")


if __name__ == "__main__":
    main()
