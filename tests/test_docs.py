"""The docs run as written: every Python block of README.md and docs/ is executed on CPU, the blocks of
one file in order in one namespace (a later block may use what an earlier one made), unless its first
line says, visibly in the doc, `# not run: <why>`; and the performance tables are what
benchmarks/doc_tables.py makes of the committed JSON. A stale example or table fails here."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "CHANGELOG.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
NOT_RUN = "# not run:"


def _blocks(path):
    text = path.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(1)) for m in BLOCK.finditer(text)]


def test_the_docs_hold_python_blocks_to_run():
    runnable = [b for path in DOCS for _, b in _blocks(path) if not b.startswith(NOT_RUN)]
    assert len(runnable) >= 5, "the examples this test runs went missing"


@pytest.mark.parametrize("path", [p for p in DOCS if _blocks(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_runs(path):
    pytest.importorskip("transformers")  # docs/api.md's backend example; an optional dependency CI installs
    namespace = {"__name__": f"doc_{path.stem}"}
    for line, code in _blocks(path):
        if code.startswith(NOT_RUN):
            assert len(code.splitlines()[0]) > len(NOT_RUN) + 2, f"{path.name}:{line}: say why it is not run"
            continue
        try:
            exec(compile(code, f"{path.name}:{line}", "exec"), namespace)
        except Exception as error:  # the block's place in the doc, not this file's
            raise AssertionError(f"{path.relative_to(ROOT)}, the block at line {line}: {error!r}") from error


def test_the_performance_tables_are_the_committed_json_s():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "doc_tables.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_results_folder_has_its_row_in_the_results_index():
    # benchmarks/results/README.md says what each folder holds and which doc reads it: a folder
    # committed without its row, or a row left behind by a removed folder, fails here.
    results = ROOT / "benchmarks" / "results"
    folders = {p.name for p in results.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    listed = set(re.findall(r"^\| `([\w.-]+)/` \|", (results / "README.md").read_text(), re.M))
    assert folders - listed == set(), f"folders without a row in benchmarks/results/README.md: {sorted(folders - listed)}"
    assert listed - folders == set(), f"rows of benchmarks/results/README.md without a folder: {sorted(listed - folders)}"
