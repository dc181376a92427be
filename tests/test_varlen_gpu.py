"""Packed variable-length attention on a GPU: forward and gradients of random batches of
sequences against the float64 reference, one sequence at a time, with flash-attn's 2x rule
(skipped without a GPU)."""

import pytest
import torch

import fattn
from fattn.reference import attention_reference
from helpers import recompiles_forbidden, requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]


def _batch(batch, heads, kv_heads, head_dim, dtype, max_len, seed, same_lengths=True):
    gen = torch.Generator().manual_seed(seed)
    lq = torch.randint(1, max_len + 1, (batch,), generator=gen)
    lk = lq.clone() if same_lengths else torch.randint(1, max_len + 1, (batch,), generator=gen)
    cu_q = torch.nn.functional.pad(lq.cumsum(0), (1, 0)).int().cuda()
    cu_k = torch.nn.functional.pad(lk.cumsum(0), (1, 0)).int().cuda()
    q = torch.randn(int(lq.sum()), heads, head_dim, dtype=dtype, device="cuda")
    k = torch.randn(int(lk.sum()), kv_heads, head_dim, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    return q, k, v, cu_q, cu_k, int(lq.max()), int(lk.max())


def _per_sequence(fn, q, k, v, cu_q, cu_k, dtype, **options):
    outs, lses = [], []
    for b in range(cu_q.numel() - 1):
        qs, qe, ks, ke = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        o, l = fn(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], None, options.get("causal", False), dtype=dtype,
                  window_size=options.get("window_size", (-1, -1)), softcap=options.get("softcap", 0.0))
        outs.append(o[0])
        lses.append(l[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


CASES = [  # batch, heads, kv_heads, head_dim, max_len, same q/k lengths, options
    (1, 4, 2, 64, 2000, True, dict(causal=True)),
    (4, 8, 2, 128, 2000, True, dict(causal=True)),
    (8, 4, 4, 96, 1000, False, dict()),
    (8, 6, 3, 80, 700, False, dict(causal=True)),
    (5, 4, 1, 256, 513, True, dict(window_size=(64, 0), softcap=30.0)),
    (3, 16, 2, 32, 2000, True, dict(window_size=(256, 256))),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}-h{c[1]}-hk{c[2]}-d{c[3]}-max{c[4]}")
def test_varlen_forward_and_gradients_match_reference(case, dtype):
    batch, heads, kv_heads, d, max_len, same, options = case
    q, k, v, cu_q, cu_k, max_q, max_k = _batch(batch, heads, kv_heads, d, dtype, max_len, seed=sum(case[:5]),
                                               same_lengths=same)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, lse = fattn.flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k, return_lse=True, **options)
    ref, ref_lse = _per_sequence(attention_reference, q.double(), k.double(), v.double(), cu_q, cu_k,
                                 torch.float64, **options)
    low, _ = _per_sequence(attention_reference, q, k, v, cu_q, cu_k, dtype, **options)
    err = (out.double() - ref).abs().max().item()
    base = (low.double() - ref).abs().max().item()
    assert err <= 2 * base + 1e-5, f"out error {err:.3e} > 2 x torch error {base:.3e}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[finite].double() - ref_lse[finite]).abs().max().item() <= 5e-3

    w = torch.randn_like(out, dtype=torch.float32)
    got = torch.autograd.grad((out.float() * w).sum(), leaves)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_out, _ = _per_sequence(attention_reference, *ref_leaves, cu_q, cu_k, torch.float64, **options)
    want = torch.autograd.grad((ref_out * w.double()).sum(), ref_leaves)
    low_leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    low_out, _ = _per_sequence(attention_reference, *low_leaves, cu_q, cu_k, dtype, **options)
    low_grads = torch.autograd.grad((low_out.float() * w).sum(), low_leaves)
    for g, r, lo, name in zip(got, want, low_grads, ("dq", "dk", "dv")):
        err = (g.double() - r).abs().max().item()
        base = (lo.double() - r).abs().max().item()
        rounding = 0.5 * torch.finfo(dtype).eps * r.abs().max().item()
        assert err <= 2 * base + 1e-5 + rounding, f"{name}: error {err:.3e} > 2 x torch error {base:.3e}"


def test_varlen_equals_dense_on_equal_lengths_bitwise_close():
    q, k, v = (torch.randn(3, 300, 8, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    cu = torch.arange(0, 901, 300, dtype=torch.int32, device="cuda")
    dense = fattn.flash_attn_func(q, k, v, causal=True)
    packed = fattn.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 300, 300,
                                          causal=True)
    torch.testing.assert_close(packed.view_as(dense), dense, rtol=0, atol=0)


def test_compile_dynamic_new_lengths_do_not_recompile():
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, dynamic=True)
    def f(q, k, v, cu, max_seqlen):
        return fattn.flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen, causal=True) * 2

    for i, lengths in enumerate(([100, 37], [250, 3, 64], [17, 900])):
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        q, k, v = (torch.randn(sum(lengths), 4, 64, dtype=torch.float16, device="cuda") for _ in range(3))
        with recompiles_forbidden(i):
            got = f(q, k, v, cu, max(lengths))
        want = fattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True) * 2
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [16, 40, 64, 128])
def test_rows_past_a_sequence_s_keys_never_reach_dq(head_dim, causal, deterministic):
    """flash-attn's varlen overflow case: one key per sequence beside 34 to 146 queries, inputs
    scaled by 3, so that a key of the next sequence let into a row's softmax overflows it. The
    Hopper dK/dV kernel's dQ accumulation (deterministic=False, head dims 33-64) once added the
    rows past a sequence's keys, the next sequence's, into dQ: NaN rows."""
    torch.manual_seed(0)
    cu_q = torch.tensor([0, 76, 110, 256], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device="cuda")
    q = torch.randn(256, 5, head_dim, dtype=torch.float16, device="cuda") * 3
    k, v = (torch.randn(3, 5, head_dim, dtype=torch.float16, device="cuda") * 3 for _ in range(2))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fattn.flash_attn_varlen_func(*leaves, cu_q, cu_k, 256, 3, causal=causal, deterministic=deterministic)
    w = torch.randn_like(out, dtype=torch.float32)
    got = torch.autograd.grad((out.float() * w).sum(), leaves)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_out, _ = _per_sequence(attention_reference, *ref_leaves, cu_q, cu_k, torch.float64, causal=causal)
    want = torch.autograd.grad((ref_out * w.double()).sum(), ref_leaves)
    low_leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    low_out, _ = _per_sequence(attention_reference, *low_leaves, cu_q, cu_k, torch.float16, causal=causal)
    low_grads = torch.autograd.grad((low_out.float() * w).sum(), low_leaves)
    # One key per row: the softmax is constant, so dS, dQ and dK are 0 but for the rounding of out
    # to fp16 in dP - delta (dQ up to 2e-5 and dK up to 7e-5 on an H200, where torch's fp16
    # gradients are exactly 0); a key of the next sequence let in gives NaN or O(1).
    for g, name in zip(got[:2], ("dq", "dk")):
        assert torch.isfinite(g).all() and g.abs().max().item() <= 1e-3, f"{name} took rows of other sequences"
    for g, r, lo, name in zip(got[2:], want[2:], low_grads[2:], ("dv",)):
        assert torch.isfinite(g).all(), f"{name} has non-finite rows"
        err, base = (g.double() - r).abs().max().item(), (lo.double() - r).abs().max().item()
        rounding = 0.5 * torch.finfo(torch.float16).eps * r.abs().max().item()
        assert err <= 2 * base + 1e-5 + rounding, f"{name}: error {err:.3e} > 2 x torch error {base:.3e}"
