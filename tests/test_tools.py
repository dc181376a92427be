"""The offline tools run on a CPU in their --quick modes: the tuner and the decode tile search
(Triton's interpreter), the benchmarks, the plots and the host profile; the GPU-only studies
(benchmarks/studies/) stop with their reason after importing what they launch. The tools launch
the kernels by argument name, so a kernel signature change that they do not follow fails here
rather than in the next search on a GPU."""

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # the slow tier (-m slow): runs the benchmark and tuning tools

ROOT = Path(__file__).resolve().parent.parent


# tuning.tune_decode runs in test_tune_decode_times_fp8_caches, whose FP8 caches take every step of
# its bf16 run and the quantization on top.
@pytest.mark.parametrize("script", ["bench_variants", "bench_chunked_prefill"])
def test_quick_run_times_every_case(script, tmp_path):
    out = tmp_path / "result.json"
    command = ["-m", script] if script.startswith("tuning.") else [str(ROOT / "benchmarks" / f"{script}.py")]
    result = subprocess.run([sys.executable, *command, "--device", "cpu", "--quick", "--out", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert rows
    if script == "bench_variants":  # a benchmark times every implementation of every case
        assert all(r["ms"] for r in rows if r["impl"] != "fa4"), [r for r in rows if not r["ms"]][:3]
        # but FlashAttention-4, which a CPU cannot run: a row per window and score_mod case, without a
        # time, saying why; a modification it lacks says so rather than that the machine cannot run it.
        def key(r):
            return tuple(r.get(k) for k in ("pass", "study", "mod", "window_left", "causal"))
        fa4 = {key(r): r for r in rows if r["impl"] == "fa4"}
        cases = {key(r) for r in rows if r["impl"] == "fattn" and r["study"] in ("window", "score_mod")}
        assert set(fa4) == cases, set(fa4) ^ cases
        assert all(r["ms"] is None for r in fa4.values())
        for r in fa4.values():
            if r.get("mod") in ("alibi", "softcap+alibi", "dropout0.1", "segments4", "bias", "bias+dropout0.1"):
                assert r["error"].startswith("unsupported: flash-attn-4 has no "), r
            else:
                assert r["error"].startswith("PeerUnavailable: flash-attn-4 runs on CUDA GPUs only"), r
        assert not any("fa4" in r["ratio"] for r in rows)
        # The score_mod study prices every variant over plain attention, in both passes.
        mods = {(r["pass"], r["mod"]) for r in rows if r["study"] == "score_mod" and r["impl"] == "fattn"}
        variants = {"plain", "softcap", "alibi", "softcap+alibi", "sinks", "dropout0.1", "window32", "segments4",
                    "gqa2", "bias", "bias+dropout0.1"}
        assert mods == {(p, m) for p in ("forward", "backward") for m in variants}, mods
        assert all("vs_plain" in r for r in rows if r["study"] == "score_mod" and r["impl"] == "fattn"
                   and r["mod"] != "plain")
    elif script == "bench_chunked_prefill":  # every fattn path (a CPU has no SDPA flash/cuDNN/efficient)
        fattn_rows = [r for r in rows if r["impl"].startswith("fattn")]
        assert len(fattn_rows) == 4 and all(r["ms"] for r in fattn_rows), fattn_rows
    else:  # a search may meet configs that cannot run, but times at least one per case
        assert any(r["ms"] for r in rows)


def test_tune_decode_times_fp8_caches(tmp_path):
    # --kv-dtype e4m3: FP8 caches (paged through a byte view), each config checked against the
    # reference of the same FP8 values before it is timed; a wrong one is recorded without a time.
    out = tmp_path / "result.json"
    result = subprocess.run([sys.executable, "-m", "tuning.tune_decode", "--device", "cpu", "--quick", "--kv-dtype",
                             "e4m3", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["paged"], r["num_splits"]) for r in rows} == {(p, s) for p in (False, True) for s in (1, 3)}
    assert all(r["kv_dtype"] == "e4m3" and r["ms"] and not r.get("error") for r in rows), rows


def test_tuner_smoke_run_chooses_a_checked_config_per_kernel(tmp_path):
    # tuning/tune.py under the interpreter: every kernel gets a chosen config that passed the
    # accuracy check and has timings (test_aot_build.py checks how the grid reads such a file).
    out = tmp_path / "sm0.json"
    result = subprocess.run([sys.executable, "-m", "tuning.tune", "--device", "cpu", "--out", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data["kernels"]) == {"attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"}
    for kernel, buckets in data["kernels"].items():
        entry = buckets["16"]
        chosen = [c for c in entry["candidates"] if c["config"] == entry["chosen"]]
        assert chosen and "rejected" not in chosen[0] and all(c["ms"] > 0 for c in chosen[0]["cases"]), kernel
        assert set(entry["chosen"]) == {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}


def test_bench_attention_rows_carry_the_throughput_ratio(tmp_path):
    out = tmp_path / "forward.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_attention.py"), "--device", "cpu",
                             "--quick", "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    ours = [r for r in rows if r["impl"] == "fattn"]
    assert ours and all(r["ratio"] for r in ours)
    for r in ours:  # ratio = peer ms / fattn ms, the inverse of ratio_vs, over the peers that ran
        peers = {p["impl"]: p["ms"] for p in rows if p["impl"] != "fattn" and p["seqlen"] == r["seqlen"]
                 and p["head_dim"] == r["head_dim"] and p["causal"] == r["causal"] and p["ms"]}
        assert r["ratio"] == pytest.approx({p: ms / r["ms"] for p, ms in peers.items()})
        assert r["ratio"] == pytest.approx({p: 1 / x for p, x in r["ratio_vs"].items()})
    # FlashAttention-4 cannot run on a CPU: one row per case all the same, no time, the reason.
    fa4 = [r for r in rows if r["impl"] == "fa4"]
    assert len(fa4) == len(ours) and all(r["ms"] is None and r["tflops"] is None for r in fa4)
    assert all(r["error"].startswith("PeerUnavailable: flash-attn-4 runs on CUDA GPUs only") for r in fa4), fa4[0]
    assert "fa4: unavailable" in result.stdout


def test_fa4_peer_says_why_it_cannot_run(monkeypatch):
    # The reasons a GPU machine meets, without one: a GPU it is no peer on, and a package that does
    # not import (not installed); no --no-fa4, no rows. Each call then raises PeerUnavailable.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_attention
        import common
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    monkeypatch.setattr(common, "_FA4", {})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (8, 0))
    assert "sm_90 and sm_100 only; this GPU is sm_80" in common.fa4_unavailable("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (9, 0))
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # an import of it fails as if absent
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    assert common.fa4_unavailable("cuda").startswith("flash-attn-4 cannot be imported: ")
    with pytest.raises(common.PeerUnavailable, match="cannot be imported"):
        common.fa4_peer("cuda")(None, None, None, causal=True)
    assert "fa4" not in bench_attention.make_impls(False, False, "cpu")  # the default, as --no-fa4 asks
    assert "fa4" in bench_attention.make_impls(False, False, "cpu", use_fa4=True)


def test_bench_variants_gives_fa4_only_the_modifications_it_has():
    # FlashAttention-4 has causal, a window, softcap, sinks (learnable_sink) and GQA, under its own
    # keyword names; ALiBi, dropout, segment ids and a bias it lacks, and the study says so.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_variants
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    args = bench_variants.parse_args(["--device", "cpu", "--quick"])
    supported = {}
    for mod, (options, _) in bench_variants.score_mod_variants(args, True, 2, 4, 128).items():
        options = dict(options)
        options.pop("gqa", None)
        kw, lacking = bench_variants.fa4_options(options)
        supported[mod] = kw if lacking is None else lacking
    assert set(supported["plain"]) == set() and supported["softcap"] == {"softcap": 30.0}
    assert set(supported["sinks"]) == {"learnable_sink"} and supported["window32"] == {"window_size": (32, 0)}
    assert supported["gqa2"] == {}
    for mod in ("alibi", "softcap+alibi", "dropout0.1", "segments4", "bias", "bias+dropout0.1"):
        assert isinstance(supported[mod], str) and "flash-attn-4 has no" in supported[mod], mod


def _bars_run(direction, ratios):
    """A bench_attention result whose fattn rows have `ratios(head_dim, seqlen, causal)`."""
    rows = [{"impl": "fattn", "head_dim": d, "seqlen": s, "causal": c, "ratio": ratios(d, s, c)}
            for d in (64, 128, 256) for s in (512, 1024, 2048, 4096, 8192, 16384) for c in (False, True)]
    return {"benchmark": direction, "rows": [r for r in rows if r["ratio"] is not None]}


def _write_bars_runs(tmp_path, ratios):
    """forward.json and backward.json of _bars_run with ratios(direction); their paths."""
    paths = [tmp_path / f"{direction}.json" for direction in ("forward", "backward")]
    for path in paths:
        path.write_text(json.dumps(_bars_run(path.stem, ratios(path.stem))))
    return paths


@pytest.mark.parametrize("case", ["met", "backward below 0.9 cuDNN", "forward below Flex", "no d256 rows"])
def test_check_bars_says_which_bar_is_unmet(tmp_path, case):
    def ratios(direction):
        def at(d, s, causal):
            if case == "no d256 rows" and d == 256:
                return None
            r = {"sdpa_cudnn": 1.0 if direction == "forward" else 0.9, "flex": 1.2, "sdpa_flash": 1.5}
            if case == "backward below 0.9 cuDNN" and direction == "backward" and (d, s, causal) == (128, 8192, True):
                r["sdpa_cudnn"] = 0.89
            if case == "forward below Flex" and direction == "forward" and (d, s) == (64, 512):
                r["flex"] = 0.97
            return r
        return at

    paths = _write_bars_runs(tmp_path, ratios)
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "check_bars.py"), *map(str, paths)],
                            capture_output=True, text=True, timeout=60)
    lines = result.stdout.splitlines()
    if case == "met":
        assert result.returncode == 0 and "0 unmet, 0 missing" in lines[-1], result.stdout[-2000:]
        return
    assert result.returncode == 1, result.stdout[-2000:]
    # Each line: status, direction, d<head_dim>, s<seqlen>, causal or non-causal, "vs", peer, ratio, ...
    bad = [line.split() for line in lines[:-1] if not line.lstrip().startswith("met")]
    if case == "backward below 0.9 cuDNN":
        assert [b[:7] for b in bad] == [["unmet", "backward", "d128", "s8192", "causal", "vs", "sdpa_cudnn"]], bad
    elif case == "forward below Flex":
        assert [b[:7] for b in bad] == [["unmet", "forward", "d64", "s512", c, "vs", "flex"]
                                        for c in ("non-causal", "causal")], bad
    else:  # d256: the Flex rows simply do not exist, the SDPA flash bar's rows are missing
        assert bad and all(b[0] == "missing" and b[2] == "d256" and b[6] == "sdpa_flash" for b in bad), bad
        assert len(bad) == 2 * 6 * 2  # forward and backward x 6 seqlens x causal


