"""The closing summary's classification of skip reasons (conftest.py at the root): every reason a
test of this suite can give is read from the source and must be either for want of hardware (a
GPU, more GPUs, an arch: shown as [hardware]) or one of the set-up gaps named below (a missing
package, tool or build: [SETUP]). A new reason that is neither fails here, so that a machine
without a GPU never reads as a broken set-up and a real set-up gap is never hidden."""

import ast
import importlib.util
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# The reasons that do mean a set-up gap, by their fixed start.
SETUP = (
    "numpy", "transformers", "matplotlib", "triton", "no g++", "C++ example needs cmake", "no cuobjdump", "no fatbinary tool",
    "no source-tree build", "not a git checkout", "FATTN_LIBRARY points at a library from another build",
    "Triton 3.6's interpreter fails with numpy", "the Triton interpreter needs triton",
    "the kernel specs live beside the Triton kernels", "this build has no", "compute-sanitizer (CUDA toolkit)",
)


def _summary():
    spec = importlib.util.spec_from_file_location("fattn_root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _text(node):
    """A string literal's text, or an f-string's text up to its first placeholder."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return node.values[0].value
    return None


def _reasons():
    """(file, reason) of every pytest.skip(...), skipif(..., reason=...) and importorskip(..., reason=...)
    in the suite, importorskip without a reason giving the module's name."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            name = node.func.attr
            reason = next((_text(k.value) for k in node.keywords if k.arg == "reason"), None)
            if name == "skip" and node.args:
                reason = _text(node.args[0])
            elif name == "importorskip" and reason is None and node.args:
                reason = _text(node.args[0])
            elif name not in ("skipif", "importorskip"):
                continue
            if reason is not None:
                found.append((path.relative_to(ROOT), reason))
    return found


def test_the_suite_gives_skip_reasons_to_classify():
    reasons = _reasons()
    assert len(reasons) > 20, reasons  # the reader finds them: most of the suite's skips
    assert any("needs a CUDA GPU" in r for _, r in reasons)


def test_every_skip_reason_is_hardware_or_a_named_set_up_gap():
    hardware = _summary().HARDWARE
    wrong = []
    for path, reason in _reasons():
        setup = reason.startswith(SETUP)
        if setup == bool(hardware.search(reason)):
            wrong.append(f"{path}: {reason!r} reads as {'[hardware]' if hardware.search(reason) else '[SETUP]'}")
    assert not wrong, "\n".join(wrong)
