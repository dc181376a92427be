"""What the fuzz suite (tests/test_fuzz_cpu.py) shares: hypothesis settings that CI can afford and
a count of the examples each property ran, printed at the end of the session (conftest.py)."""

from __future__ import annotations

import os
from collections import Counter

# Examples per property; FATTN_FUZZ_EXAMPLES raises it for a longer hunt. CI derandomizes
# (the same examples every run: a red CI is reproducible); FATTN_FUZZ_RANDOM=1 draws new ones.
EXAMPLES = int(os.environ.get("FATTN_FUZZ_EXAMPLES", "40"))
DERANDOMIZE = os.environ.get("FATTN_FUZZ_RANDOM", "") != "1"

EXAMPLE_COUNTS: Counter = Counter()


def count_example(prop: str) -> None:
    EXAMPLE_COUNTS[prop] += 1


def check_rejected(call, args: dict, name: str, what: str, errors=(RuntimeError, ValueError, TypeError)) -> None:
    """call(**args) must raise one of `errors` whose message names `name`, and leave every CPU
    tensor among `args` unchanged (meta tensors hold no values to compare)."""
    import pytest
    import torch

    before = {n: t.clone() for n, t in args.items() if isinstance(t, torch.Tensor) and t.device.type == "cpu"}
    with pytest.raises(errors) as error:
        call(**args)
    assert name in str(error.value), f"{what}: {error.value}"
    assert all(torch.equal(args[n], t) for n, t in before.items()), f"{what}: an input changed"
