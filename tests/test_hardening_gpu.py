"""Every op under the conditions a real program creates (skipped without a GPU): on the
caller's stream, captured in a CUDA graph and replayed on new inputs, with inputs past 2^31
elements, first calls from many threads at once (each module loaded once), after a failing driver
call, and under compute-sanitizer's memcheck, racecheck and synccheck."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fattn
from helpers import OPS, SAMPLE_INPUTS, check_accuracy, requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]

HERE = Path(__file__).resolve().parent


def _clone(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _first_sample(name):
    return next(iter(SAMPLE_INPUTS[name]("cuda", torch.bfloat16))).args


def _outputs(result):
    return [t for t in (result if isinstance(result, (tuple, list)) else [result]) if isinstance(t, torch.Tensor)]


def _same(got, want, what):
    for g, w in zip(_outputs(got), _outputs(want)):
        assert torch.equal(torch.isnan(g), torch.isnan(w)), f"{what}: NaN pattern differs"
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("name", list(SAMPLE_INPUTS))
def test_every_op_runs_on_the_current_stream(name):
    # The first input is rewritten on a busy side stream just before the call: an op that
    # launched on another stream would read the old values.
    args = _clone(_first_sample(name))
    fresh = torch.randn_like(args[0])
    want = OPS[name](*_clone([fresh, *args[1:]]))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        args[0].copy_(fresh)
        got = OPS[name](*args)
    side.synchronize()
    _same(got, want, f"{name} on a side stream")


@pytest.mark.parametrize("name", list(SAMPLE_INPUTS))
def test_every_op_captures_and_replays(name):
    static = _clone(_first_sample(name))
    OPS[name](*_clone(static))  # load the modules before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = OPS[name](*static)
    for _ in range(2):
        static[0].copy_(torch.randn_like(static[0]))
        want = OPS[name](*_clone(static))  # eager, on copies (decode appends to its caches)
        graph.replay()
        torch.cuda.synchronize()
        _same(captured, want, f"{name} graph replay")


def test_inputs_past_2_pow_31_elements():
    # q and out hold 2^31 + 2^11 elements each (4 GiB in bf16): every offset past 2^31 must be
    # 64-bit. The forward and the gradient of q are spot-checked at both ends.
    tokens, heads, d = (1 << 22) + 4, 4, 128
    assert tokens * heads * d > 2**31
    q = torch.randn(1, tokens, heads, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(1, 64, heads, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    v = torch.randn(1, 64, heads, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    out, lse = fattn.flash_attn_func(q, k, v, return_lse=True)
    for rows in (slice(0, 64), slice(tokens - 64, tokens)):
        check_accuracy(out[:, rows], lse[:, :, rows], q[:, rows].detach(), k.detach(), v.detach(), None, False,
                       what=f"rows {rows}")
    dout = torch.zeros_like(out)
    dout[:, -8:] = torch.randn_like(dout[:, -8:])
    dq, = torch.autograd.grad(out, q, dout)
    q_tail = q[:, -8:].detach().double().requires_grad_()
    ref = torch.nn.functional.scaled_dot_product_attention(q_tail.transpose(1, 2), k.double().transpose(1, 2),
                                                           v.double().transpose(1, 2)).transpose(1, 2)
    want, = torch.autograd.grad(ref, q_tail, dout[:, -8:].double())
    err = (dq[:, -8:].double() - want).abs().max().item()
    assert err < 2e-2, f"dq past 2^31 elements: error {err}"
    assert dq[:, :-8].abs().max().item() == 0  # rows without upstream gradient


_THREADED_FIRST_CALLS = """
import json, sys, threading, torch, fattn
from fattn._library import module_loads
threaded = sys.argv[1] == "threads"
torch.manual_seed(0)
inputs = [tuple(torch.randn(1, 100 + 7 * i, 4, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
          for i in range(16)]
results, errors = [None] * 16, []
start = threading.Barrier(16 if threaded else 1)
def work(i):
    try:
        start.wait()
        with torch.cuda.stream(torch.cuda.Stream()):
            out = fattn.flash_attn_func(*inputs[i], causal=i % 2 == 0)
            torch.cuda.current_stream().synchronize()
            results[i] = out
    except Exception as e:
        errors.append(repr(e))
if threaded:
    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    [t.start() for t in threads]
    [t.join() for t in threads]
else:
    [work(i) for i in range(16)]
assert not errors, errors
loads = module_loads()
for i, out in enumerate(results):
    want = fattn.flash_attn_func(*inputs[i], causal=i % 2 == 0)
    assert torch.equal(out, want), i
assert module_loads() == loads, "calls after the first ones loaded modules again"
print(json.dumps(loads))
"""


def _first_calls(how):
    result = subprocess.run([sys.executable, "-c", _THREADED_FIRST_CALLS, how], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_first_calls_from_many_threads_load_each_module_once():
    # Fresh processes, so that every module loads for the first time: 16 threads released at
    # once load exactly the modules (and as many times) as the same calls made one by one.
    serial, threaded = _first_calls("serial"), _first_calls("threads")
    assert serial["functions"] >= 1 and serial["attempts"] == serial["functions"], serial
    assert threaded == serial, f"16 threads: {threaded}; one thread: {serial}"


_DRIVER_FAILURE = """
import os, torch, fattn
from fattn._library import module_loads
torch.manual_seed(0)
q, k, v = (torch.randn(2, 333, 4, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
before = [t.clone() for t in (q, k, v)]
os.environ["FATTN_FORCE_PTX_ARCH"] = "80"  # PTX, which this process's driver refuses to JIT
try:
    fattn.flash_attn_func(q, k, v)
    torch.cuda.synchronize()
    print("no error")
except RuntimeError as e:
    print("error:", e)
assert all(torch.equal(a, b) for a, b in zip((q, k, v), before)), "an input changed"
del os.environ["FATTN_FORCE_PTX_ARCH"]  # back to the device's cubin
out = fattn.flash_attn_func(q, k, v)
want = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
print("after:", (out.float() - want.float()).abs().max().item(), module_loads())
"""


def test_a_failing_driver_call_names_the_kernel_and_the_process_stays_usable():
    # A real driver failure: with PTX JIT disabled (CUDA_DISABLE_PTX_JIT=1), loading the sm_80
    # PTX fails in cuModuleLoadData. The error names the call, the kernel and the driver's
    # error; the failed load is not cached, and the next call (the device's cubin) is correct.
    # Errors that poison the CUDA context (a trap or illegal address inside a kernel) cannot be
    # recovered from in any library; FATTN_DEBUG_CHECKS=1 turns bad cache values into Python errors.
    if 80 not in {k["arch"] for k in fattn.build_info()["kernels"] if k["kernel"] == "attn_fwd"}:
        pytest.skip("this build has no sm_80 PTX")
    # CUDA_CACHE_DISABLE: the driver would otherwise load a JIT result cached by an earlier run.
    env = dict(os.environ, CUDA_DISABLE_PTX_JIT="1", CUDA_CACHE_DISABLE="1")
    result = subprocess.run([sys.executable, "-c", _DRIVER_FAILURE], capture_output=True, text=True, timeout=600,
                            env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    print(result.stdout)
    error = next(line for line in result.stdout.splitlines() if line.startswith(("error:", "no error")))
    assert error.startswith("error: fattn: CUDA driver error in cuModuleLoadData for kernel attn_fwd"), error
    assert "sm_80 PTX" in error and "CUDA_ERROR_" in error, error
    after = next(line for line in result.stdout.splitlines() if line.startswith("after:"))
    assert float(after.split()[1]) < 2e-2, after
    assert after.endswith("{'attempts': 2, 'functions': 1}"), after  # the failed load was retried, not cached


# The Hopper kernels (Gluon, warp-specialized; names ending in _sm90) are left out of the sample
# calls' racecheck and checked one call at a time below: racecheck reports hazards in every
# warp-specialized Gluon kernel between Triton's own code that hands a partition its values (the
# default warps store them at the top of shared memory, the partitions load them after a CTA-wide
# named barrier), also in a 30-line kernel with no fattn code (docs/notes/tuning.md T12).
HOPPER_KERNELS = "_sm90"
# Where Triton 3.6 keeps a partition's values: the allocation's last 1 KB-aligned block, after
# every swizzled tile (1 KB-aligned); the mbarriers may share it, the data buffers do not.
CAPTURE_ALIGN = 1024
SHARED_BASE = 0x400  # racecheck's address of a block's first dynamic shared byte on sm_90 (1 KB reserved)


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer (CUDA toolkit) not on PATH")
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")  # (checked first: the bottom mark)
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_compute_sanitizer_finds_nothing(tool):
    only = ["--kernel-name-exclude", f"kns={HOPPER_KERNELS}"] if tool == "racecheck" else []
    result = subprocess.run(["compute-sanitizer", "--tool", tool, *only, "--error-exitcode", "99", sys.executable,
                             str(HERE / "sanitizer_calls.py")], capture_output=True, text=True, timeout=1500)
    summary = [line for line in result.stdout.splitlines() if "SUMMARY" in line or "calls" in line]
    assert result.returncode == 0, "\n".join(summary) + result.stdout[-3000:] + result.stderr[-2000:]
    # memcheck and synccheck end with "ERROR SUMMARY: 0 errors", racecheck with "RACECHECK
    # SUMMARY: 0 hazards displayed (0 errors, 0 warnings)".
    clean = ("ERROR SUMMARY: 0 errors", "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)")
    assert any(line in result.stdout for line in clean), result.stdout[-3000:]
    print("\n".join(summary))


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer (CUDA toolkit) not on PATH")
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                    reason="needs a CUDA GPU of sm_90 (the Hopper kernels)")
@pytest.mark.parametrize("call", ["forward-d128", "forward-d64", "forward-d96", "forward-d192", "forward-d256",
                                  "backward-d64", "backward-d64-deterministic", "backward-d96",
                                  "backward-d128-softcap", "backward-d256", "dq-d128", "forward-d128-bias",
                                  "backward-d128-bias", "dq-d128-bias"])
def test_racecheck_finds_nothing_in_the_hopper_kernels_own_shared_memory(call):
    # Every shared-memory hazard racecheck reports in the call's Hopper kernel must lie in the
    # variant's last 1 KB-aligned block of shared memory (Triton's partition values), or past its
    # tile buffers where the call says where they end (tiles_end): the K/V/Q/dO rings,
    # lse/delta, P^T/dS^T and the dQ staging tiles all sit below, so a hazard there fails. The
    # call must launch the kernel at all (checked first, without the sanitizer), or racecheck
    # would watch nothing.
    sys.path.insert(0, str(HERE))
    from racecheck_hopper_calls import CALLS

    function = CALLS[call][4]
    if not any(e["function"] == function for e in fattn.build_info()["kernels"]):
        pytest.skip(f"this build has no {function}")
    launch = subprocess.run([sys.executable, str(HERE / "racecheck_hopper_calls.py"), call, "--check-launch"],
                            capture_output=True, text=True, timeout=300)
    assert launch.returncode == 0, launch.stdout[-2000:] + launch.stderr[-2000:]
    result = subprocess.run(["compute-sanitizer", "--tool", "racecheck", "--racecheck-report", "hazard",
                             "--print-limit", "100000", "--kernel-name", f"kns={function}", sys.executable,
                             str(HERE / "racecheck_hopper_calls.py"), call],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    shared = int(next(line.split()[1] for line in result.stdout.splitlines() if line.startswith("shared ")))
    hazards = re.findall(r"hazard detected at __shared__ (0x[0-9a-f]+)", result.stdout)
    summary = next(line for line in result.stdout.splitlines() if "RACECHECK SUMMARY" in line)
    print(summary, f"shared {shared}", sorted(set(hazards))[:20])
    shown, errors, warnings = (int(n) for n in re.search(r"(\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)",
                                                         summary).groups())
    # Every hazard is classified: none left out of the report, each one's address read.
    assert shown == errors + warnings == len(hazards), summary
    tiles_end = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("tiles_end ")]
    window = min([shared // CAPTURE_ALIGN * CAPTURE_ALIGN, *tiles_end])
    outside = sorted({a for a in hazards if not window <= int(a, 16) - SHARED_BASE < shared})
    assert not outside, f"{call}: hazards in the kernel's own shared memory at {outside[:10]}\n" + result.stdout[-3000:]
