"""What every benchmark CLI shares: the timer, the results schema, the SDPA peers, the table.

Results schema (one JSON object per run, written by Results.write):

    benchmark  name of the CLI's measurement ("forward", "decode", "host", ...)
    device     {"name", "sm_count", "capability": [major, minor]} (the last two null on a CPU)
    versions   {"python", "torch", "triton", "cuda", "cudnn", "fattn", "fattn_kernels_triton",
                "fattn_commit", "flash_attn_4", "benchmarks_commit"} (a commit is null outside a
                git checkout; flash_attn_4, the fa4 peer's package, null where it is not installed)
    config     the CLI's parsed arguments
    rows       flat records: the case's fields, then "impl", "ms" (per call; null when the
               call failed), "error" (null or why), derived metrics ("tflops", "gb_s", ...)
               and, on fattn's rows ({} elsewhere), "ratio_vs": {peer: fattn ms / peer ms}, a time
               ratio (below 1 fattn is faster), and "ratio": {peer: peer ms / fattn ms}, the
               throughput ratio of benchmarks/results/forward_h100.json that the speed bars
               are written in (1.0 or more: fattn at least as fast; benchmarks/check_bars.py).
               A peer that cannot run (fa4 without its package or on an unsupported GPU, a
               modification it lacks) has rows with ms null and the reason in "error", and no
               entry in the ratios.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

# ----------------------------------------------------------------------------- timer


def time_ms(calls, *, warmup: int = 5, reps: int = 30, device: str = "cuda", graph: bool = False,
            wall: bool = False, before_rep=None) -> float:
    """Median milliseconds per call.

    `calls` is one callable or a list of them run back to back as one timed unit; the result
    is the median unit time / len(calls). A list that rotates over copies of the data keeps
    a call from finding its inputs in L2.

    Clocks: CUDA events around the unit (the GPU's time); graph=True captures the unit once
    in a CUDA graph and times its replays (no launch overhead); wall=True times the unit with
    time.perf_counter and one synchronize at its end (what the host pays to issue the calls,
    when the GPU keeps up). On a CPU device the wall clock is the only one. `before_rep` runs
    before each timed rep, untimed (bench_ring's barrier: every rank starts a rep together).
    """
    calls = list(calls) if isinstance(calls, (list, tuple)) else [calls]

    def unit():
        for call in calls:
            call()

    before_rep = before_rep or (lambda: None)
    if device == "cpu" or wall:
        times = _wall_times(unit, warmup, reps, device, before_rep)
    elif graph:
        times = _graph_times(unit, warmup, reps, before_rep)
    else:
        times = _event_times(unit, warmup, reps, before_rep)
    return statistics.median(times) / len(calls)


def graph_or_eager_ms(calls, *, warmup: int, reps: int, device: str, graph: bool = True) -> tuple[float, str]:
    """(ms per call, how it was timed): time_ms over CUDA-graph replays of `calls`, or eagerly when
    graph is False or the capture fails (a call that cannot be captured is still timed); the wall
    clock on a CPU."""
    timing = {"warmup": warmup, "reps": reps, "device": device}
    if device != "cuda":
        return time_ms(calls, **timing), "wall"
    if not graph:
        return time_ms(calls, **timing), "eager"
    try:
        return time_ms(calls, graph=True, **timing), "graph"
    except Exception as e:  # noqa: BLE001
        torch.cuda.synchronize()  # raises if the context is broken: the case fails
        return time_ms(calls, **timing), f"eager (graph capture failed: {short_error(e, 300)})"


def interleaved_ms(fns: dict, pairs: int, reps: int = 10) -> dict:
    """Median milliseconds per call of each callable in `fns`, timed in turn (A B A B ...) `pairs`
    times, each sample the median of `reps` calls after one untimed call; the figure is the
    median over the samples, so clock drift touches every one alike. The A/B scripts' measure."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    samples = {name: [] for name in fns}
    for _ in range(pairs):
        for name, fn in fns.items():
            samples[name].append(time_ms(fn, warmup=1, reps=reps, device=device))
    return {name: statistics.median(s) for name, s in samples.items()}


def write_ab_rows(path: Path, rows: list) -> None:
    """The A/B scripts' JSON: the GPU's name, torch's and Triton's versions, and the rows."""
    triton = _optional_import("triton")
    path.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                "triton": triton and triton.__version__, "rows": rows}, indent=1) + "\n")


