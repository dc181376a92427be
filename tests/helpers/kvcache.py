"""KV caches for the decode tests: random caches in every layout (contiguous or paged;
contiguous, fused or transposed storage), the expected in-place append, and the accuracy
rule of decode's outputs against the float64 kvcache_reference."""

from __future__ import annotations

import torch

import fattn
from fattn.reference import kvcache_reference, rotary_reference

from .common import expected_lse_dtype

CACHE_LAYOUTS = ("contiguous", "fused", "transposed")
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def cache_randn(*shape, dtype, device):
    """Random cache contents; an FP8 cache's over a few binades more than randn's (magnitudes from
    e4m3's subnormals to a few tens), torch rounding them."""
    if dtype in FP8_DTYPES:
        values = torch.randn(*shape, device=device) * torch.exp2(torch.randint(-3, 3, shape, device=device).float())
        limit = torch.finfo(dtype).max
        return values.clamp(-limit, limit).to(dtype)
    return torch.randn(*shape, dtype=dtype, device=device)


class KVCache:
    """A random KV cache, contiguous [batch, capacity, kv_heads, d] or paged
    [num_pages, page_size, kv_heads, d] with a shuffled block_table, stored in one of
    CACHE_LAYOUTS:
      contiguous: k_cache and v_cache are their own contiguous tensors;
      fused: both are views of one [.., .., 2 * kv_heads, d + pad] buffer (padded rows, head and
             token strides that are not the views' own sizes; pad is 16 bytes, 8 elements of a 16-bit
             cache and 16 of an FP8 one, so that v_cache starts 16-byte aligned, as the kernels
             writing a cache in place need);
      transposed: each is the transpose of a [.., .., kv_heads, d] buffer stored token-major
             (dim 0 stride smaller than dim 1's).
    `bases` are the tensors that own the memory: the append must change nothing else in them.
    With `spare_rows`, a contiguous cache has that many rows more than sequences and
    `cache_batch_idx` (int32 [batch], distinct rows in shuffled order) says which row each uses.
    """

    def __init__(self, batch, capacity, kv_heads, head_dim, dtype, device, page_size=None,
                 layout="contiguous", spare_pages=3, spare_rows=None):
        self.batch, self.kv_heads, self.head_dim = batch, kv_heads, head_dim
        self.page_size, self.layout = page_size, layout
        self.cache_batch_idx = None
        if page_size is None:
            lead = (batch, capacity)
            if spare_rows is not None:
                lead = (batch + spare_rows, capacity)
                self.cache_batch_idx = torch.randperm(lead[0], device=device)[:batch].to(torch.int32)
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
            self.bases = [cache_randn(*lead, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(2)]
        elif layout == "fused":
            self.pad = 16 // torch.empty(0, dtype=dtype).element_size()
            self.bases = [cache_randn(*lead, 2 * kv_heads, head_dim + self.pad, dtype=dtype, device=device)]
        elif layout == "transposed":
            self.bases = [cache_randn(lead[1], lead[0], kv_heads, head_dim, dtype=dtype, device=device)
                          for _ in range(2)]
        else:
            raise ValueError(layout)
        self.k_cache, self.v_cache = self.views(self.bases)
        if layout == "fused" or (layout == "transposed" and min(lead) > 1):  # (one row or token: no transpose)
            assert not self.k_cache.is_contiguous() and not self.v_cache.is_contiguous()

    def views(self, bases):
        """(k_cache, v_cache) as views of `bases` (this cache's own, or a snapshot of them)."""
        if self.layout == "contiguous":
            return bases[0], bases[1]
        if self.layout == "fused":
            kv, d = self.kv_heads, self.head_dim
            return bases[0][:, :, :kv, :d], bases[0][:, :, kv:, self.pad:]
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
            return (b if self.cache_batch_idx is None else int(self.cache_batch_idx[b])), pos
        return int(self.block_table[b, pos // self.page_size]), pos % self.page_size

    def fill_padding(self, leftpad, value=float("nan")):
        """Write `value` into every key slot before each sequence's cache_leftpad: the op must ignore
        them whatever they hold."""
        for b, pad in enumerate(leftpad):
            for pos in range(pad):
                where = self.slot(b, pos)
                self.k_cache[where] = value
                self.v_cache[where] = value

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

    def check_append(self, snapshot, k, v, cache_seqlens, what="", atol=0.0):
        """The cache holds the snapshot with k/v written at cache_seqlens[b] + i, nothing else changed
        (within atol: a rotated key computed in fp32 may round differently from the reference's)."""
        expected = self.expected_after_append(snapshot, k, v, cache_seqlens)
        for got, want in zip(self.bases, expected):
            if got.dtype in FP8_DTYPES:  # bit patterns (FP8 has no arithmetic to compare with)
                got, want = got.view(torch.uint8), want.view(torch.uint8)
                same = torch.equal(got, want) if atol == 0 else torch.allclose(got, want, rtol=0, atol=atol)
            elif atol == 0:  # bit patterns too: a NaN in ignored padding (fill_padding) equals itself
                bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
                same = torch.equal(got.view(bits), want.view(bits))
            else:
                same = torch.allclose(got, want, rtol=0, atol=atol, equal_nan=True)
            if not same:
                changed = (got != want).flatten(-2).any(-1).nonzero()[:8].tolist()
                raise AssertionError(f"{what}: cache contents differ from the expected append at "
                                     f"(index0, index1, head) {changed} (first 8)")


def new_tokens(batch, seqlen_new, kv_heads, head_dim, dtype, device):
    if seqlen_new == 0:
        return None, None
    return (torch.randn(batch, seqlen_new, kv_heads, head_dim, dtype=dtype, device=device),
            torch.randn(batch, seqlen_new, kv_heads, head_dim, dtype=dtype, device=device))


def references(q, k_cache, v_cache, cache_seqlens, block_table, k, v, **kw):
    """(float64 out, lse) and the same computation in q's own dtype (the rounding baseline). The
    float64 reference's rotated queries are rounded to q's dtype, as the op's are: its operands."""
    ref_out, ref_lse = kvcache_reference(q.double(), k_cache, v_cache, cache_seqlens, block_table, k=k, v=v,
                                         rotated_q_dtype=q.dtype, **kw)
    low_out, _ = kvcache_reference(q, k_cache, v_cache, cache_seqlens, block_table, k=k, v=v, dtype=q.dtype, **kw)
    return ref_out, ref_lse, low_out


def check_outputs(out, lse, q, ref_out, ref_lse, low_out, what=""):
    """Shapes and dtypes of the contract, then accuracy: float64 tight; other dtypes by
    flash-attn's rule max|out - ref64| <= 2 * max|ref_in_q_dtype - ref64| + 1e-5 and the
    -inf pattern and values of lse."""
    batch, seqlen_q, heads, _ = q.shape
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous(), f"{what}: out layout"
    assert lse.shape == (batch, heads, seqlen_q) and lse.dtype == expected_lse_dtype(q.dtype), (
        f"{what}: lse {lse.shape} {lse.dtype}")
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


def rotated_keys(k, cache_seqlens, rotary_cos, rotary_sin, rotary_interleaved=True):
    """The new keys as the append stores them: rotated at cache_seqlens[b] + i, in k's dtype."""
    positions = cache_seqlens.to(k.device)[:, None] + torch.arange(k.shape[1], device=k.device)
    return rotary_reference(k, rotary_cos, rotary_sin, positions, rotary_interleaved).to(k.dtype)


def run_decode(q, cache, cache_seqlens, k=None, v=None, what="", num_splits=0, **kw):
    """Run the op (through the public API), then check out/lse against the reference computed on
    a snapshot taken before the call, and the cache against the expected append. The cache's
    cache_batch_idx is passed along; kw may hold rotary_cos/rotary_sin/rotary_interleaved and
    cache_leftpad (given to the op and the reference alike)."""
    snap = cache.snapshot()
    kw = dict(kw, cache_batch_idx=cache.cache_batch_idx)
    out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k=k, v=v,
                                             cache_seqlens=cache_seqlens, block_table=cache.block_table,
                                             num_splits=num_splits, return_lse=True, **kw)
    k0, v0 = cache.views(snap)
    ref_out, ref_lse, low_out = references(q, k0, v0, cache_seqlens, cache.block_table, k, v, **kw)
    check_outputs(out, lse, q, ref_out, ref_lse, low_out, what=what)
    stored, atol = k, 0.0
    if k is not None and kw.get("rotary_cos") is not None:
        stored = rotated_keys(k, cache_seqlens, kw["rotary_cos"], kw["rotary_sin"], kw.get("rotary_interleaved", True))
        # The kernels rotate in fp32: one rounding step of the stored dtype apart at most.
        atol = 0.0 if q.device.type == "cpu" else 2 * torch.finfo(k.dtype).eps * stored.abs().max().item()
    cache.check_append(snap, stored, v, cache_seqlens, what=what, atol=atol)
    return out, lse


def seqlens_tensor(lengths, device="cpu"):
    return torch.tensor(lengths, dtype=torch.int32, device=device)


# Cases of flash-attn's cache options (rotary, cache_batch_idx, cache_leftpad) and of query
# chunks longer than the decoding tile: (name, cache_seqlens, seqlen_q, heads, kv_heads,
# head_dim, page_size, new tokens, causal, window, options). options: rotary = (layout,
# rotary_dim), spare_rows (cache_batch_idx over a cache with more rows), leftpad (list), alibi.
CACHE_OPTION_CASES = [
    ("rotary-interleaved-full", [0, 17, 90], 1, 8, 2, 64, None, 1, True, (-1, -1), dict(rotary=("gptj", 64))),
    ("rotary-neox-half-paged", [3, 17, 90], 4, 8, 2, 64, 16, 4, True, (-1, -1), dict(rotary=("neox", 32))),
    ("rotary-noncausal-one-position", [3, 17, 90], 3, 4, 4, 40, None, 2, False, (-1, -1), dict(rotary=("neox", 16))),
    ("rotary-window-per-token", [3, 17, 90], 5, 8, 4, 80, 16, 5, False, (12, 0), dict(rotary=("gptj", 48))),
    ("batch-idx-append", [5, 40, 70], 2, 8, 2, 64, None, 2, True, (-1, -1), dict(spare_rows=3)),
    ("batch-idx-rotary-leftpad", [5, 40, 70], 3, 8, 2, 32, None, 3, True, (-1, -1),
     dict(spare_rows=2, rotary=("neox", 32), leftpad=[0, 7, 69])),
    ("leftpad-window-alibi", [9, 40, 70], 4, 4, 1, 64, None, 1, False, (16, 3), dict(leftpad=[9, 1, 30], alibi=True)),
    ("leftpad-paged-all-hidden", [9, 40, 70], 2, 4, 2, 64, 16, 0, True, (-1, -1), dict(leftpad=[9, 40, 0])),
    ("prefill-17-queries", [0, 17, 90], 17, 8, 2, 64, 16, 17, True, (-1, -1), {}),
    ("prefill-130-queries-gqa4-rotary", [0, 40, 200], 130, 8, 2, 64, None, 130, True, (-1, -1),
     dict(rotary=("gptj", 64))),
    ("prefill-100-queries-window-leftpad-paged", [0, 40, 200], 100, 4, 4, 96, 16, 60, True, (50, 0),
     dict(leftpad=[0, 10, 100])),
    ("prefill-40-queries-noncausal-mqa", [10, 40, 120], 40, 8, 1, 32, None, 0, False, (-1, -1), {}),
]


def cache_option_case_id(case):
    return case[0]


def cache_option_kwargs(options, capacity, batch, heads, dtype, device) -> dict:
    """flash_attn_with_kvcache's keywords for a case's rotary ((layout, rotary_dim): tables over
    capacity + 5 positions in `dtype`), leftpad and ALiBi options."""
    kw = {}
    if "rotary" in options:
        layout, rotary_dim = options["rotary"]
        angles = 2 * torch.pi * torch.rand(capacity + 5, rotary_dim // 2, dtype=torch.float64, device=device)
        kw.update(rotary_cos=angles.cos().to(dtype), rotary_sin=angles.sin().to(dtype),
                  rotary_interleaved=layout == "gptj")
    if "leftpad" in options:
        kw["cache_leftpad"] = torch.tensor(options["leftpad"], dtype=torch.int32, device=device)
    if options.get("alibi"):
        kw["alibi_slopes"] = 0.3 * torch.rand(batch, heads, device=device)
    return kw


def run_cache_option_case(case, dtype, device, num_splits=0):
    """One CACHE_OPTION_CASES case through run_decode (the op against the float64 reference,
    the append checked against the rotated keys)."""
    name, lengths, seqlen_q, heads, kv_heads, head_dim, page_size, new, causal, window, options = case
    batch = len(lengths)
    capacity = max(lengths) + max(new, seqlen_q) + 3
    cache = KVCache(batch, capacity, kv_heads, head_dim, dtype, device, page_size=page_size,
                    spare_rows=options.get("spare_rows"))
    q = torch.randn(batch, seqlen_q, heads, head_dim, dtype=dtype, device=device)
    k, v = new_tokens(batch, new, kv_heads, head_dim, dtype, device)
    kw = dict(causal=causal, window_size=window)
    kw.update(cache_option_kwargs(options, cache.capacity, batch, heads, dtype, device))
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    return run_decode(q, cache, cache_seqlens, k, v, what=name, num_splits=num_splits, **kw)