def test_check_bars_joins_runs_but_refuses_a_row_measured_twice(tmp_path):
    every = {"sdpa_cudnn": 1.0, "flex": 1.1, "sdpa_flash": 1.2}
    paths = {}
    for name, dims in (("small", (64, 128)), ("large", (256,)), ("again", (128,))):
        for direction in ("forward", "backward"):
            run = _bars_run(direction, lambda d, s, c: every if d in dims else None)
            paths[name, direction] = tmp_path / f"{name}_{direction}.json"
            paths[name, direction].write_text(json.dumps(run))
    script = str(ROOT / "benchmarks" / "check_bars.py")
    joined = subprocess.run([sys.executable, script, *(str(paths[n, d]) for n in ("small", "large")
                                                       for d in ("forward", "backward"))],
                            capture_output=True, text=True, timeout=60)
    assert joined.returncode == 0 and "0 unmet, 0 missing" in joined.stdout, joined.stdout[-2000:] + joined.stderr
    twice = subprocess.run([sys.executable, script, str(paths["small", "forward"]), str(paths["again", "forward"])],
                           capture_output=True, text=True, timeout=60)
    assert twice.returncode != 0 and "is in two runs" in twice.stderr, twice.stderr[-2000:]


@pytest.mark.parametrize("case", ["met", "fa4 faster", "cuDNN faster", "no fa4 time"])
def test_check_bars_hopper_peers_takes_the_faster_of_fa4_and_cudnn(tmp_path, case):
    # --bars hopper_peers: every d64/d128 row from 1k to 16k, both passes, at or above the faster of
    # fa4 and SDPA cuDNN (the smaller ratio); a row without an fa4 time cannot be judged.
    def ratios(direction):
        def at(d, s, causal):
            r = {"sdpa_cudnn": 1.1, "fa4": 1.05, "flex": 1.3, "sdpa_flash": 1.5}
            if (direction, d, s, causal) == ("backward", 64, 2048, True):
                if case == "fa4 faster":  # fa4 below 1 while cuDNN is above: fa4 is the bar
                    r["fa4"] = 0.8
                elif case == "cuDNN faster":
                    r["sdpa_cudnn"], r["fa4"] = 0.95, 1.2
                elif case == "no fa4 time":
                    del r["fa4"]
            return r
        return at

    paths = _write_bars_runs(tmp_path, ratios)
    script = str(ROOT / "benchmarks" / "check_bars.py")
    result = subprocess.run([sys.executable, script, "--bars", "hopper_peers", *map(str, paths)],
                            capture_output=True, text=True, timeout=60)
    lines = result.stdout.splitlines()
    # 2 passes x 2 head dims x 5 seqlens (1k-16k) x causal and not
    assert lines[-1].endswith(" of 40"), lines[-1]
    assert all(line.split()[6] == "best(fa4,sdpa_cudnn)" and line.endswith("[hopper_peers]") for line in lines[:-1])
    bad = [line.split() for line in lines[:-1] if not line.lstrip().startswith("met")]
    if case == "met":
        assert result.returncode == 0 and "40 met, 0 unmet, 0 missing" in lines[-1], result.stdout[-2000:]
        assert all(line.split()[-3:-1] == ["fa4", "faster"] for line in lines[:-1])  # 1.05 < 1.1
    elif case == "no fa4 time":
        assert result.returncode == 1 and [b[:6] for b in bad] == [["missing", "backward", "d64", "s2048", "causal",
                                                                    "vs"]], result.stdout[-2000:]
    else:
        want, faster = ("0.80", "fa4") if case == "fa4 faster" else ("0.95", "sdpa_cudnn")
        assert result.returncode == 1 and len(bad) == 1, result.stdout[-2000:]
        assert bad[0][:8] == ["unmet", "backward", "d64", "s2048", "causal", "vs", "best(fa4,sdpa_cudnn)", want]
        assert bad[0][-3:-1] == [faster, "faster"], bad[0]
    # The default is the first set alone, which these runs meet however fa4 did; "all" adds the new one.
    default = subprocess.run([sys.executable, script, *map(str, paths)], capture_output=True, text=True, timeout=60)
    assert default.returncode == 0 and "hopper_peers" not in default.stdout, default.stdout[-2000:]
    every = subprocess.run([sys.executable, script, "--bars", "all", *map(str, paths)], capture_output=True,
                           text=True, timeout=60)
    assert every.returncode == result.returncode and "[hopper]" in every.stdout and "[hopper_peers]" in every.stdout
    unknown = subprocess.run([sys.executable, script, "--bars", "hopper,nope", *map(str, paths)],
                             capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "unknown bar set" in unknown.stderr, unknown.stderr


def test_bench_ring_times_full_causal_and_a_window_under_gloo(tmp_path):
    # Two CPU processes (gloo) in --quick mode: the rows a multi-GPU run will write, with the ring's
    # hops per window (contiguous shards by default for a window, as the ring wants them).
    out = tmp_path / "ring.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(ROOT / "benchmarks" / "bench_ring.py"),
           "--device", "cpu", "--quick", "--windows=-1,16", "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["impl"], r["window_left"], r["sharding"]) for r in rows} == {
        (impl, w, s) for impl in ("fattn_ring", "fattn_single_gpu") for w, s in ((-1, "zigzag"), (16, "contiguous"))}
    assert all(r["ms"] and r["hops"] == [1, 0] for r in rows), rows
    assert all(r["efficiency_vs_single_gpu"] > 0 for r in rows if r["impl"] == "fattn_ring")