def _sync(device):
    if device != "cpu":
        torch.cuda.synchronize()


def _wall_times(unit, warmup, reps, device, before_rep):
    for _ in range(warmup):
        unit()
    _sync(device)
    times = []
    for _ in range(reps):
        before_rep()
        start = time.perf_counter()
        unit()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _event_times(unit, warmup, reps, before_rep):
    for _ in range(warmup):
        unit()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        before_rep()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        unit()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return times


def _graph_times(unit, warmup, reps, before_rep):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
        for _ in range(warmup):
            unit()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            unit()
        graph.replay()
        return _event_times(graph.replay, 0, reps, before_rep)
    finally:
        torch.cuda.synchronize()
        graph.reset()  # frees the graph's private memory pool now, not at the next collection


# ----------------------------------------------------------------------------- results schema


def _git_commit(directory: Path) -> str | None:
    """The checkout's commit, with "-dirty" when tracked files differ from it (the numbers then
    belong to uncommitted code); None outside a git checkout."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12", "--exclude=*"],
                              capture_output=True, text=True, cwd=directory, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def device_info(device: str = "cuda") -> dict:
    if device == "cpu":
        return {"name": platform.processor() or platform.machine() or "cpu", "sm_count": None, "capability": None}
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": props.name, "sm_count": props.multi_processor_count, "capability": [props.major, props.minor]}


def _optional_import(name: str):
    """fattn runs without triton, and the tuners' JIT kernels without fattn: record what is there."""
    try:
        return __import__(name)
    except ImportError:
        return None


def versions() -> dict:
    fattn, triton = _optional_import("fattn"), _optional_import("triton")
    return {
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": triton and triton.__version__, "fattn": fattn and fattn.__version__,
        "fattn_kernels_triton": fattn and fattn.build_info()["triton_version"],
        "fattn_commit": fattn and _git_commit(Path(fattn.__file__).resolve().parent),
        "flash_attn_4": fa4_version(),
        "benchmarks_commit": _git_commit(Path(__file__).resolve().parent),
    }


@dataclass
class Results:
    """One run's results in the schema above; `write` after every case keeps a cut-off run's rows."""

    benchmark: str
    device: dict
    versions: dict
    config: dict
    rows: list = field(default_factory=list)

    @classmethod
    def start(cls, benchmark: str, args, device: str = "cuda") -> "Results":
        config = {k: v for k, v in vars(args).items() if not k.startswith("_")}
        return cls(benchmark, device_info(device), versions(), config)

    def add(self, case: dict, impl: str, ms: float | None, error: str | None = None, *,
            flops: float | None = None, nbytes: float | None = None, **metrics) -> dict:
        """Appends a row; flops / nbytes per call give the derived tflops / gb_s."""
        row = {**case, "impl": impl, "ms": ms, "error": error}
        if flops is not None:
            row["tflops"] = flops / ms / 1e9 if ms else None
        if nbytes is not None:
            row["gb_s"] = nbytes / ms / 1e6 if ms else None
        row.update(metrics, ratio_vs={}, ratio={})
        self.rows.append(row)
        return row

    def case_rows(self, case: dict) -> list[dict]:
        return [r for r in self.rows if all(r.get(k) == v for k, v in case.items())]

    def compare(self, case: dict, peers, ours=None) -> None:
        """ratio_vs (its ms / each peer's ms) and ratio (each peer's ms / its ms) on each of our
        rows of the case (`ours`, default every impl named fattn*)."""
        rows = self.case_rows(case)
        peer_ms = {r["impl"]: r["ms"] for r in rows if r["impl"] in peers and r["ms"]}
        for r in rows:
            if (r["impl"] in ours if ours else r["impl"].startswith("fattn")) and r["ms"]:
                r["ratio_vs"] = {peer: r["ms"] / ms for peer, ms in peer_ms.items()}
                r["ratio"] = {peer: ms / r["ms"] for peer, ms in peer_ms.items()}

    def require_timings(self, keys) -> None:
        """Exits non-zero if some case (rows grouped by `keys`, plus impl) has no timed row,
        naming it and its first error: a search that measured nothing must not pass for a result."""
        failed = []
        for key in dict.fromkeys(tuple(r.get(k) for k in (*keys, "impl")) for r in self.rows):
            rows = [r for r in self.rows if tuple(r.get(k) for k in (*keys, "impl")) == key]
            if not any(r["ms"] for r in rows):
                failed.append(f"{dict(zip((*keys, 'impl'), key))}: {rows[0]['error']}")
        if failed:
            raise SystemExit(f"{self.benchmark}: no candidate ran for {len(failed)} case(s):\n  "
                             + "\n  ".join(failed))

    def write(self, path: Path | None) -> None:
        if path is None:
            return
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1, default=str))


