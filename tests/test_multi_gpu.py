"""Tensors on the second GPU while the current device is the first (skipped with fewer than two
GPUs): every op runs where its tensors live. Each call on cuda:1 must give what the same call
gives with cuda:1 current (the kernels are deterministic, so bit for bit), allocate nothing on
cuda:0 and launch no kernel there (a profiler trace); inputs on two GPUs are refused by name with
every input unchanged; CUDA graphs captured on cuda:1 replay with new inputs."""

import pytest
import torch

import fattn

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 or more GPUs")]

OTHER = torch.device("cuda", 1)


def _inputs(seed=0, seqlen=300, heads=8, kv_heads=2, d=128):
    g = torch.Generator(device=OTHER).manual_seed(seed)
    q = torch.randn(2, seqlen, heads, d, device=OTHER, dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(2, seqlen, kv_heads, d, device=OTHER, dtype=torch.bfloat16, generator=g) for _ in range(2))
    return q, k, v


def _attention(q, k, v):
    """Forward and backward with the variants (window, softcap, ALiBi, sinks)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    sinks = torch.linspace(-1, 1, q.shape[2], device=q.device).requires_grad_()
    alibi = torch.linspace(0.1, 0.8, q.shape[2], device=q.device)
    out, lse, _ = fattn.flash_attn_func(*leaves, causal=True, window_size=(100, 0), softcap=30.0, alibi_slopes=alibi,
                                        return_attn_probs=True, sinks=sinks)
    grads = torch.autograd.grad((out.float() * torch.cos(out.float())).sum(), [*leaves, sinks])
    return (out, lse, *grads)


def _decode(q, k, v):
    """A paged cache with a one-token append, then the merge of two halves of the keys."""
    page, pages = 64, 8
    k_cache = torch.zeros(2 * pages, page, k.shape[2], k.shape[3], device=q.device, dtype=q.dtype)
    v_cache = torch.zeros_like(k_cache)
    k_cache.view(-1, *k.shape[2:])[: 2 * 200] = k[:, :200].reshape(-1, *k.shape[2:])
    v_cache.view(-1, *v.shape[2:])[: 2 * 200] = v[:, :200].reshape(-1, *v.shape[2:])
    block_table = torch.arange(2 * pages, device=q.device, dtype=torch.int32).view(2, pages)
    seqlens = torch.tensor([100, 150], device=q.device, dtype=torch.int32)
    out, lse = fattn.flash_attn_with_kvcache(q[:, :1], k_cache, v_cache, k[:, 200:201], v[:, 200:201],
                                             cache_seqlens=seqlens, block_table=block_table, causal=True,
                                             return_lse=True)
    halves = [fattn.flash_attn_func(q, k[:, s], v[:, s], return_lse=True) for s in (slice(0, 150), slice(150, None))]
    merged = fattn.merge_attention_states([h[0] for h in halves], [h[1] for h in halves])
    return (out, lse, k_cache, v_cache, *merged)


CALLS = {"attention forward and backward": _attention, "decode, append and merge": _decode}


@pytest.mark.parametrize("name", CALLS)
def test_ops_run_on_their_tensors_gpu_while_another_is_current(name):
    call = CALLS[name]
    with torch.cuda.device(OTHER):
        expected = call(*_inputs())
    torch.cuda.set_device(0)
    torch.cuda.synchronize(0)
    inputs = _inputs()
    torch.cuda.reset_peak_memory_stats(0)
    before = torch.cuda.memory_allocated(0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        got = call(*inputs)
        torch.cuda.synchronize(OTHER)
    assert torch.cuda.current_device() == 0
    assert torch.cuda.max_memory_allocated(0) == before, f"{name}: allocated on cuda:0"
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert kernels, f"{name}: the profiler saw no kernel at all"
    assert {e.device_index for e in kernels} == {1}, (
        f"{name}: kernels on devices {sorted({e.device_index for e in kernels})}")
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.device == OTHER, f"{name}: output {i} on {g.device}"
        assert torch.equal(g, e), f"{name}: output {i} differs from the call made with cuda:1 current"


def test_inputs_on_two_gpus_are_refused_by_name():
    q, k, v = _inputs()
    q0 = q.to("cuda:0")
    snapshots = [t.clone() for t in (q0, k, v)]
    with pytest.raises(RuntimeError, match=r"k is on cuda:1 but q is on cuda:0"):
        fattn.flash_attn_func(q0, k, v)
    for t, s in zip((q0, k, v), snapshots):
        assert torch.equal(t, s)


def test_cuda_graph_captured_on_the_second_gpu_replays_with_new_inputs():
    q, k, v = _inputs(seed=1)
    with torch.cuda.device(OTHER):
        fattn.flash_attn_func(q, k, v, causal=True)  # load the modules before capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fattn.flash_attn_func(q, k, v, causal=True)
    torch.cuda.set_device(0)
    for seed in (2, 3):
        for dst, src in zip((q, k, v), _inputs(seed=seed)):
            dst.copy_(src)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize(OTHER)
        assert torch.equal(out, fattn.flash_attn_func(q, k, v, causal=True)), f"replay with inputs of seed {seed}"
