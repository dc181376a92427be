"""The C++ toolchain that compiles and links libfattn.so: FATTN_TOOLCHAIN=zig | gcc.

zig (the default for wheels): `zig c++` from the ziglang package, targeting glibc 2.28
(build_flags.txt: portable_glibc). It links against stubs of that glibc, so a symbol
newer than 2.28 fails the link instead of raising the wheel's tag, and it links its
C++ runtime (libc++, libc++abi, libunwind) in statically and keeps it local
(csrc/libfattn.map): the library needs no libstdc++ and no libgcc_s, so neither an old
system's nor torch's C++ runtime can be older than the one it was built against.
Errors still reach torch as its own exceptions (csrc/runtime/host_exception.h).

gcc (the default for development builds, `pip install -e .` and `setup.py build_ext
--inplace`): $CXX, else g++, linking the system's libstdc++ and libgcc_s dynamically.
Fast and needs nothing installed, but the library is tied to this machine's glibc and
libstdc++ (a wheel built so is tagged, e.g., manylinux_2_34 on Debian 12).

An explicit FATTN_TOOLCHAIN wins; otherwise CXX set means gcc.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZIGLANG = "ziglang==0.17.1"  # pinned: its glibc stubs and libc++ are part of the result


class ToolchainError(RuntimeError):
    pass


@dataclass
class Toolchain:
    name: str                 # "zig" or "gcc"
    cxx: list[str]            # the compiler driver, as a command line prefix
    link_options: list[str] = field(default_factory=list)  # after build_flags.txt's

    def identity(self) -> list[str]:
        """The compiler's real path and version lines: another compiler behind the same
        name (an upgrade, another CXX, another zig) must rebuild everything."""
        found = shutil.which(self.cxx[0])
        lines = [os.path.realpath(found) if found else self.cxx[0]]
        if self.name == "zig":
            lines.append("zig " + _run(self.cxx[:3] + ["version"]).strip())
        return lines + _run(self.cxx + ["--version"]).splitlines()[:1]

    def describe(self) -> str:
        if self.name == "zig":
            target = self.cxx[self.cxx.index("-target") + 1]
            return f"zig c++ ({target}: portable, C++ runtime linked in)"
        return f"{' '.join(self.cxx)} (this system's glibc and libstdc++)"


def _run(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, text=True).stdout


def choose(flags: dict, wheel: bool, env=None) -> Toolchain:
    """The toolchain for this build; `flags` is build_flags.txt, `wheel` says whether the
    build makes a wheel (as opposed to an in-place or editable development build)."""
    env = os.environ if env is None else env
    name = env.get("FATTN_TOOLCHAIN", "").strip().lower()
    if not name:
        name = "gcc" if env.get("CXX") or not wheel else "zig"
    if name == "gcc":
        return Toolchain("gcc", env.get("CXX", "g++").split())
    if name == "zig":
        return zig(flags)
    raise ToolchainError(f"FATTN_TOOLCHAIN={name!r}: expected zig or gcc")


def zig(flags: dict) -> Toolchain:
    try:
        import ziglang  # noqa: F401  (only its presence matters: `python -m ziglang` runs it)
    except ImportError:
        raise ToolchainError(
            f"fattn: the portable toolchain (FATTN_TOOLCHAIN=zig, the default for wheels) needs the "
            f"ziglang package: `pip install {ZIGLANG}`. FATTN_TOOLCHAIN=gcc builds with g++ instead, "
            f"for this machine's glibc and libstdc++ only.") from None
    glibc = "".join(flags["portable_glibc"])
    target = f"{platform.machine()}-linux-gnu.{glibc}"
    script = ROOT / "".join(flags["portable_version_script"])
    return Toolchain("zig", [sys.executable, "-m", "ziglang", "c++", "-target", target],
                     flags["portable_link_options"] + [f"-Wl,--version-script={script}"])


def warm(tool: Toolchain, folder: Path) -> None:
    """Links an empty shared library with `tool`. zig builds its C++ runtime for the target on the
    first link that needs it and caches it (about 90 s on one core): started early, beside work
    that leaves a core idle, the library's own link later finds it built."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "empty.cpp"
    source.write_text("int fattn_toolchain_warm_up() { return 0; }\n")
    # The library's own link options too: the runtime is built once per set of them (-s among them).
    command = tool.cxx + ["-shared", "-fPIC", str(source), "-o", str(folder / "libempty.so")] + tool.link_options
    if subprocess.run(command).returncode != 0:
        raise ToolchainError(f"fattn: linking an empty library with {tool.describe()} failed")


if __name__ == "__main__":
    # python -m build_support.toolchain warm: the portable toolchain's runtime built ahead (CI).
    import time

    from build_support.build_flags import read_build_flags

    if sys.argv[1:] != ["warm"]:
        sys.exit("usage: python -m build_support.toolchain warm")
    started = time.time()
    portable = zig(read_build_flags())
    warm(portable, ROOT / "build" / "toolchain_warm_up")
    print(f"fattn: {portable.describe()} ready in {time.time() - started:.0f}s", flush=True)
