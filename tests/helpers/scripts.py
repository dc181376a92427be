"""Running several command-line scripts as programs in one Python process: each as `__main__`
with its own argv, its exit status and standard error kept. A process per script pays torch's
import each time (seconds); the scripts that only check where they may run need one. Between
scripts the runner puts sys.path back and forgets the modules the script imported from the
tree outside the installed package (benchmarks/, tuning/, triton_src/, aot_build/), so that one
script's imports cannot satisfy the next one's: fattn itself stays (its ops register once)."""

import json
import subprocess
import sys
from pathlib import Path

RUNNER = r"""
import contextlib, io, json, os, runpy, sys
root, scripts = json.loads(sys.argv[1])
tree = tuple(os.path.join(root, d) + os.sep for d in ("benchmarks", "tuning", "triton_src", "aot_build"))
path0, modules0 = list(sys.path), set(sys.modules)
for path, args in scripts:
    sys.path[:] = [os.path.dirname(path)] + path0  # as `python path` puts the script's folder first
    for name in set(sys.modules) - modules0:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(tree):
            del sys.modules[name]
    sys.argv = [path, *args]
    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except Exception as e:
            code = 1
            print(f"{type(e).__name__}: {e}", file=sys.stderr)
    print(json.dumps({"script": path, "code": code, "stderr": err.getvalue()}), flush=True)
"""


def run_scripts(scripts: list[tuple[Path, list[str]]], timeout: int = 600) -> dict[str, tuple[int, str]]:
    """{script path: (exit status, standard error)} of each (path, argv) run in turn."""
    root = str(Path(__file__).resolve().parents[2])
    run = subprocess.run([sys.executable, "-c", RUNNER, json.dumps([root, [[str(p), a] for p, a in scripts]])],
                         capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith('{"script"')]
    assert len(rows) == len(scripts), f"the runner stopped after {len(rows)} scripts:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return {r["script"]: (r["code"], r["stderr"]) for r in rows}
