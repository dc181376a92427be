"""Segment ids on the GPU: the kernels visit only the tiles within each tile's span
(triton_src/segments.py), in every implementation the op launches (the Hopper kernels at d64
and d128, attn_fwd with a softcap, the dK/dV pass that accumulates dQ with
deterministic=False).

A document's results must not depend on another document's inputs: with the other document's
q, k, v and dout all NaN, one document's out, lse and gradients equal those of a clean run
(bitwise where the backward is deterministic). Documents are cut at multiples of 384 rows, a
multiple of every tile size, so a kernel that still visits the other document's tiles reads the
NaN (masked scores give zero probabilities, and 0 * NaN is NaN). Ids that go up and down (the
span then holds other documents, which the mask removes) are checked against the float64
reference."""

import pytest
import torch

import fattn
from helpers import check_accuracy, check_variant_gradients, make_qkv, requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]


def _documents(batch, seqlen, firsts, device):
    """Two documents per row: ids 0 up to firsts[b], 1 after."""
    positions = torch.arange(seqlen, device=device)[None, :]
    return (positions >= torch.tensor(firsts, device=device)[:, None]).int()


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim,softcap", [(64, 0.0), (64, 30.0), (128, 0.0), (128, 30.0)],
                         ids=["d64", "d64-softcap", "d128", "d128-softcap"])
def test_a_document_never_reads_another(head_dim, softcap, causal, deterministic):
    torch.manual_seed(head_dim + int(causal))
    # 4608 queries: d64 without a right edge runs the looping Hopper forward (192-row tiles).
    batch, seqlen, heads, kv_heads = 2, 4608, 8, 2
    ids = _documents(batch, seqlen, [2304, 1152], "cuda")
    q, k, v = make_qkv(batch, seqlen, seqlen, heads, kv_heads, head_dim, torch.bfloat16, "cuda")
    dout = torch.randn_like(q)
    # The document checked is the one whose tiles would otherwise reach into the other's: under
    # causal attention only the second sees earlier keys.
    checked = (ids == (1 if causal else 0))[:, :, None, None]
    options = dict(causal=causal, softcap=softcap, deterministic=deterministic, return_lse=True,
                   q_segment_ids=ids, kv_segment_ids=ids)

    def run(q, k, v, dout):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out, lse = fattn.flash_attn_func(q, k, v, **options)
        out.backward(dout)
        return out, lse, q.grad, k.grad, v.grad

    clean = run(q, k, v, dout)
    poisoned = run(*(t.masked_fill(~checked, float("nan")) for t in (q, k, v, dout)))
    lse_rows = checked[..., 0, 0][:, None, :].expand(-1, heads, -1)
    for name, c, p, rows in zip(("out", "lse", "dq", "dk", "dv"), clean, poisoned,
                                (checked, lse_rows, checked, checked, checked)):
        c, p = c[rows.expand_as(c)], p[rows.expand_as(p)]
        assert not p.isnan().any(), f"{name}: one document read another's NaN"
        if deterministic or name in ("out", "lse"):
            assert torch.equal(c, p), f"{name}: one document's results depend on another's inputs"
        else:  # dQ's additions come in a varying order
            torch.testing.assert_close(p, c, atol=2e-2, rtol=2e-2, msg=f"{name}")
    check_accuracy(clean[0], clean[1], q, k, v, None, causal, what=f"d{head_dim} causal={causal}", softcap=softcap,
                   q_segment_ids=ids, kv_segment_ids=ids)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_ids_that_go_up_and_down(head_dim, causal):
    torch.manual_seed(7 + head_dim)
    batch, seqlen_q, seqlen_k, heads, kv_heads = 2, 1000, 3824, 4, 2
    runs = torch.randint(0, 4, (batch, seqlen_k // 300 + 1), device="cuda")
    kv_ids = runs.repeat_interleave(300, dim=1)[:, :seqlen_k].int().contiguous()
    q_ids = kv_ids[:, seqlen_k - seqlen_q:].contiguous()
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, torch.bfloat16, "cuda")
    options = dict(q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    out, lse = fattn.flash_attn_func(q, k, v, causal=causal, return_lse=True, **options)
    check_accuracy(out, lse, q, k, v, None, causal, what=f"d{head_dim} runs causal={causal}", **options)
    check_variant_gradients(q, k, v, f"d{head_dim} runs causal={causal}", causal=causal, **options)
