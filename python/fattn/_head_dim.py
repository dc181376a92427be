"""Head dims that are not a multiple of 8, for the public functions.

The kernels load 16-byte rows (8 fp16/bf16 elements) and the ops take head dims that are
multiples of 8 up to 256. flash-attn's wrappers pad other head dims; fattn does the same:
q, k and v get zero columns up to the next multiple of 8 (zeros change no dot product), the
default scale stays 1/sqrt(the real head dim), and out is returned as a view of its first
head_dim columns. The cost is one copy of q, k and v per call (and of their gradients in the
backward); out is not copied.
"""

from __future__ import annotations

import math

import torch.nn.functional as F

from ._checks import MAX_HEAD_DIM


def padding_for(q, k, v) -> int:
    """The columns to add to q, k and v: 0 unless they share a head dim that needs padding
    (a mismatch or an unsupported dim is left for the op to report)."""
    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim or v.shape[-1] != head_dim or not 0 < head_dim < MAX_HEAD_DIM:
        return 0
    return -head_dim % 8


def pad(tensors, columns: int):
    return tuple(F.pad(t, (0, columns)) for t in tensors)


def scale_for(softmax_scale, head_dim: int):
    """The softmax scale of the unpadded problem (the op would take the padded dim's)."""
    return 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
