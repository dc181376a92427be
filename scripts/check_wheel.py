"""Checks a built fattn wheel: tags, size, contents, nothing tied to one Python version,
and what its library needs from the system it is installed on.

Usage: python scripts/check_wheel.py dist/fattn-*.whl [--max-mb 60] [--max-glibc 2.28]
                                     [--auditwheel auditwheel]

The library must import no glibc symbol newer than --max-glibc (torch's own wheels are
manylinux_2_28), must not need the compiler's C++ runtime (libstdc++, libgcc_s: the one
in the process may be older than the build's), and the wheel's platform tag must be the
one its glibc ceiling gives. With --auditwheel, `auditwheel show` must find the same tag
from the symbol versions, and no external library but torch's libtorch_cpu.so.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from build_support import elf  # noqa: E402

NAME = re.compile(r"fattn-[\w.]+-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl")


def check_contents(wheel: zipfile.ZipFile, names: list[str]) -> list[str]:
    problems = []
    binaries = [n for n in names if n.endswith(".so") or ".so." in n]
    if binaries != ["fattn/libfattn.so"]:
        problems.append(f"binaries in the wheel: {binaries}; expected exactly fattn/libfattn.so")
    if any(re.search(r"cpython-|abi3|\.pyd$|pypy", n) for n in names):
        problems.append("the wheel holds a Python-version-specific binary")
    for required in ("fattn/__init__.py", "fattn/attention.py", "fattn/decode.py", "fattn/merge.py",
                     "fattn/_checks.py", "fattn/ring.py"):
        if required not in names:
            problems.append(f"missing {required}")
    meta = wheel.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
    if "Root-Is-Purelib: false" not in meta:
        problems.append("WHEEL metadata must say Root-Is-Purelib: false (it holds a binary)")
    return problems


def check_library(library: Path, platform_tag: str, max_glibc: tuple[int, int]) -> list[str]:
    problems = []
    if re.search(rb"libpython3|Py_Initialize|PyModule_Create", library.read_bytes()):
        problems.append("libfattn.so refers to libpython: it would be tied to one Python")
    ceiling = elf.glibc_ceiling(library)
    needed, _ = elf.dependencies(library)
    print(f"libfattn.so: glibc ceiling {'.'.join(map(str, ceiling))}, NEEDED {', '.join(needed)}")
    if ceiling > max_glibc:
        problems.append(f"libfattn.so imports glibc {'.'.join(map(str, ceiling))} symbols, newer than "
                        f"{'.'.join(map(str, max_glibc))}: {elf.describe(library)}")
    if runtimes := elf.compiler_runtimes(library):
        problems.append(f"libfattn.so needs the compiler's C++ runtime {runtimes} (build with FATTN_TOOLCHAIN=zig)")
    expected = elf.manylinux_tag(library, platform_tag.split("_", 3)[-1])
    if platform_tag != expected:
        problems.append(f"platform tag {platform_tag}, but the library's glibc ceiling gives {expected}")
    return problems


def check_auditwheel(command: str, path: Path, platform_tag: str) -> list[str]:
    """auditwheel's view of the same wheel: its symbol-version tag must be ours. Its overall
    tag is plain linux_* because libtorch_cpu.so is outside any manylinux policy; that one
    comes from the torch the wheel requires, so it is the only external library allowed."""
    result = subprocess.run([*command.split(), "show", "--json", str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        return [f"auditwheel show failed: {result.stderr.strip()}"]
    report = json.loads(result.stdout)
    print(f"auditwheel show: symbol-version tag {report['sym_tag']}, external libraries "
          f"{sorted(report['external_libs'])}")
    problems = []
    if report["sym_tag"] != platform_tag:
        problems.append(f"auditwheel derives {report['sym_tag']} from the symbol versions; the wheel says {platform_tag}")
    if set(report["external_libs"]) - {"libtorch_cpu.so"}:
        problems.append(f"external libraries besides libtorch_cpu.so: {sorted(report['external_libs'])}")
    return problems


def check(path: Path, max_mb: float, max_glibc: tuple[int, int], auditwheel: str | None) -> list[str]:
    match = NAME.fullmatch(path.name)
    if not match:
        return [f"{path.name}: not a wheel file name"]
    problems = []
    if match["py"] != "py3" or match["abi"] != "none":
        problems.append(f"tag {match['py']}-{match['abi']}: expected py3-none (one wheel for every CPython)")
    if not re.fullmatch(r"manylinux_\d+_\d+_x86_64", match["plat"]):
        problems.append(f"platform tag {match['plat']}: expected manylinux_X_Y_x86_64")
    size_mb = path.stat().st_size / 2**20
    if size_mb > max_mb:
        problems.append(f"wheel is {size_mb:.1f} MB, over the {max_mb} MB limit")
    with zipfile.ZipFile(path) as wheel, tempfile.TemporaryDirectory() as tmp:
        names = wheel.namelist()
        problems += check_contents(wheel, names)
        if "fattn/libfattn.so" in names:
            library = Path(wheel.extract("fattn/libfattn.so", tmp))
            problems += check_library(library, match["plat"], max_glibc)
    if auditwheel:
        problems += check_auditwheel(auditwheel, path, match["plat"])
    print(f"{path.name}: {size_mb:.1f} MB, {len(names)} files")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--max-mb", type=float, default=60.0)
    parser.add_argument("--max-glibc", default="2.28", help="newest glibc symbol version allowed (default 2.28)")
    parser.add_argument("--auditwheel", metavar="COMMAND", help="also compare with `COMMAND show` (e.g. auditwheel)")
    args = parser.parse_args()
    max_glibc = tuple(int(p) for p in args.max_glibc.split("."))
    problems = check(args.wheel, args.max_mb, max_glibc, args.auditwheel)
    for p in problems:
        print("FAIL:", p)
    print("wheel OK" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