def test_bench_context_parallel_times_the_ring_and_the_all_to_all_under_gloo(tmp_path):
    # Two CPU processes (gloo) in --quick mode: the rows a multi-GPU run will write, each scheme's
    # efficiency against one GPU's share of the same packed batch.
    out = tmp_path / "cp.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(ROOT / "benchmarks" / "bench_context_parallel.py"), "--device", "cpu", "--quick", "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["impl"] for r in rows] == ["fattn_single_gpu", "fattn_ring_varlen", "fattn_ulysses_varlen"]
    assert all(r["ms"] and not r["error"] and sum(r["documents"]) == 2 * 64 for r in rows), rows
    for r in rows[1:]:
        assert r["efficiency_vs_single_gpu"] == pytest.approx(rows[0]["ms"] / (2 * r["ms"]))


CUDA_STUDIES = {"kernel_times": ["--head-dims", "64"], "paged_decode_gap": []}
HOPPER_SCRIPTS = ["studies/hopper_forward_ab", "studies/hopper_backward_ab", "studies/forward_programs",
                  "studies/forward_timeline", "studies/forward_host_maps", "studies/backward_streams_ab", "revision_ab"]


@pytest.fixture(scope="module")
def refusals():
    """Every GPU-only study run as a program, all in one process (each alone paid torch's import)."""
    from helpers.scripts import run_scripts

    scripts = [] if torch.cuda.is_available() else [(ROOT / "benchmarks" / "studies" / f"{s}.py", a)
                                                    for s, a in CUDA_STUDIES.items()]
    scripts += [(ROOT / "benchmarks" / f"{s}.py", []) for s in HOPPER_SCRIPTS]
    return run_scripts(scripts)


