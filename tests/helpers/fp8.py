"""FP8 attention inputs and the accuracy rule of the FP8 forward.

The rule, the project's 2x rule with the FP8-emulated computation as the same-precision one:
max |fattn - ref64| <= 2 * max |emulated - ref64| + 1e-5, where ref64 is float64 attention of the
dequantized inputs and `emulated` the same with the probabilities rounded to e4m3 as the kernel
rounds them (attention_reference's fp8_probabilities) and out rounded to bfloat16.
"""

from __future__ import annotations

import torch

import fattn
from fattn.reference import attention_reference

FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2]


def fp8_qkv(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, fp8_dtype, device, granularity="head",
            q_descale_heads="kv", layout="contiguous", seed=0):
    """(q, k, v, q_descale, k_descale, v_descale): FP8 tensors quantized from random ones whose
    heads span magnitudes 0.5 to 4 (so descales differ per head), with q_descale per KV head
    ("kv": one scale shared by each group of query heads) or per query head ("q").
    layout "strided": views of larger FP8 tensors (row strides that are not the tensors' own)."""
    g = torch.Generator().manual_seed(seed)

    def draw(seq, h):
        magnitude = torch.linspace(0.5, 4.0, h, dtype=torch.float32)[None, None, :, None]
        return torch.randn(batch, seq, h, head_dim, generator=g) * magnitude

    q32, k32, v32 = draw(seqlen_q, heads), draw(seqlen_k, kv_heads), draw(seqlen_k, kv_heads)
    if q_descale_heads == "kv":
        # One scale per KV head's group of query heads: quantize q grouped as [.., kv_heads, group * d].
        grouped = q32.reshape(batch, seqlen_q, kv_heads, -1)
        q8, qd = fattn.quantize_fp8(grouped, fp8_dtype, granularity)
        q8 = q8.reshape(q32.shape)
    else:
        q8, qd = fattn.quantize_fp8(q32, fp8_dtype, granularity)
    k8, kd = fattn.quantize_fp8(k32, fp8_dtype, granularity)
    v8, vd = fattn.quantize_fp8(v32, fp8_dtype, granularity)
    tensors = [q8, k8, v8]
    if layout == "strided":
        for i, t in enumerate(tensors):
            wide = torch.zeros(*t.shape[:-1], t.shape[-1] + 16, dtype=fp8_dtype)
            wide[..., 16:] = t
            tensors[i] = wide[..., 16:]
    return tuple(t.to(device) for t in tensors) + tuple(d.to(device) for d in (qd, kd, vd))


def dequantize(x8, descale):
    """x8 in float64 times its descale [batch, columns] (columns = x8's heads, or a divisor of them:
    each column covers heads // columns consecutive heads)."""
    h = x8.shape[-2]
    per_column = h // descale.shape[1]
    scale = descale.double().repeat_interleave(per_column, dim=1)
    if x8.dim() == 4:
        return x8.double() * scale[:, None, :, None]
    return x8.double() * scale[None, :, :, None]


def fp8_references(q8, k8, v8, qd, kd, vd, softmax_scale=None, causal=False, **variant):
    """(ref64_out, ref64_lse, emulated_out) on the inputs' device."""
    q, k, v = dequantize(q8, qd), dequantize(k8, kd), dequantize(v8, vd)
    ref, ref_lse = attention_reference(q, k, v, softmax_scale, causal, **variant)
    emulated, _ = attention_reference(q, k, v, softmax_scale, causal, fp8_probabilities=True, **variant)
    return ref, ref_lse, emulated.to(torch.bfloat16)


def check_fp8_accuracy(out, lse, refs, what=""):
    """The rule above; lse within 5e-3 plus 2**-9 of the largest |lse| of float64's (FP8 tensor
    cores sum the products of a dot at reduced precision, about 14 bits on Hopper, so a score
    of magnitude s carries an error that grows with s); no NaN. Returns the relative error's
    (median, 99th percentile, max) over max |ref64|."""
    ref, ref_lse, emulated = refs
    assert out.dtype == torch.bfloat16, f"{what}: out dtype {out.dtype}"
    assert not torch.isnan(out).any(), f"{what}: NaN in out"
    err = (out.double() - ref).abs()
    base = (emulated.double() - ref).abs().max().item()
    assert err.max().item() <= 2 * base + 1e-5, f"{what}: out error {err.max().item():.3e} > 2 x emulated {base:.3e}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), f"{what}: lse -inf pattern differs"
    if finite.any():
        lse_err = (lse[finite].double() - ref_lse[finite].double()).abs().max().item()
        bound = 5e-3 + 2**-9 * ref_lse[finite].abs().max().item()
        assert lse_err <= bound, f"{what}: lse error {lse_err:.3e} > {bound:.3e}"
    scale = max(ref.abs().max().item(), 1e-30)
    relative = (err / scale).flatten().float()
    if relative.numel() == 0:
        return 0.0, 0.0, 0.0
    quantiles = torch.quantile(relative[torch.randperm(relative.numel())[:1 << 20]],
                               torch.tensor([0.5, 0.99], device=relative.device))
    return quantiles[0].item(), quantiles[1].item(), relative.max().item()