# ----------------------------------------------------------------------------- shared pieces


def sdpa_peers(device: str) -> dict:
    """The SDPA backends timed beside fattn. A CPU has neither flash nor cuDNN: smoke runs
    there time the math backend, so that every code path still runs."""
    if device == "cpu":
        return {"sdpa_math": SDPBackend.MATH}
    return {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}


# FlashAttention-4 (the flash-attn-4 package, CuTe DSL kernels JIT-compiled on first call) as a
# peer. It is imported only when a run builds the peer, so that a machine without it (every CPU, a
# GPU where it was not installed) still runs every benchmark and records why the peer has no time.
FA4_DISTRIBUTION = "flash-attn-4"
# Its Hopper (sm_90) and Blackwell (sm_100) kernels are what the speed bars measure fattn against;
# its sm_80 path has no backward, and the sm_120 one is another kernel family.
FA4_CAPABILITY_MAJORS = (9, 10)


class PeerUnavailable(RuntimeError):
    """A peer that cannot run on this machine at all. Its calls raise this with the reason, so each
    case records it as a row without a time and with that error, as a refusing SDPA backend is."""


def fa4_version() -> str | None:
    """flash-attn-4's installed version, read from its metadata: the package's own __version__
    asks for a distribution named "fa4" and says 0.0.0."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(FA4_DISTRIBUTION)
    except PackageNotFoundError:
        return None


_FA4 = {}


def _fa4_function(device: str):
    """(flash_attn.cute.flash_attn_func, None), or (None, why this machine cannot run it); the import
    is tried once per process (it loads the CuTe DSL compiler)."""
    if device != "cuda":
        return None, f"{FA4_DISTRIBUTION} runs on CUDA GPUs only (device {device})"
    capability = torch.cuda.get_device_capability()
    if capability[0] not in FA4_CAPABILITY_MAJORS:
        return None, (f"{FA4_DISTRIBUTION} is a peer on sm_90 and sm_100 only; this GPU is "
                      f"sm_{capability[0]}{capability[1]}")
    if "function" not in _FA4:
        try:
            from flash_attn.cute import flash_attn_func
            _FA4.update(function=flash_attn_func, reason=None)
        except Exception as e:  # noqa: BLE001  (not installed, or its compiler libraries fail to load)
            _FA4.update(function=None, reason=f"{FA4_DISTRIBUTION} cannot be imported: {short_error(e, 300)}")
    return _FA4["function"], _FA4["reason"]


def fa4_peer(device: str):
    """FlashAttention-4 as a peer: fa4(q, k, v, **options) -> out, q, k, v [batch, seq, heads, dim]
    as fattn takes them, options flash_attn.cute.flash_attn_func's (causal, window_size, softcap,
    learnable_sink, ...), gradients through autograd. Where it cannot run, every call raises
    PeerUnavailable with the reason (fa4_unavailable says it without a call)."""
    function, reason = _fa4_function(device)
    if function is None:
        def unavailable(*_, **__):
            raise PeerUnavailable(reason)
        return unavailable

    def fa4(q, k, v, **options):
        out = function(q, k, v, **options)
        # 4.0.0b36 returns (out, lse) whatever return_lse says; keep out, whichever a release returns.
        return out[0] if isinstance(out, (tuple, list)) else out
    return fa4


def fa4_unavailable(device: str) -> str | None:
    """Why FlashAttention-4 cannot run here, or None when it can."""
    return _fa4_function(device)[1]


def alibi_slopes(heads: int, device) -> torch.Tensor:
    """ALiBi's standard slopes for `heads` heads, 2**(-8 (h + 1) / heads), float32."""
    return 2.0 ** (-8.0 * torch.arange(1, heads + 1, device=device, dtype=torch.float32) / heads)