@pytest.mark.skipif(torch.cuda.is_available(), reason="runs where there is no GPU (it checks the refusal there)")
@pytest.mark.parametrize("study", list(CUDA_STUDIES))
def test_cuda_studies_refuse_a_machine_without_cuda(study, refusals):
    # They time CUDA kernels (kernel_times: the benchmark CLI's callables under the profiler;
    # paged_decode_gap: the op and the JIT launcher's decode); without a GPU they stop with that
    # reason, after importing what they launch (a renamed one fails here, not on the next GPU run).
    code, stderr = refusals[str(ROOT / "benchmarks" / "studies" / f"{study}.py")]
    assert code == 1 and f"{study} needs a CUDA GPU" in stderr, stderr


@pytest.mark.parametrize("script", HOPPER_SCRIPTS)
def test_hopper_ab_scripts_refuse_a_machine_without_hopper(script, refusals):
    # They time sm_90a code; elsewhere they stop with a usage error, after importing every
    # kernel and spec they launch (a renamed one fails here, not on the next GPU run).
    code, stderr = refusals[str(ROOT / "benchmarks" / f"{script}.py")]
    assert code == 2 and "needs a Hopper GPU" in stderr, stderr


def test_forward_timeline_clocks_fit_the_kernel_as_it_is():
    # The study adds its clock reads to triton_src/forward_sm90.py by anchoring on the kernel's
    # lines; a kernel edit that moves one must fail here, not on the next GPU run.
    sys.path.insert(0, str(ROOT / "benchmarks" / "studies"))
    try:
        import forward_timeline
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "studies"))
    source = (ROOT / "triton_src" / "forward_sm90.py").read_text()
    timed = forward_timeline.timed_source(source)
    ast.parse(timed)
    assert (timed.count("%clock64"), timed.count("%globaltimer"), timed.count("%smid")) == (12, 5, 1)
    assert "bias_load, ts, BLOCK_M: gl.constexpr" in timed and timed.count("bias_load, ts_base, BLOCK_M") == 2
    with pytest.raises(ValueError, match="anchor not found"):
        forward_timeline.timed_source(source.replace("    mbarrier.wait(q_ready.index(WG), k & 1)\n", ""))


