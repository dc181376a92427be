"""fattn.flash_attn_with_kvcache (torch.ops.fattn.decode) on CPU: the op's semantic reference
against the float64 kvcache_reference, the reference itself against attention_reference and
plain loops, the in-place append, opcheck, torch.compile and every bad-input rule of the contract.

test_decode_gpu.py imports the cache helpers below (KVCache, check_outputs, ...).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fattn
from fattn.reference import attention_reference, kvcache_reference

# ---------------------------------------------------------------------------------------------
# Helpers (also used by test_decode_gpu.py)
# ---------------------------------------------------------------------------------------------

CACHE_LAYOUTS = ("contiguous", "fused", "transposed")


class KVCache:
    """A random KV cache, contiguous [batch, capacity, kv_heads, d] or paged
    [num_pages, page_size, kv_heads, d] with a shuffled block_table, stored in one of
    CACHE_LAYOUTS:
      contiguous: k_cache and v_cache are their own contiguous tensors;
      fused: both are views of one [.., .., 2 * kv_heads, d + 8] buffer (padded rows, head and
             token strides that are not the views' own sizes);
      transposed: each is the transpose of a [.., .., kv_heads, d] buffer stored token-major
             (dim 0 stride smaller than dim 1's).
    `bases` are the tensors that own the memory: the append must change nothing else in them.
    """

    def __init__(self, batch, capacity, kv_heads, head_dim, dtype, device, page_size=None,
                 layout="contiguous", spare_pages=3):
        self.batch, self.kv_heads, self.head_dim = batch, kv_heads, head_dim
        self.page_size, self.layout = page_size, layout
        if page_size is None:
            lead = (batch, capacity)
            self.block_table = None
            self.capacity = capacity
        else:
            pages_per_seq = -(-capacity // page_size)
            num_pages = batch * pages_per_seq + spare_pages
            lead = (num_pages, page_size)
            perm = torch.randperm(num_pages, device=device)[: batch * pages_per_seq]
            self.block_table = perm.view(batch, pages_per_seq).to(torch.int32)
            self.capacity = pages_per_seq * page_size
        if layout == "contiguous":
            self.bases = [torch.randn(*lead, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(2)]
        elif layout == "fused":
            self.bases = [torch.randn(*lead, 2 * kv_heads, head_dim + 8, dtype=dtype, device=device)]
        elif layout == "transposed":
            self.bases = [torch.randn(lead[1], lead[0], kv_heads, head_dim, dtype=dtype, device=device)
                          for _ in range(2)]
        else:
            raise ValueError(layout)
        self.k_cache, self.v_cache = self.views(self.bases)
        if layout != "contiguous":
            assert not self.k_cache.is_contiguous() and not self.v_cache.is_contiguous()

    def views(self, bases):
        """(k_cache, v_cache) as views of `bases` (this cache's own, or a snapshot of them)."""
        if self.layout == "contiguous":
            return bases[0], bases[1]
        if self.layout == "fused":
            kv, d = self.kv_heads, self.head_dim
            return bases[0][:, :, :kv, :d], bases[0][:, :, kv:, 8:]
        return bases[0].transpose(0, 1), bases[1].transpose(0, 1)

    def snapshot(self):
        return [b.clone() for b in self.bases]

    def clone(self):
        """An independent copy (same block_table, copied memory)."""
        twin = KVCache.__new__(KVCache)
        twin.__dict__.update(self.__dict__)
        twin.bases = self.snapshot()
        twin.k_cache, twin.v_cache = twin.views(twin.bases)
        return twin

    def slot(self, b, pos):
        """(index0, index1) of key `pos` of sequence `b` in k_cache / v_cache."""
        if self.block_table is None:
            return b, pos
        return int(self.block_table[b, pos // self.page_size]), pos % self.page_size

    def expected_after_append(self, snapshot, k, v, cache_seqlens):
        expected = [t.clone() for t in snapshot]
        if k is not None:
            k_cache, v_cache = self.views(expected)
            lengths = [cache_seqlens] * self.batch if isinstance(cache_seqlens, int) else cache_seqlens.tolist()
            for b in range(self.batch):
                for i in range(k.shape[1]):
                    page, row = self.slot(b, lengths[b] + i)
                    k_cache[page, row] = k[b, i]
                    v_cache[page, row] = v[b, i]
        return expected

    def check_append(self, snapshot, k, v, cache_seqlens, what=""):
        """The cache holds the snapshot with k/v written at cache_seqlens[b] + i, nothing else changed."""
        expected = self.expected_after_append(snapshot, k, v, cache_seqlens)
        for got, want in zip(self.bases, expected):
            if not torch.equal(got, want):
                changed = (got != want).flatten(-2).any(-1).nonzero()[:8].tolist()
                raise AssertionError(f"{what}: cache contents differ from the expected append at "
                                     f"(index0, index1, head) {changed} (first 8)")


def new_tokens(batch, seqlen_new, kv_heads, head_dim, dtype, device):
    if seqlen_new == 0:
        return None, None
    return (torch.randn(batch, seqlen_new, kv_heads, head_dim, dtype=dtype, device=device),
            torch.randn(batch, seqlen_new, kv_heads, head_dim, dtype=dtype, device=device))


def references(q, k_cache, v_cache, cache_seqlens, block_table, k, v, **kw):
    """(float64 out, lse) and the same computation in q's own dtype (the rounding baseline)."""
    ref_out, ref_lse = kvcache_reference(q.double(), k_cache, v_cache, cache_seqlens, block_table, k=k, v=v, **kw)
    low_out, _ = kvcache_reference(q, k_cache, v_cache, cache_seqlens, block_table, k=k, v=v, dtype=q.dtype, **kw)
    return ref_out, ref_lse, low_out


def check_outputs(out, lse, q, ref_out, ref_lse, low_out, what=""):
    """Shapes and dtypes of the contract, then accuracy: float64 tight; other dtypes by
    flash-attn's rule max|out - ref64| <= 2 * max|ref_in_q_dtype - ref64| + 1e-5 and the
    -inf pattern and values of lse."""
    batch, seqlen_q, heads, _ = q.shape
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous(), f"{what}: out layout"
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    assert lse.shape == (batch, heads, seqlen_q) and lse.dtype == lse_dtype, f"{what}: lse {lse.shape} {lse.dtype}"
    assert out.device == q.device and lse.device == q.device
    assert not torch.isnan(out).any(), f"{what}: NaN in out (unwritten or bad math)"
    assert not torch.isnan(lse).any(), f"{what}: NaN in lse"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), (
        f"{what}: lse -inf pattern differs: expected {(~finite).sum().item()} empty rows, "
        f"got {(~torch.isfinite(lse)).sum().item()}")
    assert torch.all(lse[~finite] == float("-inf")), f"{what}: empty rows must have lse -inf"
    assert torch.all(out.transpose(1, 2)[~finite] == 0), f"{what}: rows with no visible key must be 0"
    err = (out.double() - ref_out).abs().max().item() if out.numel() else 0.0
    if q.dtype == torch.float64:
        assert err <= 1e-10, f"{what}: float64 out error {err:.3e}"
        lse_tol = 1e-10
    else:
        base = (low_out.double() - ref_out).abs().max().item()
        assert err <= 2 * base + 1e-5, f"{what}: out error {err:.3e} > 2 x same-dtype error {base:.3e} + 1e-5"
        lse_tol = 2e-5 if q.dtype == torch.float32 else 5e-3
    if finite.any():
        lse_err = (lse[finite].double() - ref_lse[finite].double()).abs().max().item()
        assert lse_err <= lse_tol, f"{what}: lse error {lse_err:.3e} > {lse_tol:.0e}"
    return err


def run_decode(q, cache, cache_seqlens, k=None, v=None, what="", num_splits=0, **kw):
    """Run the op (through the public API), then check out/lse against the reference computed on
    a snapshot taken before the call, and the cache against the expected append."""
    snap = cache.snapshot()
    out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k=k, v=v,
                                             cache_seqlens=cache_seqlens, block_table=cache.block_table,
                                             num_splits=num_splits, return_lse=True, **kw)
    k0, v0 = cache.views(snap)
    ref_out, ref_lse, low_out = references(q, k0, v0, cache_seqlens, cache.block_table, k, v, **kw)
    check_outputs(out, lse, q, ref_out, ref_lse, low_out, what=what)
    cache.check_append(snap, k, v, cache_seqlens, what=what)
    return out, lse


def seqlens_tensor(lengths, device="cpu"):
    return torch.tensor(lengths, dtype=torch.int32, device=device)


# ---------------------------------------------------------------------------------------------
# The reference, checked independently
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (6, 1)])
def test_reference_full_cache_equals_attention_reference(heads, kv_heads, causal):
    q = torch.randn(3, 5, heads, 24, dtype=torch.float64)
    k_cache = torch.randn(3, 37, kv_heads, 24, dtype=torch.float64)
    v_cache = torch.randn_like(k_cache)
    want_out, want_lse = attention_reference(q, k_cache, v_cache, 0.3, causal)
    for cache_seqlens in (None, 37, seqlens_tensor([37, 37, 37])):
        out, lse = kvcache_reference(q, k_cache, v_cache, cache_seqlens, softmax_scale=0.3, causal=causal)
        torch.testing.assert_close(out, want_out, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(lse, want_lse, atol=1e-12, rtol=1e-12)
    # Paged: the same keys scattered over shuffled pages.
    page_size = 16
    pages_per_seq = 3
    table = torch.randperm(3 * pages_per_seq + 2)[: 3 * pages_per_seq].view(3, pages_per_seq).int()
    paged_k = torch.randn(3 * pages_per_seq + 2, page_size, kv_heads, 24, dtype=torch.float64)
    paged_v = torch.randn_like(paged_k)
    full_k = torch.zeros(3, pages_per_seq * page_size, kv_heads, 24, dtype=torch.float64)
    full_v = torch.zeros_like(full_k)
    for b in range(3):
        for p in range(pages_per_seq):
            full_k[b, p * page_size:(p + 1) * page_size] = paged_k[table[b, p]]
            full_v[b, p * page_size:(p + 1) * page_size] = paged_v[table[b, p]]
    out, lse = kvcache_reference(q, paged_k, paged_v, block_table=table, causal=causal)
    want_out, want_lse = attention_reference(q, full_k, full_v, None, causal)
    torch.testing.assert_close(out, want_out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, want_lse, atol=1e-12, rtol=1e-12)


def test_reference_append_equals_attention_over_the_concatenation_and_does_not_mutate():
    q = torch.randn(3, 4, 8, 16, dtype=torch.float64)
    cache = KVCache(3, 30, 2, 16, torch.float64, "cpu", page_size=16)
    k, v = new_tokens(3, 4, 2, 16, torch.float64, "cpu")
    lengths = [0, 9, 26]
    snap = cache.snapshot()
    out, lse = kvcache_reference(q, cache.k_cache, cache.v_cache, seqlens_tensor(lengths), cache.block_table,
                                 causal=True, k=k, v=v)
    for got, before in zip(cache.bases, snap):
        assert torch.equal(got, before), "kvcache_reference modified the cache"
    for b, n in enumerate(lengths):
        keys = torch.stack([cache.k_cache[cache.slot(b, j)] for j in range(n)] + list(k[b].unbind(0)))
        values = torch.stack([cache.v_cache[cache.slot(b, j)] for j in range(n)] + list(v[b].unbind(0)))
        want_out, want_lse = attention_reference(q[b:b + 1], keys[None], values[None], None, True)
        torch.testing.assert_close(out[b:b + 1], want_out, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(lse[b:b + 1], want_lse, atol=1e-12, rtol=1e-12)


def _loop_reference(q, keys, values, scale, causal, window, softcap):
    """One sequence, [seqlen_q, heads, d] and [seqlen_k, kv_heads, d], by explicit loops."""
    seqlen_q, heads, d = q.shape
    seqlen_k, kv_heads = keys.shape[:2]
    left, right = window
    if causal:
        right = 0
    out = torch.zeros(seqlen_q, heads, d, dtype=torch.float64)
    lse = torch.full((heads, seqlen_q), float("-inf"), dtype=torch.float64)
    for h in range(heads):
        kh = h // (heads // kv_heads)
        for t in range(seqlen_q):
            pos = t + seqlen_k - seqlen_q
            seen = [j for j in range(seqlen_k)
                    if (right < 0 or j <= pos + right) and (left < 0 or j >= pos - left)]
            if not seen:
                continue
            s = torch.stack([(q[t, h] * keys[j, kh]).sum() * scale for j in seen])
            if softcap > 0:
                s = softcap * torch.tanh(s / softcap)
            m = s.max()
            e = torch.exp(s - m)
            lse[h, t] = m + torch.log(e.sum())
            out[t, h] = sum(e[i] / e.sum() * values[j, kh] for i, j in enumerate(seen))
    return out, lse


@pytest.mark.parametrize("causal,window,softcap", [
    (False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (False, (3, -1), 0.0), (False, (-1, 1), 0.0),
    (False, (2, 1), 1.5), (True, (4, -1), 0.8), (True, (2, 5), 0.0), (False, (-1, -1), 2.0),
])
def test_reference_against_explicit_loops(causal, window, softcap):
    q = torch.randn(3, 5, 4, 8, dtype=torch.float64)
    cache = KVCache(3, 24, 2, 8, torch.float64, "cpu", page_size=16)
    k, v = new_tokens(3, 2, 2, 8, torch.float64, "cpu")
    lengths = [0, 2, 20]  # 2 keys for 5 queries: rows with no visible key under causal/right windows
    out, lse = kvcache_reference(q, cache.k_cache, cache.v_cache, seqlens_tensor(lengths), cache.block_table,
                                 softmax_scale=0.9, causal=causal, window_size=window, softcap=softcap, k=k, v=v)
    for b, n in enumerate(lengths):
        keys = torch.stack([cache.k_cache[cache.slot(b, j)] for j in range(n)] + list(k[b].unbind(0)))
        values = torch.stack([cache.v_cache[cache.slot(b, j)] for j in range(n)] + list(v[b].unbind(0)))
        want_out, want_lse = _loop_reference(q[b], keys, values, 0.9, causal, window, softcap)
        torch.testing.assert_close(out[b], want_out, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(lse[b], want_lse, atol=1e-12, rtol=1e-12)


def test_reference_softcap_and_window_change_the_result():
    # Guards the parametrisations below against testing knobs that do nothing.
    q = torch.randn(1, 4, 2, 16, dtype=torch.float64)
    k_cache = torch.randn(1, 50, 2, 16, dtype=torch.float64)
    v_cache = torch.randn_like(k_cache)
    plain = kvcache_reference(q, k_cache, v_cache, softmax_scale=1.0)[0]
    assert not torch.allclose(plain, kvcache_reference(q, k_cache, v_cache, softmax_scale=1.0, softcap=2.0)[0])
    assert not torch.allclose(plain, kvcache_reference(q, k_cache, v_cache, softmax_scale=1.0, window_size=(5, -1))[0])
    assert not torch.allclose(plain, kvcache_reference(q, k_cache, v_cache, softmax_scale=1.0, window_size=(-1, 0))[0])
    # Any negative bound is no bound.
    torch.testing.assert_close(plain, kvcache_reference(q, k_cache, v_cache, softmax_scale=1.0, window_size=(-7, -40))[0])


# ---------------------------------------------------------------------------------------------
# The CPU implementation against the reference
# ---------------------------------------------------------------------------------------------

# (lengths, seqlen_q, heads, kv_heads, head_dim, page_size, seqlen_new, causal, window, softcap, layout)
CASES = [
    ([1, 17, 100], 1, 4, 4, 64, None, 0, False, (-1, -1), 0.0, "contiguous"),
    ([1, 17, 100], 1, 4, 4, 64, None, 1, True, (-1, -1), 0.0, "contiguous"),
    ([1, 17, 100], 5, 8, 2, 40, None, 5, True, (-1, -1), 0.0, "contiguous"),
    ([100, 1, 17], 16, 8, 1, 8, None, 0, True, (-1, -1), 0.0, "contiguous"),
    ([17, 100, 1], 3, 16, 2, 64, 16, 1, True, (-1, -1), 0.0, "contiguous"),
    ([1, 17, 100], 5, 8, 8, 40, 16, 5, True, (-1, -1), 0.0, "contiguous"),
    ([1, 17, 100], 7, 8, 1, 24, 32, 5, False, (-1, -1), 0.0, "contiguous"),
    ([0, 33, 64], 2, 4, 1, 64, 32, 0, False, (-1, -1), 0.0, "contiguous"),
    ([1, 17, 100], 4, 8, 2, 40, None, 1, False, (10, -1), 0.0, "contiguous"),
    ([1, 17, 100], 4, 8, 2, 40, 16, 5, False, (-1, 3), 0.0, "contiguous"),
    ([1, 17, 100], 6, 8, 2, 40, 32, 0, False, (7, 2), 0.0, "contiguous"),
    ([1, 17, 100], 6, 4, 4, 64, None, 5, True, (20, -1), 0.0, "contiguous"),
    ([1, 17, 100], 1, 8, 2, 64, 16, 1, True, (0, -1), 0.0, "contiguous"),
    ([1, 17, 100], 5, 8, 4, 40, None, 5, True, (-1, -1), 1.5, "contiguous"),
    ([1, 17, 100], 3, 8, 8, 8, 32, 1, False, (-1, -1), 0.7, "contiguous"),
    ([1, 17, 100], 9, 8, 2, 64, 16, 5, True, (30, -1), 3.0, "contiguous"),
    ([1, 17, 100], 5, 8, 2, 40, None, 5, True, (-1, -1), 0.0, "fused"),
    ([1, 17, 100], 5, 8, 2, 40, None, 1, False, (12, 4), 0.0, "transposed"),
    ([1, 17, 100], 5, 8, 2, 40, 16, 5, True, (-1, -1), 0.0, "fused"),
    ([1, 17, 100], 2, 8, 1, 64, 32, 1, True, (-1, -1), 1.0, "transposed"),
    ([5, 5], 16, 8, 8, 16, None, 0, True, (-1, -1), 0.0, "contiguous"),          # many empty causal rows
    ([2, 0, 7], 16, 4, 2, 16, 16, 0, False, (-1, 0), 0.0, "contiguous"),         # right-only window empties
    ([3, 12, 30], 8, 4, 2, 16, None, 5, False, (-1, -6), 0.0, "contiguous"),     # any negative: no bound
    ([3, 12, 30], 8, 4, 2, 16, 16, 5, True, (-5, 3), 0.0, "contiguous"),         # any negative: no bound
    ([1], 16, 4, 4, 256, 16, 5, True, (-1, -1), 0.0, "contiguous"),              # head_dim 256
]


def _case_id(c):
    lengths, sq, h, hk, d, ps, new, causal, window, softcap, layout = c
    return (f"len{'-'.join(map(str, lengths))}-sq{sq}-h{h}-hk{hk}-d{d}-{'paged' + str(ps) if ps else 'flat'}"
            f"-new{new}{'-causal' if causal else ''}-w{window[0]}_{window[1]}-cap{softcap}-{layout}")


def _run_case(case, dtype, softmax_scale=None, num_splits=0):
    lengths, sq, heads, kv_heads, d, page_size, new, causal, window, softcap, layout = case
    batch = len(lengths)
    cache = KVCache(batch, max(lengths) + new + 3, kv_heads, d, dtype, "cpu", page_size, layout)
    q = torch.randn(batch, sq, heads, d, dtype=dtype)
    k, v = new_tokens(batch, new, kv_heads, d, dtype, "cpu")
    return run_decode(q, cache, seqlens_tensor(lengths), k, v, what=_case_id(case), num_splits=num_splits,
                      softmax_scale=softmax_scale, causal=causal, window_size=window, softcap=softcap)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_decode_cpu_float64_matches_reference(case):
    _run_case(case, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", [CASES[2], CASES[5], CASES[9], CASES[13], CASES[18], CASES[21]], ids=_case_id)
def test_decode_cpu_low_precision_matches_reference(case, dtype):
    _run_case(case, dtype)


@pytest.mark.parametrize("seqlen_q", [1, 2, 3, 8, 13, 16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (8, 1), (16, 2)])
def test_decode_cpu_seqlen_q_and_gqa(seqlen_q, heads, kv_heads):
    case = ([1, 17, 100], seqlen_q, heads, kv_heads, 40, 16, 1, True, (-1, -1), 0.0, "contiguous")
    _run_case(case, torch.float64)


def test_explicit_softmax_scale():
    case = ([1, 17, 100], 3, 8, 2, 40, 32, 5, True, (-1, -1), 0.0, "contiguous")
    _run_case(case, torch.float64, softmax_scale=0.37)
    _run_case(case, torch.float32, softmax_scale=1.3)


def test_default_softmax_scale_is_inverse_sqrt_head_dim():
    q = torch.randn(2, 3, 4, 40, dtype=torch.float64)
    cache = KVCache(2, 50, 2, 40, torch.float64, "cpu")
    lengths = seqlens_tensor([20, 50])
    got = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=lengths)
    want = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=lengths,
                                         softmax_scale=1 / math.sqrt(40))
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    other = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=lengths, softmax_scale=0.5)
    assert not torch.allclose(got, other)


def test_causal_forces_right_window_zero():
    q = torch.randn(2, 6, 4, 16, dtype=torch.float64)
    cache = KVCache(2, 40, 2, 16, torch.float64, "cpu")
    lengths = seqlens_tensor([10, 35])
    args = (q, cache.k_cache, cache.v_cache)
    a = fattn.flash_attn_with_kvcache(*args, cache_seqlens=lengths, causal=True, window_size=(4, 7), return_lse=True)
    b = fattn.flash_attn_with_kvcache(*args, cache_seqlens=lengths, causal=False, window_size=(4, 0), return_lse=True)
    c = fattn.flash_attn_with_kvcache(*args, cache_seqlens=lengths, causal=False, window_size=(4, 7), return_lse=True)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not torch.allclose(a[0], c[0])


def test_rows_with_no_visible_key():
    q = torch.randn(3, 4, 4, 32, dtype=torch.float32)
    cache = KVCache(3, 40, 2, 32, torch.float32, "cpu", page_size=16)
    # Sequence 0: empty cache, no append -> every row empty. Sequence 1: 2 keys for 4 causal
    # queries -> rows 0 and 1 empty. Sequence 2: full rows.
    out, lse = run_decode(q, cache, seqlens_tensor([0, 2, 30]), causal=True, what="empty rows")
    assert torch.all(out[0] == 0) and torch.all(lse[0] == float("-inf"))
    assert torch.all(out[1, :2] == 0) and torch.all(lse[1, :, :2] == float("-inf"))
    assert torch.isfinite(lse[1, :, 2:]).all() and torch.isfinite(lse[2]).all()
    # A right window without causal: 1 key for 4 queries, right 1: row t sees j <= t - 2.
    out, lse = run_decode(q, cache, seqlens_tensor([1, 1, 0]), window_size=(-1, 1), what="window empties")
    assert torch.all(out[:2, :2] == 0) and torch.all(lse[:2, :, :2] == float("-inf"))
    assert torch.isfinite(lse[:2, :, 2:]).all() and torch.all(lse[2] == float("-inf"))


def test_append_writes_exactly_the_new_slots():
    # Page boundaries crossed by the append: positions 14..18 straddle pages of 16.
    for page_size in (None, 16, 32):
        cache = KVCache(3, 60, 2, 16, torch.float64, "cpu", page_size=page_size)
        q = torch.randn(3, 5, 4, 16, dtype=torch.float64)
        k, v = new_tokens(3, 5, 2, 16, torch.float64, "cpu")
        snap = cache.snapshot()
        lengths = seqlens_tensor([14, 0, 27])
        fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k=k, v=v, cache_seqlens=lengths,
                                      block_table=cache.block_table, causal=True)
        cache.check_append(snap, k, v, lengths, what=f"page_size={page_size}")
        for b, n in enumerate(lengths.tolist()):  # the same, spelled out slot by slot
            for i in range(5):
                assert torch.equal(cache.k_cache[cache.slot(b, n + i)], k[b, i])
                assert torch.equal(cache.v_cache[cache.slot(b, n + i)], v[b, i])
        assert lengths.tolist() == [14, 0, 27], "cache_seqlens must not be modified"


def test_decode_loop_against_attention_over_the_whole_sequence():
    # A prompt in the cache, then token-by-token decoding that appends and advances cache_seqlens;
    # checked against attention_reference over the explicit concatenation (no kvcache_reference).
    batch, heads, kv_heads, d, prompt = 2, 8, 2, 40, [5, 11]
    cache = KVCache(batch, 32, kv_heads, d, torch.float64, "cpu", page_size=16)
    keys = [[cache.k_cache[cache.slot(b, j)].clone() for j in range(prompt[b])] for b in range(batch)]
    values = [[cache.v_cache[cache.slot(b, j)].clone() for j in range(prompt[b])] for b in range(batch)]
    lengths = seqlens_tensor(prompt)
    for step in range(6):
        new = 1 if step % 2 == 0 else 3
        q = torch.randn(batch, new, heads, d, dtype=torch.float64)
        k, v = new_tokens(batch, new, kv_heads, d, torch.float64, "cpu")
        out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k=k, v=v, cache_seqlens=lengths,
                                                 block_table=cache.block_table, causal=True, return_lse=True)
        for b in range(batch):
            keys[b] += list(k[b].unbind(0))
            values[b] += list(v[b].unbind(0))
            want_out, want_lse = attention_reference(q[b:b + 1], torch.stack(keys[b])[None],
                                                     torch.stack(values[b])[None], None, True)
            torch.testing.assert_close(out[b:b + 1], want_out, atol=1e-10, rtol=1e-10)
            torch.testing.assert_close(lse[b:b + 1], want_lse, atol=1e-10, rtol=1e-10)
        lengths += new


@pytest.mark.parametrize("paged", [False, True])
def test_cache_seqlens_none_uses_the_whole_capacity(paged):
    q = torch.randn(2, 3, 4, 16, dtype=torch.float64)
    cache = KVCache(2, 48, 2, 16, torch.float64, "cpu", page_size=16 if paged else None)
    out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, block_table=cache.block_table,
                                             causal=True, return_lse=True)
    full = seqlens_tensor([cache.capacity] * 2)
    ref_out, ref_lse, low = references(q, cache.k_cache, cache.v_cache, full, cache.block_table, None, None, causal=True)
    check_outputs(out, lse, q, ref_out, ref_lse, low, what="cache_seqlens=None")


