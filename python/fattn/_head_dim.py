"""Head dims that are not a multiple of 8, for every public function.

The kernels load 16-byte rows (8 fp16/bf16 elements) and the ops take head dims that are
multiples of 8 up to 256. flash-attn's wrappers pad other head dims; fattn does the same, by one
rule for every entry point: the inputs that carry the head dim get zero columns up to the next
multiple of 8 (zeros change no dot product and add zero output columns), the default scale stays
1/sqrt(the real head dim), and out is returned as a view of its first head_dim columns.

The cost is one copy of each padded input per call (and of their gradients in the backward);
out is not copied. A KV cache that the call appends to is padded, appended to, and copied back
whole, as flash-attn does: two copies of the cache per call.
"""

from __future__ import annotations

import math

import torch.nn.functional as F

from ._checks import MAX_HEAD_DIM


class Padding:
    """The padding of one call: built from every tensor whose last dim is the head dim (None
    skipped). No padding unless they share one head dim that needs it: a mismatch or an
    unsupported dim is left for the op to report on the caller's own tensors."""

    def __init__(self, *tensors):
        dims = {t.shape[-1] for t in tensors if t is not None}
        self.head_dim = next(iter(dims)) if len(dims) == 1 else 0
        self.columns = -self.head_dim % 8 if 0 < self.head_dim < MAX_HEAD_DIM else 0

    def __bool__(self) -> bool:
        return self.columns != 0

    def inputs(self, *tensors):
        """The tensors with zero columns added (None stays None); differentiable."""
        if not self.columns:
            return tensors
        return tuple(None if t is None else F.pad(t, (0, self.columns)) for t in tensors)

    def scale(self, softmax_scale):
        """The softmax scale of the unpadded problem (the op would take the padded dim's)."""
        if not self.columns or softmax_scale is not None:
            return softmax_scale
        return 1.0 / math.sqrt(self.head_dim)

    def output(self, out):
        """out without the padding columns (a view)."""
        return out[..., :self.head_dim] if self.columns else out