def _study(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks" / "studies"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "studies"))


def test_forward_studies_cases_are_the_ops_calls():
    # The Hopper forward studies' cases: per head dim and length, causal then not, the problem of
    # `tokens` tokens and hidden // d heads, with the op's programs per (head, batch).
    import fattn._library as library

    cases = list(_study("forward_cases").forward_cases("64,128", "256,512", 1024, 256, 132))
    assert [(c.head_dim, c.seqlen, c.causal) for c in cases] == [
        (d, s, causal) for d in (64, 128) for s in (256, 512) for causal in (True, False)]
    for c in cases:
        assert tuple(c.problem.q.shape) == (1024 // c.seqlen, c.seqlen, 256 // c.head_dim, c.head_dim)
        assert c.variant.causal == c.causal
        tiles_m = -(-c.seqlen // c.tiles.block_m)
        assert c.programs == library.query_tile_programs(tiles_m, (1024 // c.seqlen) * (256 // c.head_dim), 132,
                                                         c.causal) >= 1


def test_revision_ab_imports_another_revisions_kernels(tmp_path):
    # The base side is triton_src as git has it at a revision, a package of its own beside the
    # working tree's, with that revision's tuning/launch.py bound to it: its launch helpers and the
    # three Hopper specs, from its own files, from which each kernel's call is put together before
    # anything runs.
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: no revision to take triton_src from")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from types import SimpleNamespace

    from revision_ab import PACKAGE, Side, kernel_call, load_revision

    import triton_src
    import tuning.launch

    problem = SimpleNamespace(q=None, k=None, v=None, dout=None, lse=None, delta=None)
    try:
        base = load_revision("HEAD", tmp_path)
        assert base.kernels.__name__ == PACKAGE and Path(base.kernels.__file__).is_relative_to(tmp_path)
        assert Path(base.launch.__file__).is_relative_to(tmp_path)
        assert base.launch.backward_dkdv is not tuning.launch.backward_dkdv
        assert base.launch.ATTN_FWD is base.kernels.forward.ATTN_FWD  # the launcher drives the copy's kernels
        assert ({s.name for s in base.kernels.IMPLEMENTATIONS.values()}
                == {s.name for s in triton_src.IMPLEMENTATIONS.values()})
        for kernel in ("forward", "dkdv", "dq"):
            assert callable(kernel_call(base, kernel, problem, (128, 64, 4, 1), True, 0.0, False, 2))
        without_specs = Side(kernels=SimpleNamespace(), launch=base.launch)
        for kernel in ("forward", "dkdv", "dq"):
            with pytest.raises(AttributeError):
                kernel_call(without_specs, kernel, problem, (128, 64, 4, 1), True, 0.0, False, 2)
        with pytest.raises(SystemExit, match="git archive no-such-revision"):
            load_revision("no-such-revision", tmp_path / "other")
        # A copy without git history takes the same files from a tar that git archive wrote.
        tar = tmp_path / "base.tar"
        tar.write_bytes(subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD", "triton_src",
                                        "tuning/launch.py"], capture_output=True, check=True).stdout)
        from_tar = load_revision(str(tar), tmp_path / "from_tar")
        assert Path(from_tar.kernels.__file__).is_relative_to(tmp_path / "from_tar")
        assert Path(from_tar.launch.__file__).is_relative_to(tmp_path / "from_tar")
        assert ({s.name for s in from_tar.kernels.IMPLEMENTATIONS.values()}
                == {s.name for s in triton_src.IMPLEMENTATIONS.values()})
    finally:
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]
        if str(tmp_path) in sys.path:
            sys.path.remove(str(tmp_path))


def test_revision_ab_takes_the_grids_tiles_and_the_ops_programs():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from revision_ab import compare, grid_tiles, op_programs
    from triton_src.variants import score_mod_value

    # The tiles configs.json's implementations give, or a refusal naming what the grid lacks.
    plain, softcap_alibi = score_mod_value("plain"), score_mod_value("softcap_alibi")
    assert grid_tiles("dkdv", 64, plain, True) == (64, 128, 4, 1)
    assert grid_tiles("dkdv", 128, softcap_alibi, True) == (64, 64, 4, 1)
    assert grid_tiles("dq", 128, plain, False)[:2] == (128, 64)
    assert grid_tiles("forward", 64, plain, False)[:2] == (192, 128)
    with pytest.raises(SystemExit, match="attn_bwd_dq_sm90 for no 64 bucket"):
        grid_tiles("dq", 64, plain, False)
    with pytest.raises(SystemExit, match="attn_fwd_sm90 for no 64 bucket with SCORE_MOD softcap_alibi"):
        grid_tiles("forward", 64, softcap_alibi, False)
    # csrc/attention/query_tile_programs.cpp's choices at the benchmark's d128 shapes on 132 SMs
    # (benchmarks/results/forward_programs_per_pair_h100/: model_g), and its short causal rule.
    assert [op_programs(tiles, pairs, False, 132) for tiles, pairs in ((32, 64), (64, 32), (128, 16))] == [2, 4, 8]
    assert op_programs(4, 64, True, 132) == 4 and op_programs(1, 64, False, 132) == 1
    a, b = torch.zeros(3), torch.tensor([0.0, 0.5, float("nan")])
    assert compare((a, a), (a, a), ("dk", "dv")) == {"dk_equal": True, "dk_max_abs_diff": 0.0,
                                                     "dv_equal": True, "dv_max_abs_diff": 0.0}
    assert compare(a, b, ("dq",)) == {"dq_equal": False, "dq_max_abs_diff": float("inf")}
    with pytest.raises(ValueError):
        compare((a, a, a), (a, a), ("dk", "dv", "dq"))


def test_hopper_backward_ab_takes_the_grids_tiles_or_a_chosen_form():
    sys.path.insert(0, str(ROOT / "benchmarks" / "studies"))
    try:
        from hopper_backward_ab import hopper_tiles
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "studies"))
    assert (hopper_tiles(128, 0, None).block_m, hopper_tiles(128, 0, None).block_n) == (64, 128)
    assert hopper_tiles(256, 1, None).block_n == 64  # the wide-head form
    assert hopper_tiles(128, 1, 64).block_n == 64  # d128 softcap: a bucket the grid leaves to attn_bwd_dkdv
    with pytest.raises(SystemExit, match="give --block-n"):
        hopper_tiles(128, 1, None)
    # --dq: the accumulating variant's own tile, and the split path's dK/dV kernel as the grid has it.
    assert hopper_tiles(64, 0, None, accumulate_dq=True).block_n == 128
    from hopper_backward_ab import split_dkdv

    assert split_dkdv(64, 0)[0].name == "attn_bwd_dkdv_sm90" and split_dkdv(128, 1)[0].name == "attn_bwd_dkdv"
    # --dq-kernel and the split path's second half: the Hopper dQ where the grid builds it.
    from hopper_backward_ab import split_dq

    spec, tiles = split_dq(128, 0)
    assert spec.name == "attn_bwd_dq_sm90" and (tiles.block_m, tiles.block_n) == (128, 64)
    assert split_dq(64, 0)[0].name == "attn_bwd_dq" and split_dq(128, 1)[0].name == "attn_bwd_dq_sm90"
    assert split_dq(128, 2)[0].name == "attn_bwd_dq" and split_dq(256, 0)[0].name == "attn_bwd_dq"