@pytest.mark.parametrize("new", [0, 2])
def test_int_cache_seqlens(new):
    q = torch.randn(3, 2, 4, 16, dtype=torch.float64)
    cache = KVCache(3, 30, 2, 16, torch.float64, "cpu", page_size=16)
    k, v = new_tokens(3, new, 2, 16, torch.float64, "cpu")
    twin = cache.clone()
    out, lse = run_decode(q, cache, 9, k, v, causal=True, what="int cache_seqlens")
    want = fattn.flash_attn_with_kvcache(q, twin.k_cache, twin.v_cache, k=k, v=v, cache_seqlens=seqlens_tensor([9] * 3),
                                         block_table=twin.block_table, causal=True, return_lse=True)
    torch.testing.assert_close((out, lse), want, atol=0, rtol=0)
    for a, b in zip(cache.bases, twin.bases):
        assert torch.equal(a, b)


def test_num_splits_is_ignored_on_cpu():
    q = torch.randn(2, 4, 8, 40, dtype=torch.float32)
    cache = KVCache(2, 120, 2, 40, torch.float32, "cpu", page_size=16)
    lengths = seqlens_tensor([3, 100])
    outs = [fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=lengths,
                                          block_table=cache.block_table, causal=True, num_splits=n, return_lse=True)
            for n in (0, 1, 7, 256)]
    for got in outs[1:]:
        torch.testing.assert_close(got, outs[0], atol=0, rtol=0)


