"""The C++ layers keep to docs/DESIGN.md's rules, read from the sources (no build needed)."""

import re
from pathlib import Path

CSRC = Path(__file__).resolve().parent.parent / "csrc"
OP_FAMILIES = ("attention", "decode", "merge")


def test_the_runtime_includes_no_op_family_header():
    # The runtime knows nothing about attention: what an op family exposes through the
    # library's C entry points lives in that family's folder.
    include = re.compile(r'#include\s+"(\w+)/')
    offenders = [f"{path.name}: {m.group(0)}"
                 for path in sorted((CSRC / "runtime").iterdir())
                 for m in include.finditer(path.read_text())
                 if m.group(1) in OP_FAMILIES]
    assert offenders == []