def test_interleaved_timing_alternates_the_callables():
    # The A/B scripts' measure (benchmarks/common.py): each sample of one callable is followed by
    # one of the other, and every callable gets a median of its own.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from common import interleaved_ms
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    calls = []
    ms = interleaved_ms({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, pairs=3, reps=2)
    assert set(ms) == {"a", "b"} and all(t >= 0 for t in ms.values())
    # Each sample is one untimed call and `reps` timed ones: runs of 3, alternating.
    assert calls == (["a"] * 3 + ["b"] * 3) * 3


@pytest.mark.parametrize("result", ["forward_h100.json", "dq_sm90_h100/backward_d128_flex_h100.json",
                                    "decode_h100.json", "host_h100.json", "variants_h100/variants.json"])
def test_plot_draws_each_benchmarks_json(result, tmp_path):
    # One plot.py for every benchmark CLI's JSON: the "benchmark" field picks the plot, and the
    # committed files' older layouts (forward_h100.json's "env", decode_h100.json's "setting") still draw.
    pytest.importorskip("matplotlib")
    out = tmp_path / "plot.png"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plot.py"),
                             str(ROOT / "benchmarks" / "results" / result), "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and out.stat().st_size > 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_profile_call_prints_the_host_table_on_a_cpu():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_call.py"), "host", "--device", "cpu",
                             "--op", "forward", "--calls", "3", "--rows", "5"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and "fattn::forward" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]