def test_return_lse_false_returns_only_out():
    q = torch.randn(1, 2, 2, 16, dtype=torch.float64)
    cache = KVCache(1, 20, 2, 16, torch.float64, "cpu")
    out = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=seqlens_tensor([10]))
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    ref = kvcache_reference(q, cache.k_cache, cache.v_cache, seqlens_tensor([10]))[0]
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)


def test_op_called_directly_matches_the_api():
    q = torch.randn(2, 3, 8, 24, dtype=torch.float64)
    cache = KVCache(2, 40, 2, 24, torch.float64, "cpu", page_size=16, layout="fused")
    k, v = new_tokens(2, 3, 2, 24, torch.float64, "cpu")
    lengths = seqlens_tensor([4, 30])
    snap = cache.snapshot()
    out, lse = torch.ops.fattn.decode(q, cache.k_cache, cache.v_cache, k, v, lengths, cache.block_table,
                                      0.4, True, 9, -1, 2.5, 0)
    k0, v0 = cache.views(snap)
    ref_out, ref_lse, low = references(q, k0, v0, lengths, cache.block_table, k, v, softmax_scale=0.4,
                                       causal=True, window_size=(9, -1), softcap=2.5)
    check_outputs(out, lse, q, ref_out, ref_lse, low, what="torch.ops.fattn.decode")
    cache.check_append(snap, k, v, lengths, what="torch.ops.fattn.decode")


