"""fattn::forward/backward's alibi_offset: a piece of a longer sequence (rows [a, b) against keys
[c, d), as a ring attention step computes it) given ALiBi's global distances, |(a + i) - (c + j)|.

The expectation is built without the offset: the reference attention over the piece with ALiBi
written out as an additive float64 bias of the global distances. The op takes the distance of
the piece's first row and key less its own diagonal, alibi_offset = (a - c) - ((d - c) - (b - a)),
as fattn.ring computes it for each piece. Gradients go through the op's registered autograd.
On a GPU (skipped without one) the same pieces meet the 2x rule in bf16 at head dims 64 and 128,
which reach the Hopper kernels' score modifications on an H100."""

import pytest
import torch

from fattn.reference import attention_reference
from helpers import BACKWARD, FORWARD, check_fake_raises_like_op, check_gradients, requires_gpu

SEQLEN = 40
# (rows, keys, causal, window): pieces before, after and across the diagonal, of unequal lengths,
# with the piece's own (bottom-right) mask.
PIECES = [
    ((24, 40), (0, 16), False, (-1, -1)),    # keys wholly before the rows
    ((0, 12), (20, 40), False, (-1, -1)),    # keys wholly after
    ((8, 30), (5, 33), True, (-1, -1)),      # across the diagonal, causal over the piece
    ((10, 23), (0, 37), False, (6, 2)),      # a window around the piece's diagonal
    ((0, 40), (0, 40), True, (-1, -1)),      # the whole sequence: alibi_offset 0
]


def _offset(rows, keys):
    return (rows[0] - keys[0]) - ((keys[1] - keys[0]) - (rows[1] - rows[0]))


def _global_alibi_bias(slopes, rows, keys, batch, heads):
    """-slope * |global query - global key| as a float64 [batch, heads, rows, keys] bias."""
    i = torch.arange(*rows, dtype=torch.float64, device=slopes.device)[:, None]
    j = torch.arange(*keys, dtype=torch.float64, device=slopes.device)[None, :]
    return -slopes.double().expand(batch, heads)[:, :, None, None] * (i - j).abs()


def _problem(device, dtype, head_dim, rows, keys, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    batch, heads, kv_heads = 2, 4, 2
    q = torch.randn(batch, SEQLEN, heads, head_dim, device=device, dtype=dtype, generator=g)[:, slice(*rows)]
    k = torch.randn(batch, SEQLEN, kv_heads, head_dim, device=device, dtype=dtype, generator=g)[:, slice(*keys)]
    v = torch.randn(batch, SEQLEN, kv_heads, head_dim, device=device, dtype=dtype, generator=g)[:, slice(*keys)]
    slopes = torch.rand(batch, heads, device=device, generator=g) * 0.3 + 0.02
    w_out = torch.randn(q.shape, device=device, dtype=torch.float64, generator=g)
    w_lse = torch.randn(batch, heads, q.shape[1], device=device, dtype=torch.float64, generator=g)
    return q, k, v, slopes, w_out, w_lse


def _run(fn, q, k, v, w_out, w_lse):
    """(out, lse, dq, dk, dv) of fn, the gradients of sum(out * w_out) + sum(lse * w_lse)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = fn(*leaves)
    loss = (out.double() * w_out).sum() + (lse.double().masked_fill(~torch.isfinite(lse), 0) * w_lse).sum()
    return (out.detach(), lse.detach(), *torch.autograd.grad(loss, leaves))


def _args(q, k, v, slopes, offset, causal=False, window=(-1, -1)):
    """fattn::forward's positional arguments for ALiBi with an offset (no other variant)."""
    return (q, k, v, None, causal, False, window[0], window[1], 0.0, slopes, None, None, None, None, 0.0, None, offset)


# The CPU op in float64 (one head dim: it has no kernels to pick); bf16 on a GPU at the head dims
# whose Hopper kernels take ALiBi.
DEVICE_DTYPE_DIM = [pytest.param("cpu", torch.float64, 64, id="cpu-float64-d64")] + [
    pytest.param("cuda", torch.bfloat16, d, marks=[requires_gpu, pytest.mark.gpu], id=f"cuda-bfloat16-d{d}")
    for d in (64, 128)]


@pytest.mark.parametrize("device, dtype, head_dim", DEVICE_DTYPE_DIM)
@pytest.mark.parametrize("rows, keys, causal, window", PIECES)
def test_a_piece_sees_its_global_distances(device, dtype, head_dim, rows, keys, causal, window):
    q, k, v, slopes, w_out, w_lse = _problem(device, dtype, head_dim, rows, keys)
    bias = _global_alibi_bias(slopes, rows, keys, q.shape[0], q.shape[2])
    offset = _offset(rows, keys)

    def op(q, k, v):
        return FORWARD(*_args(q, k, v, slopes, offset, causal, window))

    def reference(dtype):
        return lambda q, k, v: attention_reference(q, k, v, None, causal, dtype=dtype, window_size=window,
                                                   bias=bias.to(dtype))

    got = _run(op, q, k, v, w_out, w_lse)
    want = _run(reference(torch.float64), q.double(), k.double(), v.double(), w_out, w_lse)
    what = f"rows {rows} keys {keys} causal={causal} window={window} alibi_offset={offset}"
    if dtype == torch.float64:
        for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=f"{what}: {name}")
        return
    low = _run(reference(dtype), q, k, v, w_out, w_lse)
    err = (got[0].double() - want[0]).abs().max().item()
    base = (low[0].double() - want[0]).abs().max().item()
    assert err <= 2 * base + 1e-5, f"{what}: out error {err:.3e} > 2 x torch's {base:.3e} + 1e-5"
    assert torch.equal(torch.isfinite(got[1]), torch.isfinite(want[1])), f"{what}: lse's -inf rows differ"
    assert (got[1].double() - want[1]).nan_to_num(posinf=0, neginf=0).abs().max().item() <= 5e-3, f"{what}: lse"
    check_gradients(got[2:], want[2:], low[2:], dtype, what)


def test_the_offset_changes_the_result():
    # The offset reaches the scores: the same piece with offset 0 differs.
    rows, keys = (24, 40), (0, 16)
    q, k, v, slopes, *_ = _problem("cpu", torch.float64, 16, rows, keys)
    shifted = FORWARD(*_args(q, k, v, slopes, _offset(rows, keys)))
    local = FORWARD(*_args(q, k, v, slopes, 0))
    assert not torch.allclose(shifted[1], local[1])


def test_an_offset_without_slopes_is_refused():
    q, k, v, *_ = _problem("cpu", torch.float32, 16, (0, 8), (0, 8))
    check_fake_raises_like_op(FORWARD, _args(q, k, v, None, 3), r"alibi_offset is 3 but alibi_slopes is None")
    out, lse = FORWARD(q, k, v)
    dout = torch.randn_like(out)
    check_fake_raises_like_op(
        BACKWARD, (dout, q, k, v, out, lse, None, None, False, False, -1, -1, 0.0, None, None, None, None, False,
                   0.0, None, 3), r"alibi_offset is 3 but alibi_slopes is None")


def test_an_offset_past_32_bits_is_refused():
    q, k, v, slopes, *_ = _problem("cpu", torch.float32, 16, (0, 8), (0, 8))
    limit = 2**31 - 1 - 16
    FORWARD(*_args(q, k, v, slopes, -limit))  # the largest distance fits exactly
    for offset in (limit + 1, -limit - 1):
        check_fake_raises_like_op(FORWARD, _args(q, k, v, slopes, offset),
                                  rf"alibi_offset is {offset}; expected \|alibi_offset\| <= {limit}")
