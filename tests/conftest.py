"""Fixtures for every test; what tests share otherwise lives in tests/helpers."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
# aot_build is a build tool, not part of the installed package: tests import it from the tree.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# The slow tier's costliest files, costliest first (--durations on the 2-core CI machine: the
# interpreted attention kernels 160-210 s, the CMake build 75 s alone, the rest 40-120 s).
# Collected first, so that with files spread over the workers (CI's --dist loadfile
# --no-loadscope-reorder) the long ones start at once, rather than one ending alone while the
# other worker has finished. Order only.
COSTLIEST_FILES = ["test_attention_kernels_interpreted.py", "test_cpp_example.py", "test_context_parallel_cpu.py",
                   "test_tools.py", "test_aot_build.py", "test_decode_kernels_interpreted.py", "test_ring_cpu.py",
                   "test_op_samples.py"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(COSTLIEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its order


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