# ---------------------------------------------------------------------------------------------
# Fake tensors, opcheck, torch.compile
# ---------------------------------------------------------------------------------------------


def _op_args(paged, append, dtype=torch.float32, layout="contiguous", scale=None, causal=True, window=(-1, -1),
             softcap=0.0):
    q = torch.randn(2, 3, 4, 16, dtype=dtype)
    cache = KVCache(2, 40, 2, 16, dtype, "cpu", page_size=16 if paged else None, layout=layout)
    k, v = new_tokens(2, 3 if append else 0, 2, 16, dtype, "cpu")
    lengths = seqlens_tensor([5, 33])
    return (q, cache.k_cache, cache.v_cache, k, v, lengths, cache.block_table, scale, causal, window[0],
            window[1], softcap, 0), cache


@pytest.mark.parametrize("layout", ["contiguous", "fused"])
@pytest.mark.parametrize("paged", [False, True])
def test_fake_matches_real_shapes_and_strides(paged, layout):
    args, _ = _op_args(paged, append=True, dtype=torch.bfloat16, layout=layout)
    real_out, real_lse = torch.ops.fattn.decode(*args)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake_out, fake_lse = torch.ops.fattn.decode(*fake_args)
    for fake, real in ((fake_out, real_out), (fake_lse, real_lse)):
        assert fake.shape == real.shape
        assert fake.stride() == real.stride()
        assert fake.dtype == real.dtype


