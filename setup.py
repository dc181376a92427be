"""Builds fattn: compiles the kernel grid with aot_build, then the C++ library.

The library is a plain shared object (libfattn.so) loaded with torch.ops.load_library,
built against the LibTorch stable ABI for torch 2.11, so one build serves every
torch >= 2.11 and every Python. No nvcc and no GPU are needed. Its flags live in
build_flags.txt, which CMakeLists.txt reads too.

An object is recompiled when its source, a header its depfile names, or its command
line (flags, compiler and the compiler's version) changed; the library is relinked when
an object changed, its link command changed, or it is missing.

A wheel holds the full kernel grid and is linked by the portable toolchain (zig c++ for
glibc 2.28, C++ runtime linked in); a development build (in place or editable) holds
the kernels of this machine's GPUs, or a minimal set without one, and is linked by g++
(build_support/ says why).

Knobs: FATTN_CUDA_ARCHS, FATTN_HEAD_DIMS (the grid; `all` for everything), FATTN_PTX_ARCHS
(whose PTX is embedded: newest | all | none | a list),
FATTN_AOT_CACHE (kernel cache folder), FATTN_BUILD_JOBS (parallel compiles),
FATTN_COMPRESS (auto | fatbinary | none), FATTN_TOOLCHAIN (zig | gcc), CXX (gcc's compiler).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, LinkError

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # build_support and aot_build, from this tree
from build_support.build_flags import read_build_flags  # noqa: E402

GENERATED = ROOT / "build" / "generated"
OBJECTS = ROOT / "build" / "obj"  # one folder per toolchain: switching keeps both builds
PRECOMPILED = ROOT / "csrc" / "precompiled_headers.h"


def csrc_sources():
    return sorted((ROOT / "csrc").rglob("*.cpp")) + [GENERATED / "kernel_table.cpp"]


def shown(path):
    path = Path(path)
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def read_depfile(path):
    """The prerequisites of the one make rule that -MMD writes (source, then headers)."""
    text = path.read_text().replace("\\\n", " ")
    _, _, prerequisites = text.partition(": ")
    words = re.findall(r"(?:\\.|[^\s\\])+", prerequisites)
    return [w.replace("\\ ", " ").replace("$$", "$") for w in words]


def stale_reason(target, record_file, record, inputs):
    """Why `target` must be rebuilt, or None when it is up to date: it is missing, it was
    built by another command line, or one of its inputs is newer than it."""
    if not target.exists():
        return "new"
    try:
        if json.loads(record_file.read_text()) != record:
            return "command line changed"
    except (OSError, ValueError):
        return "no record of its command line"
    built = target.stat().st_mtime_ns
    for path in inputs:
        try:
            if os.stat(path).st_mtime_ns > built:
                return f"{shown(path)} changed"
        except OSError:
            return f"{shown(path)} is gone"
    return None


def depfile_inputs(depfile):
    """What a depfile names, or the depfile itself (reported as gone) before the first compile."""
    try:
        return read_depfile(depfile)
    except OSError:
        return [depfile]


def compile_recorded(command, target, record_file, record, what):
    """Runs a compile of `target` and records its command line once it succeeded; the target is
    dated by the compile's start, so a header saved during the compile is newer."""
    record_file.unlink(missing_ok=True)  # an interrupted compile must not look done
    started = time.time_ns()
    if subprocess.run(command).returncode != 0:
        raise CompileError(f"fattn: compiling {shown(what)} failed")
    os.utime(target, ns=(started, started))
    record_file.write_text(json.dumps(record))


