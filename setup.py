"""Builds fattn: compiles the kernel grid with aot_build, then the C++ library with g++.

The library is a plain shared object (libfattn.so) loaded with torch.ops.load_library,
built against the LibTorch stable ABI for torch 2.11, so one build serves every
torch >= 2.11 and every Python. No nvcc and no GPU are needed. Its flags live in
build_flags.txt, which CMakeLists.txt reads too.

Knobs: FATTN_CUDA_ARCHS, FATTN_HEAD_DIMS (narrow the grid), FATTN_AOT_CACHE
(kernel cache folder), FATTN_BUILD_JOBS (parallel compiles), FATTN_COMPRESS
(auto | fatbinary | none), CXX (compiler).
"""

import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
GENERATED = ROOT / "build" / "generated"
OBJECTS = ROOT / "build" / "obj"
FLAGS_FILE = ROOT / "build_flags.txt"


def read_build_flags(path=FLAGS_FILE):
    """build_flags.txt as {key: [words]}; CMakeLists.txt parses it by the same rules."""
    flags = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        key, sep, value = line.partition("=")
        if ";" in line:  # CMake's file(STRINGS) would split the line there
            raise ValueError(f"{path}:{number}: no ';' allowed, got {line!r}")
        if not line or line.startswith("#"):
            continue
        if not sep or not re.fullmatch(r"[a-z_]+", key.strip()):
            raise ValueError(f"{path}:{number}: expected `key = value`, got {line!r}")
        flags[key.strip()] = shlex.split(value)
    return flags


def csrc_sources():
    return sorted(str(p) for p in (ROOT / "csrc").rglob("*.cpp")) + [str(GENERATED / "kernel_table.cpp")]


class BuildFattn(build_ext):
    def get_ext_filename(self, ext_name):
        # Not a Python extension module: a library for torch.ops.load_library, so no
        # Python ABI tag in its name.
        return os.path.join(*ext_name.split(".")[:-1], "libfattn.so")

    def build_extension(self, ext):
        sys.path.insert(0, str(ROOT))
        from aot_build.__main__ import build as aot_build

        jobs = int(os.environ.get("FATTN_BUILD_JOBS", os.cpu_count() or 1))
        aot_build(GENERATED, jobs=jobs, log=lambda m: print(m, flush=True))
        self._compile_and_link(ext, jobs)

    def _compile_and_link(self, ext, jobs):
        import torch

        torch_dir = Path(torch.__file__).parent
        cxx = shlex.split(os.environ.get("CXX", "g++"))
        build_flags = read_build_flags()
        flags = (build_flags["optimize"] + [f"-std=c++{''.join(build_flags['cxx_standard'])}"]
                 + build_flags["compile_options"] + [f"-D{d}" for d in build_flags["defines"]]
                 + [f"-I{ROOT / d}" for d in build_flags["include_dirs"]] + [f"-I{torch_dir / 'include'}"])
        OBJECTS.mkdir(parents=True, exist_ok=True)
        header_mtime = max(p.stat().st_mtime for p in (ROOT / "csrc").rglob("*.h"))

        def compile_one(src):
            obj = OBJECTS / (Path(src).relative_to(ROOT).as_posix().replace("/", "_") + ".o")
            deps = [Path(src).stat().st_mtime, header_mtime]
            if src.endswith("kernel_table.cpp"):
                deps.append((GENERATED / "kernels.bin").stat().st_mtime)
            if obj.exists() and obj.stat().st_mtime >= max(deps):
                return str(obj)
            cmd = cxx + flags + ["-c", src, "-o", str(obj)]
            print(" ".join(cmd[:2]) + " ... " + Path(src).name, flush=True)
            subprocess.run(cmd, check=True)
            return str(obj)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            objects = list(pool.map(compile_one, csrc_sources()))
        out = Path(self.get_ext_fullpath(ext.name))
        out.parent.mkdir(parents=True, exist_ok=True)
        libraries = build_flags["torch_libraries"] + build_flags["system_libraries"]
        link = (cxx + ["-shared", "-o", str(out)] + objects + build_flags["link_options"]
                + [f"-L{torch_dir / 'lib'}"] + [f"-l{library}" for library in libraries])
        subprocess.run(link, check=True)
        print(f"fattn: linked {out}", flush=True)


def manylinux_tag(library: Path) -> str:
    """The manylinux platform tag the library really needs: the newest glibc symbol
    version it imports (read from its dynamic string table)."""
    data = library.read_bytes()
    minors = [int(m) for m in re.findall(rb"GLIBC_2\.(\d+)", data)]
    machine = os.uname().machine
    return f"manylinux_2_{max(minors, default=17)}_{machine}"


class WheelForEveryPython(bdist_wheel):
    """py3-none-<manylinux>: libfattn.so is loaded by torch.ops.load_library, not
    imported by Python, and uses torch's stable C ABI only, so one wheel serves
    every CPython >= 3.10 and every torch >= 2.11 on the platform."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        build = self.get_finalized_command("build_ext")
        library = Path(build.get_ext_fullpath("fattn.libfattn"))
        if not library.exists():
            # Editable installs name their wheel before building anything; the tag
            # of that throwaway wheel does not matter.
            return super().get_tag()
        return "py3", "none", manylinux_tag(library)


setup(
    package_dir={"": "python"},
    packages=["fattn"],
    ext_modules=[Extension("fattn.libfattn", sources=[])],
    cmdclass={"build_ext": BuildFattn, "bdist_wheel": WheelForEveryPython},
)