@pytest.mark.parametrize("append", [False, True])
@pytest.mark.parametrize("paged", [False, True])
def test_opcheck_decode(paged, append):
    args, _ = _op_args(paged, append)
    torch.library.opcheck(torch.ops.fattn.decode.default, args)


def test_opcheck_decode_with_window_softcap_scale_and_float64():
    args, _ = _op_args(True, True, dtype=torch.float64, layout="fused", scale=0.3, causal=False,
                       window=(6, 2), softcap=1.5)
    torch.library.opcheck(torch.ops.fattn.decode.default, args)


@pytest.mark.parametrize("paged", [False, True])
def test_compile_fullgraph_with_append(paged):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")

    @torch.compile(fullgraph=True, backend=counter)
    def step(q, k_cache, v_cache, k, v, cache_seqlens, block_table):
        out, lse = fattn.flash_attn_with_kvcache(q * 0.5, k_cache, v_cache, k=k, v=v, cache_seqlens=cache_seqlens,
                                                 block_table=block_table, causal=True, window_size=(20, -1),
                                                 return_lse=True)
        return out * 2 + 1, lse.exp()

    cache = KVCache(2, 48, 2, 16, torch.float32, "cpu", page_size=16 if paged else None)
    lengths = seqlens_tensor([3, 30])
    for _ in range(3):  # same shapes, new cache_seqlens values: one graph
        q = torch.randn(2, 2, 4, 16)
        k, v = new_tokens(2, 2, 2, 16, torch.float32, "cpu")
        snap = cache.snapshot()
        eager = cache.clone()
        got_out, got_p = step(q, cache.k_cache, cache.v_cache, k, v, lengths, cache.block_table)
        want_out, want_lse = fattn.flash_attn_with_kvcache(q * 0.5, eager.k_cache, eager.v_cache, k=k, v=v,
                                                           cache_seqlens=lengths, block_table=eager.block_table,
                                                           causal=True, window_size=(20, -1), return_lse=True)
        torch.testing.assert_close(got_out, want_out * 2 + 1, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got_p, want_lse.exp(), atol=1e-5, rtol=1e-5)
        cache.check_append(snap, k, v, lengths, what="compiled call")  # the compiled call mutated the cache
        for a, b in zip(cache.bases, eager.bases):
            assert torch.equal(a, b)
        ref_out, _ = kvcache_reference(q * 0.5, *cache.views(snap), lengths, cache.block_table, causal=True,
                                       window_size=(20, -1), k=k, v=v)
        torch.testing.assert_close(got_out, ref_out * 2 + 1, atol=1e-5, rtol=1e-5)
        lengths = lengths + 2
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"


