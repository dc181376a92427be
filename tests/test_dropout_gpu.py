"""Dropout on a GPU: the kernels' keep-mask is the CPU's for the same seed (read back through
one-hot values), out and every gradient match the float64 reference drawn with that mask (2x
rule), with bias, window, softcap and GQA; the kept fraction at p = 0.1 and 0.5; the mean of
many draws; deterministic backward bitwise; CUDA-graph replays draw fresh masks (skipped
without a GPU)."""

import pytest
import torch

import fattn
from fattn.reference import attention_reference, dropout_keep_mask
from helpers import check_accuracy, check_gradients, make_qkv, requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]

FORWARD = torch.ops.fattn.forward.default
SHAPES = [(2, 113, 113, 4, 2, 64), (1, 1000, 1000, 8, 1, 128), (1, 17, 1000, 2, 2, 32), (2, 128, 77, 4, 4, 80)]
VARIANTS = [dict(causal=False), dict(causal=True), dict(causal=False, window_size=(64, 32), softcap=30.0),
            dict(causal=True, bias=True)]
SHAPE_ID = "b{}-sq{}-sk{}-h{}-hk{}-d{}".format


def _seed(value, device="cuda"):
    return torch.tensor([value], dtype=torch.int64, device=device)


def _op(q, k, v, causal, p, seed, window=(-1, -1), softcap=0.0, bias=None):
    return FORWARD(q, k, v, None, causal, False, window[0], window[1], softcap, None, None, None, None, bias, p, seed)


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_keep_mask_is_the_cpu_mask_for_the_same_seed(head_dim, p):
    batch, heads, seqlen = 2, 3, head_dim  # one-hot values: one column per key
    q = torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16) * 0.1
    k = torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16) * 0.1
    v = torch.eye(seqlen, head_dim, device="cuda", dtype=torch.bfloat16)[None, :, None].expand(
        batch, seqlen, heads, head_dim).contiguous()
    seed = 0x1234_5678_9ABC_DEF0 - 2**63
    out, _ = _op(q, k, v, False, p, _seed(seed))
    kept = (out != 0).permute(0, 2, 1, 3).cpu()
    want, keep_probability = dropout_keep_mask(seed, batch, heads, seqlen, seqlen, p)
    assert torch.equal(kept, want)
    cpu_out, _ = _op(q.cpu().double(), k.cpu().double(), v.cpu().double(), False, p, _seed(seed, "cpu"))
    assert torch.equal((cpu_out != 0).permute(0, 2, 1, 3), want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda c: SHAPE_ID(*c))
def test_forward_matches_reference_with_the_same_mask(shape, variant, dtype):
    q, k, v = make_qkv(*shape, dtype, "cuda")
    options = dict(variant)
    causal = options.pop("causal")
    bias = (torch.randn(shape[0], 1, shape[1], shape[2], device="cuda") * 2).to(dtype) if options.pop("bias", 0) \
        else None
    seed = _seed(987654321)
    out, lse = _op(q, k, v, causal, 0.3, seed, options.get("window_size", (-1, -1)), options.get("softcap", 0.0),
                   bias)
    check_accuracy(out, lse, q, k, v, None, causal, what=f"{shape} {variant} {dtype}", bias=bias, dropout_p=0.3,
                   dropout_seed=seed, **options)


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda c: SHAPE_ID(*c))
def test_gradients_match_reference_with_the_same_mask(shape, variant):
    dtype = torch.bfloat16
    q, k, v = make_qkv(*shape, dtype, "cuda")
    options = dict(variant)
    causal = options.pop("causal")
    bias = (torch.randn(shape[0], 1, shape[1], shape[2], device="cuda") * 2).to(dtype) if options.pop("bias", 0) \
        else None
    window, softcap = options.get("window_size", (-1, -1)), options.get("softcap", 0.0)
    seed = _seed(13)
    w_out = torch.randn(q.shape, device="cuda")

    def grads(fn, tensors):
        leaves = [t.detach().requires_grad_() for t in tensors]
        out = fn(*leaves)
        return torch.autograd.grad((out.to(w_out.dtype) * w_out).sum(), leaves)

    got = grads(lambda q, k, v: _op(q, k, v, causal, 0.3, seed, window, softcap, bias)[0], (q, k, v))
    ref = grads(lambda q, k, v: attention_reference(q, k, v, None, causal, window_size=window, softcap=softcap,
                                                    bias=bias, dropout_p=0.3, dropout_seed=seed)[0],
                (q.double(), k.double(), v.double()))
    low = grads(lambda q, k, v: attention_reference(q, k, v, None, causal, dtype=dtype, window_size=window,
                                                    softcap=softcap, bias=bias, dropout_p=0.3, dropout_seed=seed)[0],
                (q, k, v))
    check_gradients(got, ref, low, dtype, what=f"{shape} {variant}")


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_kept_fraction_and_mean_of_draws(p):
    batch, seqlen, heads, head_dim = 1, 256, 2, 64
    q = torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16) * 0.05
    k = torch.randn_like(q) * 0.05
    v = torch.eye(seqlen, device="cuda", dtype=torch.bfloat16)[None, :, None, :head_dim].expand(
        batch, seqlen, heads, head_dim).contiguous()
    out, _ = _op(q, k, v, False, p, _seed(77))
    kept = (out != 0).double().mean().item()
    n = out.numel()
    sigma = ((1 - p) * p / n) ** 0.5
    assert abs(kept - (1 - p)) < 6 * sigma + 1e-3, (kept, 1 - p)
    # The mean of many draws approaches the output without dropout.
    v = torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    plain = fattn.flash_attn_func(q, k, v).float()
    torch.manual_seed(0)
    draws = 400
    mean = sum(fattn.flash_attn_func(q, k, v, p).float() for _ in range(draws)) / draws
    single = fattn.flash_attn_func(q, k, v, p).float()
    assert (mean - plain).abs().max().item() < 0.5 * (single - plain).abs().max().item()


def test_deterministic_backward_with_dropout_is_bitwise_reproducible():
    q, k, v = make_qkv(2, 300, 300, 8, 2, 128, torch.bfloat16, "cuda")
    dout = torch.randn_like(q)
    results = []
    for _ in range(2):
        torch.manual_seed(5)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = fattn.flash_attn_func(*leaves, 0.2, causal=True, deterministic=True)
        results.append((out, *torch.autograd.grad(out, leaves, dout)))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_cuda_graph_replays_draw_fresh_masks():
    q, k, v = make_qkv(1, 128, 128, 2, 2, 64, torch.bfloat16, "cuda")
    static = {}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up
            fattn.flash_attn_func(q, k, v, 0.5)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static["out"] = fattn.flash_attn_func(q, k, v, 0.5)
    outs = []
    for _ in range(3):
        graph.replay()
        outs.append(static["out"].clone())
    torch.cuda.synchronize()
    assert not torch.equal(outs[0], outs[1]) and not torch.equal(outs[1], outs[2])
    assert all(torch.isfinite(o).all() for o in outs)
