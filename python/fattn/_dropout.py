"""Dropout's seed: drawn from torch's generator on q's device for each call that drops.

The kernels read it on the device (csrc/attention/dropout.h has the keep-mask's definition), so
torch.manual_seed reproduces a run, and a CUDA graph replays with the seed torch's generator
writes at each replay instead of the one seen at capture."""

from __future__ import annotations

import numbers

import torch

from ._checks import fail

_LOW, _HIGH = -(2**63), 2**63 - 1


def check_probability(fn: str, dropout_p) -> float:
    # numbers.Real: numpy floats too, as flash-attn takes them
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0.0 <= dropout_p < 1.0:
        fail(f"fattn.{fn}", "dropout_p is ", dropout_p, "; expected a number with 0 <= dropout_p < 1")
    return float(dropout_p)


def draw_seed(dropout_p: float, device):
    """A fresh int64 seed tensor [1] on `device`, or None without dropout."""
    if dropout_p == 0.0:
        return None
    return torch.randint(_LOW, _HIGH, (1,), dtype=torch.int64, device=device)