def short_error(e: BaseException, limit: int = 500) -> str:
    return f"{type(e).__name__}: {e}".replace("\n", " ")[:limit]


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_size(text: str) -> int:
    """'4k' -> 4096, '1m' -> 1048576, '1000' -> 1000."""
    t = text.strip().lower()
    mult = {"k": 1024, "m": 1024 * 1024}.get(t[-1:], 1)
    value = int(t[:-1] if mult > 1 else t) * mult
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


def fmt_size(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def print_table(headers, lines, title: str | None = None) -> None:
    """Right-aligned columns; a float cell prints with 2 decimals (give strings for others), None as '-'."""
    def cell(x):
        return "-" if x is None else f"{x:.2f}" if isinstance(x, float) else str(x)

    cells = [[cell(x) for x in line] for line in lines]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers)]
    if title:
        print(title)
    print(" ".join(h.rjust(w) for h, w in zip(headers, widths)))
    for c in cells:
        print(" ".join(x.rjust(w) for x, w in zip(c, widths)))


def load_kernels(device: str) -> dict:
    """triton_src.KERNELS, the specs through which the tuners launch the JIT kernels.
    On a CPU they run in Triton's interpreter (it needs numpy < 2.3). Triton picks the
    interpreter when a kernel is decorated, that is when triton_src is imported: hence the
    import here, after the environment is set, and not at the top of the scripts."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from triton_src import KERNELS

    return KERNELS


def require_device(device: str, script: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{script} needs a CUDA GPU here (for a CPU smoke run: --device cpu --quick)")


# ----------------------------------------------------------------------------- decode data (bench_decode, tune_decode)


def paginate(kv, page_size, shuffle=True):
    """kv [2, b, L, hk, d] -> (pool [2, b * pages, page_size, hk, d], block_table int32 [b, pages]),
    pages in shuffled physical order (in order with shuffle=False, the layout of the contiguous
    cache): key j of sequence i is pool[:, table[i, j // page_size], j % page_size]."""
    _, b, length, hk, d = kv.shape
    pages = -(-length // page_size)
    src = kv.new_zeros(2, b, pages * page_size, hk, d) if pages * page_size != length else kv
    if src is not kv:
        src[:, :, :length] = kv
    perm = torch.randperm(b * pages, device=kv.device) if shuffle else torch.arange(b * pages, device=kv.device)
    pool = torch.empty_like(src).view(2, b * pages, page_size, hk, d)
    pool.index_copy_(1, perm, src.reshape(2, b * pages, page_size, hk, d))  # pool[:, perm[i]] = page i
    return pool, perm.view(b, pages).to(torch.int32)


def decode_reference(q, kv, context):
    """float64 attention of q [b, sq, H, D] over the first `context` keys of kv [2, b, L, Hk, D]
    (no mask: every query token sees every key)."""
    (b, sq, h, d), hk = q.shape, kv.shape[3]
    out = torch.empty(b, sq, h, d, dtype=torch.float64, device=q.device)
    for i in range(b):  # one sequence at a time bounds the float64 copies' memory
        k, v = kv[0, i, :context].double(), kv[1, i, :context].double()
        qq = q[i].double().reshape(sq, hk, h // hk, d)  # query head h reads kv head h // group
        s = torch.einsum("qhgd,lhd->qhgl", qq, k) / math.sqrt(d)
        out[i] = torch.einsum("qhgl,lhd->qhgd", torch.softmax(s, dim=-1), v).reshape(sq, h, d)
    return out