class Objects:
    """One object per source: build/obj/<toolchain>/<name>.o, its depfile <name>.o.d and
    the command line it was compiled with, <name>.o.json. Every source starts with
    csrc/precompiled_headers.h, compiled once into build/obj/<toolchain>/precompiled_headers.h.gch
    (the name beside an -include'd header where g++ and clang both look for it; without a usable
    one they read the header itself): an object is stale when that file is newer."""

    def __init__(self, cxx, flags, identity, force, folder):
        self.cxx, self.identity, self.force, self.folder = cxx, identity, force, folder
        self.header = folder / PRECOMPILED.name
        self.precompiled = folder / (PRECOMPILED.name + ".gch")
        self.base_flags = flags
        self.flags = flags + ["-include", str(self.header)]

    def precompile(self):
        """Compiles the headers when they, a header they include or the command line changed."""
        if not self.header.exists() or self.header.read_bytes() != PRECOMPILED.read_bytes():
            shutil.copyfile(PRECOMPILED, self.header)  # a copy beside its compiled form
        depfile, record_file = self.folder / "precompiled_headers.d", self.folder / "precompiled_headers.json"
        command = self.cxx + self.base_flags + ["-x", "c++-header", "-MMD", "-MF", str(depfile), str(self.header),
                                                "-o", str(self.precompiled)]
        record = {"command": command, "compiler": self.identity}
        why = "forced" if self.force else stale_reason(self.precompiled, record_file, record, depfile_inputs(depfile))
        if why is not None:
            print(f"fattn: compiling {shown(PRECOMPILED)} once for every object ({why})", flush=True)
            compile_recorded(command, self.precompiled, record_file, record, PRECOMPILED)

    def paths(self, src):
        obj = self.folder / (shown(src).replace("/", "_") + ".o")
        return obj, obj.with_name(obj.name + ".d"), obj.with_name(obj.name + ".json")

    def command(self, src):
        obj, depfile, _ = self.paths(src)
        return self.cxx + self.flags + ["-MMD", "-MF", str(depfile), "-c", str(src), "-o", str(obj)]

    def why_compile(self, src):
        obj, depfile, record_file = self.paths(src)
        if self.force:
            return "forced"
        inputs = depfile_inputs(depfile)
        if src.name == "kernel_table.cpp":
            inputs.append(GENERATED / "kernels.bin")  # .incbin: invisible to the depfile
        inputs.append(self.precompiled)  # the depfile names the header, not its compiled form
        return stale_reason(obj, record_file, self.record(src), inputs)

    def record(self, src):
        return {"command": self.command(src), "compiler": self.identity}

    def compile(self, src):
        obj, _, record_file = self.paths(src)
        compile_recorded(self.command(src), obj, record_file, self.record(src), src)


def compile_flags(flags, torch_dir):
    """Every object's compiler arguments: build_flags.txt's, then the two folders that only
    the build knows: aot_build's output (generated code and headers) and torch's headers."""
    return (flags["optimize"] + [f"-std=c++{''.join(flags['cxx_standard'])}"] + flags["compile_options"]
            + [f"-D{define}" for define in flags["defines"]]
            + [f"-I{ROOT / folder}" for folder in flags["include_dirs"]]
            + [f"-I{GENERATED}", f"-I{torch_dir / 'include'}"])


def link_command(cxx, flags, torch_dir, objects, out):
    libraries = flags["torch_libraries"] + flags["system_libraries"]
    return (cxx + ["-shared", "-o", str(out)] + [str(o) for o in objects] + flags["link_options"]
            + [f"-L{torch_dir / 'lib'}"] + [f"-l{library}" for library in libraries])