def test_bench_variants_flex_peers_compute_what_fattn_computes():
    # The score_mod study compares fattn with FlexAttention given "the same modification": on the
    # CPU (float32) each Flex peer must match the reference of fattn's call. Flex runs eager here:
    # the peers' definitions (score_mod, block masks) are what is checked, and compiling each one
    # on the CPU took 80 s of a cold CI machine.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_variants
    from torch.nn.attention.flex_attention import flex_attention

    from fattn.reference import attention_reference

    args = bench_variants.parse_args(["--device", "cpu", "--quick"])
    flex = bench_variants.Flex("cpu")
    flex.flex = flex_attention
    b, h, s, d = 2, 4, 128, 16
    q, k, v = (torch.randn(b, s, h, d) for _ in range(3))
    peers = 0
    for causal in (False, True):
        for mod, (options, kind) in bench_variants.score_mod_variants(args, causal, b, h, s).items():
            if kind is None:
                continue
            options = dict(options)
            group = options.pop("gqa", 1)
            kv = (k, v) if group == 1 else tuple(t[:, :, :h // group].contiguous() for t in (k, v))
            call = bench_variants._flex_peer(flex, kind, s, causal, options)
            out = call(q.transpose(1, 2), *(t.transpose(1, 2).contiguous() for t in kv)).transpose(1, 2)
            want, _ = attention_reference(q, *kv, None, causal, **options)
            assert (out.double() - want.double()).abs().max().item() < 1e-5, (mod, causal)
            peers += 1
    assert peers == 14  # plain, softcap, alibi, both, window, segments, gqa; causal and not


def test_mbarrier_sync_probe_reads_the_compilers_barriers():
    # It compiles its Gluon kernels for sm_90 without a GPU and reports, per case, whether a
    # bar.sync sits in the loop: an arrive alone never needs one (a probe that said so would be
    # reading the PTX wrong); the wait-then-arrive cases say what this Triton does.
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "mbarrier_sync_probe.py")], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    verdicts = [line for line in result.stdout.splitlines() if line.endswith(("bar.sync in the loop", "no bar.sync"))]
    assert len(verdicts) == 4 and verdicts[0] == "arrive alone: no bar.sync", result.stdout
    assert "mbarrier.try_wait" in result.stdout and "mbarrier.arrive" in result.stdout
