"""A study's rewritten copy of a kernel module, imported as a module of triton_src without being
written into it.

The copies keep the kernel's relative imports (`from .masks import ...`), so they must be modules
of the triton_src package; but a file in triton_src/ would change the kernel sources' digest
(aot_build/compiler.py), and with it the key of every cached kernel: the next build would
compile all of them again. The copy's text goes to a temporary folder instead, and is imported
under the package's name from there (Triton's JIT reads the kernel's source from that file).
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType

_FOLDER = None


def import_copy(name: str, source: str) -> ModuleType:
    """triton_src.<name>, made from `source` (the text of a module of triton_src); imported once
    per name and process."""
    global _FOLDER
    qualified = f"triton_src.{name}"
    if qualified in sys.modules:
        return sys.modules[qualified]
    import triton_src  # noqa: F401  (the package its relative imports resolve in)

    if _FOLDER is None:
        _FOLDER = Path(tempfile.mkdtemp(prefix="fattn_kernel_copies_"))
    path = _FOLDER / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(qualified, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[qualified]
        raise
    return module
