"""pytest plugin for every test run in this repository: the closing summary says why tests
were skipped, grouped by reason, and calls out skips that are not for want of a GPU.

On a machine without a GPU most of the suite skips by design; a test skipped for a
missing package or tool (numpy, cmake, a compiler) is a gap in the setup instead, and
the plain `N skipped` count hides which is which. tests/conftest.py holds the fixtures.
"""

from __future__ import annotations

import re
from collections import Counter

# Skips that only a machine with (more) GPUs removes.
# (tests/test_skip_summary.py checks every reason the suite gives against this)
HARDWARE = re.compile(r"GPU|needs .*sm_\d+")


def _reason(report) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter):
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons = Counter(_reason(r) for r in skipped)
    terminalreporter.write_sep("-", f"{len(skipped)} skipped, by reason")
    for reason, count in reasons.most_common():
        kind = "hardware" if HARDWARE.search(reason) else "SETUP"
        terminalreporter.write_line(f"{count:6d}  [{kind}] {reason}")
    other = sum(count for reason, count in reasons.items() if not HARDWARE.search(reason))
    if other:
        terminalreporter.write_line(f"{other} skipped for something other than GPUs: a missing package, tool "
                                    f"or build (see [SETUP] above)", yellow=True)
    else:
        terminalreporter.write_line("every skip is for want of a GPU (or of more GPUs)", green=True)