class BuildFattn(build_ext):
    def get_ext_filename(self, ext_name):
        # Not a Python extension module: a library for torch.ops.load_library, so no
        # Python ABI tag in its name.
        return os.path.join(*ext_name.split(".")[:-1], "libfattn.so")

    def run(self):
        # Recorded first: setuptools clears self.inplace while it builds (it copies afterwards).
        self.development = bool(self.inplace or getattr(self, "editable_mode", False))
        super().run()

    def build_extension(self, ext):
        started = time.time()
        from aot_build import grid
        from aot_build.__main__ import build as aot_build
        from build_support import dev_grid, toolchain

        wheel = not getattr(self, "development", False)
        flags = read_build_flags()
        try:  # before the kernels: a missing ziglang must not cost minutes first
            tool = toolchain.choose(flags, wheel)
        except toolchain.ToolchainError as e:
            raise CompileError(str(e)) from None
        chosen = {} if wheel else dev_grid.choose(os.environ, grid.load_config()["archs"], log=say)
        env = {**os.environ, **chosen}
        jobs = int(os.environ.get("FATTN_BUILD_JOBS", os.cpu_count() or 1))
        stats = {}
        kernels = aot_build(GENERATED, jobs=jobs, env=env, log=say, stats=stats)
        import torch

        torch_dir = Path(torch.__file__).parent
        say(f"fattn: C++ toolchain {tool.describe()}")
        identity = tool.identity()
        cflags = compile_flags(flags, torch_dir) + [f'-DFATTN_TOOLCHAIN="{tool.name}"']  # for build_info
        objects = Objects(tool.cxx, cflags, identity, self.force, OBJECTS / tool.name)
        sources = csrc_sources()
        objects.folder.mkdir(parents=True, exist_ok=True)
        compiled = self._compile(objects, sources, jobs)
        out = Path(self.get_ext_fullpath(ext.name))
        built = [objects.paths(src)[0] for src in sources]
        command = link_command(tool.cxx, flags, torch_dir, built, out) + tool.link_options
        self._link(out, {"command": command, "compiler": identity}, built, objects.folder)
        summary(kernels, stats, len(sources), compiled, tool, out, time.time() - started)
        if chosen == dev_grid.MINIMAL:
            say(f"fattn: this build holds the minimal kernel set for a machine without a GPU; {dev_grid.HINT}")

    def _compile(self, objects, sources, jobs):
        objects.precompile()
        stale = [(src, why) for src in sources if (why := objects.why_compile(src))]
        if not stale:
            print(f"fattn: all {len(sources)} objects up to date", flush=True)
        started = iter(range(1, len(stale) + 1))

        def compile_one(item):
            src, why = item
            print(f"fattn: [{next(started)}/{len(stale)}] compiling {shown(src)} ({why})", flush=True)
            objects.compile(src)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(compile_one, stale))  # list(): a failed compile raises here
        return len(stale)

    def _link(self, out, record, objects, folder):
        # One record for whichever file was linked last: a link to a new place (an editable
        # install's temporary folder) is a changed command line.
        record_file = folder / "libfattn.so.json"
        why = "forced" if self.force else stale_reason(out, record_file, record, objects)
        if why is None:
            print(f"fattn: {shown(out)} up to date", flush=True)
            return
        record_file.unlink(missing_ok=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        if subprocess.run(record["command"]).returncode != 0:
            raise LinkError(f"fattn: linking {shown(out)} failed")
        record_file.write_text(json.dumps(record))
        print(f"fattn: linked {shown(out)} ({why})", flush=True)


def say(message):
    print(message, flush=True)


def summary(kernels, stats, num_sources, compiled, tool, library, seconds):
    """The build's last lines: what it holds, what it cost, what the library needs."""
    from build_support import elf

    archs = sorted({k["arch"] for k in kernels["kernels"]})
    buckets = sorted({k["constants"]["BLOCK_D"] for k in kernels["kernels"] if "BLOCK_D" in k["constants"]})
    needed, _ = elf.dependencies(library)
    say(f"fattn: built in {seconds:.0f}s: {len(kernels['kernels'])} kernel variants for "
        f"{', '.join(f'sm_{a}' for a in archs)}, head-dim buckets {buckets} ({stats['compiled']} compiled, "
        f"{stats['from_cache']} from cache, {stats['seconds']:.0f}s); {num_sources} C++ objects "
        f"({compiled} compiled) with {tool.name}; {shown(library)} {library.stat().st_size / 2**20:.1f} MiB, "
        f"glibc >= {'.'.join(map(str, elf.glibc_ceiling(library)))}, needs {', '.join(needed)}")


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
        from build_support.elf import manylinux_tag

        return "py3", "none", manylinux_tag(library)


setup(
    package_dir={"": "python"},
    packages=["fattn", "fattn.integrations"],
    ext_modules=[Extension("fattn.libfattn", sources=[])],
    cmdclass={"build_ext": BuildFattn, "bdist_wheel": WheelForEveryPython},
)