# ---------------------------------------------------------------------------------------------
# Bad input: one test per rule of the contract, through the API and the op
# ---------------------------------------------------------------------------------------------


def _valid(paged=False):
    """A valid call's arguments (float32 on CPU): q [2, 3, 4, 32], cache capacity 48, 2 new tokens."""
    q = torch.randn(2, 3, 4, 32)
    if paged:
        k_cache, v_cache = torch.randn(7, 16, 2, 32), torch.randn(7, 16, 2, 32)
        block_table = torch.tensor([[3, 0, 5], [1, 6, 2]], dtype=torch.int32)
    else:
        k_cache, v_cache = torch.randn(2, 48, 2, 32), torch.randn(2, 48, 2, 32)
        block_table = None
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, k=torch.randn(2, 2, 2, 32), v=torch.randn(2, 2, 2, 32),
                cache_seqlens=seqlens_tensor([5, 40]), block_table=block_table, softmax_scale=None, causal=True,
                window_size=(-1, -1), softcap=0.0, num_splits=0)


def _call(via, a):
    if via == "api":
        return fattn.flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"], k=a["k"], v=a["v"],
                                             cache_seqlens=a["cache_seqlens"], block_table=a["block_table"],
                                             softmax_scale=a["softmax_scale"], causal=a["causal"],
                                             window_size=a["window_size"], softcap=a["softcap"],
                                             num_splits=a["num_splits"], return_lse=True)
    return torch.ops.fattn.decode(a["q"], a["k_cache"], a["v_cache"], a["k"], a["v"], a["cache_seqlens"],
                                  a["block_table"], a["softmax_scale"], a["causal"], a["window_size"][0],
                                  a["window_size"][1], a["softcap"], a["num_splits"])


