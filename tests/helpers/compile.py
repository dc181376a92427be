"""torch.compile in tests: telling a recompile from a first compile."""

from __future__ import annotations

import contextlib

import torch


def recompiles_forbidden(call_index: int):
    """The context for call `call_index` (0-based) of a function under torch.compile.

    The first call compiles; Dynamo may restart its analysis once while doing so (for
    instance when a cold FX graph cache runs the scalar-tensorify pass), which calls the
    backend twice, so counting backend calls cannot tell a first compile from a recompile.
    From the second call on, a recompile raises torch._dynamo's RecompileError naming the
    guard that failed.
    """
    if call_index == 0:
        return contextlib.nullcontext()
    return torch._dynamo.config.patch(error_on_recompile=True)
