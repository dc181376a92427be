"""Checks a built fattn wheel: tags, size, contents, and that nothing in it is tied
to one Python version.  Usage: python scripts/check_wheel.py dist/fattn-*.whl [--max-mb 60]"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from pathlib import Path


def check(path: Path, max_mb: float) -> list[str]:
    problems = []
    name = path.name
    match = re.fullmatch(r"fattn-[\w.]+-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl", name)
    if not match:
        return [f"{name}: not a wheel file name"]
    if match["py"] != "py3" or match["abi"] != "none":
        problems.append(f"tag {match['py']}-{match['abi']}: expected py3-none (one wheel for every CPython)")
    if not re.fullmatch(r"manylinux_2_\d+_x86_64", match["plat"]):
        problems.append(f"platform tag {match['plat']}: expected manylinux_2_N_x86_64")
    size_mb = path.stat().st_size / 2**20
    if size_mb > max_mb:
        problems.append(f"wheel is {size_mb:.1f} MB, over the {max_mb} MB limit")
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        binaries = [n for n in names if n.endswith(".so") or ".so." in n]
        if binaries != ["fattn/libfattn.so"]:
            problems.append(f"binaries in the wheel: {binaries}; expected exactly fattn/libfattn.so")
        if any(re.search(r"cpython-|abi3|\.pyd$|pypy", n) for n in names):
            problems.append("the wheel holds a Python-version-specific binary")
        for required in ("fattn/__init__.py", "fattn/attention.py", "fattn/decode.py", "fattn/merge.py",
                         "fattn/_checks.py", "fattn/ring.py"):
            if required not in names:
                problems.append(f"missing {required}")
        if "fattn/libfattn.so" in names:
            library = wheel.read("fattn/libfattn.so")
            if re.search(rb"libpython3|Py_Initialize|PyModule_Create", library):
                problems.append("libfattn.so refers to libpython: it would be tied to one Python")
        meta = wheel.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
        if "Root-Is-Purelib: false" not in meta:
            problems.append("WHEEL metadata must say Root-Is-Purelib: false (it holds a binary)")
    print(f"{name}: {size_mb:.1f} MB, {len(names)} files")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--max-mb", type=float, default=60.0)
    args = parser.parse_args()
    problems = check(args.wheel, args.max_mb)
    for p in problems:
        print("FAIL:", p)
    print("wheel OK" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
