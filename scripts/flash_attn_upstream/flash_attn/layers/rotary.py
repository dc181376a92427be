"""apply_rotary_emb as flash-attn's test file uses it to build its references (flash_attn.layers.rotary),
from fattn.reference.rotary_reference: computed in float32, rounded to x's dtype as flash-attn's
kernel rounds."""

import torch

from fattn.reference import rotary_reference


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """x [batch, seqlen, heads, head_dim] with its first 2 * cos.shape[1] features rotated; token s
    of sequence b at position s + seqlen_offsets (an int or [batch])."""
    if cu_seqlens is not None:
        raise NotImplementedError("the packed layout of apply_rotary_emb is not used by the test file")
    batch, seqlen = x.shape[:2]
    offsets = torch.as_tensor(seqlen_offsets, device=x.device).reshape(-1, 1)
    positions = (torch.arange(seqlen, device=x.device)[None, :] + offsets).expand(batch, seqlen)
    out = rotary_reference(x, cos, sin, positions, interleaved, dtype=torch.float32).to(x.dtype)
    if inplace:
        x.copy_(out)
        return x
    return out
