"""Fixtures for every test; what tests share otherwise lives in tests/helpers."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
# aot_build is a build tool, not part of the installed package: tests import it from the tree.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    # Fresh random inputs per test, but reproducible from the test's name.
    torch.manual_seed(hash(request.node.nodeid) % (2**31))


def pytest_terminal_summary(terminalreporter):
    # The fuzz suite's example counts (tests/helpers/fuzz.py), when it ran.
    from helpers.fuzz import EXAMPLE_COUNTS

    if EXAMPLE_COUNTS:
        terminalreporter.write_sep("-", "fuzz examples run, per property")
        for prop, count in sorted(EXAMPLE_COUNTS.items()):
            terminalreporter.write_line(f"{count:6d}  {prop}")
