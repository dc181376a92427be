"""Ring attention on several GPUs over NCCL, one process per GPU under torchrun (skipped without
2 GPUs; the checks themselves live in ring_gpu_worker.py), and the ring's schedule simulated on one
GPU (fattn.ring.simulate)."""

from pathlib import Path

import pytest
import torch

from helpers import run_on_gpus

pytestmark = pytest.mark.gpu


WORLDS = [w for w in (2, 4) if w <= torch.cuda.device_count()] or [2]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 or more GPUs")
@pytest.mark.parametrize("world", WORLDS)
def test_ring_on_gpus_matches_float64_reference(world):
    run_on_gpus(Path(__file__).with_name("ring_gpu_worker.py"), world, "all ring checks passed", timeout=600)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("sharding", ["zigzag", "contiguous"])
@pytest.mark.parametrize("variant", [dict(causal=True), dict(causal=True, window_size=(300, -1)),
                                     dict(window_size=(100, 400), softcap=30.0), dict(causal=True, sinks=True),
                                     dict(causal=True, alibi=True), dict(window_size=(100, 400), alibi=True)],
                         ids=["causal", "window", "two-sided-softcap", "sinks", "alibi", "two-sided-alibi"])
def test_simulated_ring_on_one_gpu_meets_the_2x_rule(world, sharding, variant):
    # fattn.ring.simulate: every virtual rank's steps, in ring order, on one GPU (bf16), against
    # the float64 reference with the 2x rule. Chunks of 128 rows: every window crosses chunks.
    from fattn import ring
    from fattn.reference import attention_reference

    variant = dict(variant)
    g = torch.Generator(device="cuda").manual_seed(world)
    n, h, hk, d = 256 * world, 8, 2, 128
    q = torch.randn(2, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(2, n, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    if variant.pop("sinks", False):
        variant["sinks"] = torch.randn(h, device="cuda", generator=g)
    if variant.pop("alibi", False):
        variant["alibi_slopes"] = torch.rand(2, h, device="cuda", generator=g) * 0.05
    causal = variant.pop("causal", False)
    out, lse = ring.simulate(q, k, v, world, causal=causal, sharding=sharding, return_lse=True, **variant)
    ref, ref_lse = attention_reference(q.double(), k.double(), v.double(), None, causal, **variant)
    low, _ = attention_reference(q, k, v, None, causal, dtype=torch.bfloat16, **variant)
    err = (out.double() - ref).abs().max().item()
    base = (low.double() - ref).abs().max().item()
    assert err <= 2 * base + 1e-5, f"out error {err:.3e} > 2 x torch's bf16 error {base:.3e}"
    assert (lse.double() - ref_lse).abs().max().item() <= 1e-3