def _expect(via, match, paged=False, **changes):
    a = _valid(paged)
    for name, change in changes.items():
        a[name] = change(a) if callable(change) else change
    caches = [a["k_cache"].clone(), a["v_cache"].clone()]
    with pytest.raises(RuntimeError, match=r"(?s)fattn\.decode: .*" + match):
        _call(via, a)
    # Errors come before any write.
    assert torch.equal(a["k_cache"], caches[0]) and torch.equal(a["v_cache"], caches[1]), "cache modified"


VIA = pytest.mark.parametrize("via", ["api", "op"])


@VIA
def test_valid_baseline_calls_succeed(via):
    # The bad-input tests below each change one thing of these calls.
    for paged in (False, True):
        out, lse = _call(via, _valid(paged))
        assert out.shape == (2, 3, 4, 32) and lse.shape == (2, 4, 3)


@VIA
def test_bad_rank(via):
    _expect(via, r"\bq\b", q=lambda a: a["q"][:, 0])
    _expect(via, r"\bq\b", q=lambda a: a["q"][None])
    _expect(via, r"\bk_cache\b", k_cache=lambda a: a["k_cache"][0])
    _expect(via, r"\bv_cache\b", v_cache=lambda a: a["v_cache"][0])
    _expect(via, r"\bk\b", k=lambda a: a["k"][:, 0])
    _expect(via, r"\bv\b", v=lambda a: a["v"][:, 0])


@VIA
def test_bad_dtype(via):
    _expect(via, r"\bq\b", q=lambda a: a["q"].int(), k_cache=lambda a: a["k_cache"].int(),
            v_cache=lambda a: a["v_cache"].int(), k=lambda a: a["k"].int(), v=lambda a: a["v"].int())
    _expect(via, r"\bk_cache\b", k_cache=lambda a: a["k_cache"].double())
    _expect(via, r"\bv_cache\b", v_cache=lambda a: a["v_cache"].bfloat16())
    _expect(via, r"\bk\b", k=lambda a: a["k"].double())
    _expect(via, r"\bv\b", v=lambda a: a["v"].half())


@VIA
def test_seqlen_q_over_16(via):
    _expect(via, r"seqlen", q=lambda a: torch.randn(2, 17, 4, 32))


@VIA
def test_k_without_v_and_v_without_k(via):
    _expect(via, r"(\bk\b.*\bv\b|\bv\b.*\bk\b)", v=None)
    _expect(via, r"(\bk\b.*\bv\b|\bv\b.*\bk\b)", k=None)


@VIA
def test_new_token_shapes_that_do_not_match(via):
    _expect(via, r"\bk\b", k=torch.randn(2, 2, 1, 32), v=torch.randn(2, 2, 1, 32))  # kv_heads 1 vs the cache's 2
    _expect(via, r"\bk\b", k=torch.randn(3, 2, 2, 32), v=torch.randn(3, 2, 2, 32))  # batch 3 vs q's 2
    _expect(via, r"\bk\b", k=torch.randn(2, 2, 2, 40), v=torch.randn(2, 2, 2, 40))  # head_dim 40 vs 32
    _expect(via, r"\bv\b", v=torch.randn(2, 3, 2, 32))  # v's seqlen differs from k's


@VIA
def test_cache_shapes_that_do_not_match(via):
    _expect(via, r"\bv_cache\b", v_cache=torch.randn(2, 40, 2, 32))
    _expect(via, r"\bk_cache\b", k_cache=torch.randn(2, 48, 2, 40), v_cache=torch.randn(2, 48, 2, 40))
    _expect(via, r"\bk_cache\b", k_cache=torch.randn(3, 48, 2, 32), v_cache=torch.randn(3, 48, 2, 32))
    _expect(via, r"\bk_cache\b", k_cache=torch.randn(2, 48, 32, 2).transpose(2, 3))  # last dim not contiguous


@VIA
def test_heads_not_a_multiple_of_kv_heads(via):
    _expect(via, r"heads", q=torch.randn(2, 3, 5, 32))


@VIA
@pytest.mark.parametrize("d", [12, 100, 264])
def test_unsupported_head_dim(via, d):
    _expect(via, r"head_dim", q=torch.randn(2, 3, 4, d), k_cache=torch.randn(2, 48, 2, d),
            v_cache=torch.randn(2, 48, 2, d), k=torch.randn(2, 2, 2, d), v=torch.randn(2, 2, 2, d))


@VIA
def test_cache_seqlens_not_int32_batch(via):
    _expect(via, r"cache_seqlens", cache_seqlens=torch.tensor([5, 40], dtype=torch.int64))
    _expect(via, r"cache_seqlens", cache_seqlens=torch.tensor([5.0, 40.0]))
    _expect(via, r"cache_seqlens", cache_seqlens=seqlens_tensor([5, 40, 7]))
    _expect(via, r"cache_seqlens", cache_seqlens=seqlens_tensor([[5, 40]]))


@VIA
def test_block_table_not_int32_2d_batch(via):
    _expect(via, r"block_table", paged=True, block_table=lambda a: a["block_table"].long())
    _expect(via, r"block_table", paged=True, block_table=lambda a: a["block_table"].flatten())
    _expect(via, r"block_table", paged=True, block_table=lambda a: a["block_table"][:1])
    _expect(via, r"block_table", paged=True, block_table=lambda a: a["block_table"][None])


@VIA
@pytest.mark.parametrize("page_size", [8, 24])
def test_page_size_not_a_multiple_of_16(via, page_size):
    pages = -(-48 // page_size)
    _expect(via, r"page_size", paged=True, k_cache=torch.randn(2 * pages, page_size, 2, 32),
            v_cache=torch.randn(2 * pages, page_size, 2, 32),
            block_table=torch.arange(2 * pages, dtype=torch.int32).view(2, pages))


@VIA
def test_new_tokens_without_cache_seqlens(via):
    _expect(via, r"cache_seqlens", cache_seqlens=None)


@VIA
@pytest.mark.parametrize("num_splits", [-1, 257])
def test_num_splits_out_of_range(via, num_splits):
    _expect(via, r"num_splits", num_splits=num_splits)


@VIA
def test_negative_softcap(via):
    _expect(via, r"softcap", softcap=-1.0)


@VIA
@pytest.mark.parametrize("paged", [False, True])
def test_cache_too_small_for_the_append(via, paged):
    # Capacity 48: sequence 0 fits, sequence 1 (47 + 2) does not; nothing may be written.
    _expect(via, r"(cache too small|capacity)", paged=paged, cache_seqlens=seqlens_tensor([5, 47]))
    # Without an append, cache_seqlens past the capacity is the same rule.
    _expect(via, r"(cache too small|capacity|cache_seqlens)", paged=paged, k=None, v=None,
            cache_seqlens=seqlens_tensor([5, 49]))


@VIA
def test_negative_cache_seqlens(via):
    _expect(via, r"cache_seqlens", cache_seqlens=seqlens_tensor([5, -1]))
    _expect(via, r"cache_seqlens", k=None, v=None, cache_seqlens=seqlens_tensor([-3, 5]))


@VIA
@pytest.mark.parametrize("entry", [-1, 7])
def test_block_table_entry_out_of_range(via, entry):
    def patch(a):
        table = a["block_table"].clone()
        table[1, 2] = entry  # 7 pages: valid entries are 0..6
        return table
    _expect(via, r"block_table", paged=True, block_table=patch)
