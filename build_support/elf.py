"""What a shared library needs from the system it loads on, read from its ELF headers.

`python -m build_support.elf LIBRARY` prints it. setup.py tags the wheel by the newest
glibc symbol version the library imports (its glibc ceiling, rounded up to a manylinux
policy); scripts/check_wheel.py and the tests check it. All read it here, from the
dynamic section (DT_NEEDED) and the version-needs section (.gnu.version_r), as the
dynamic loader does; pure Python, so it runs where no binutils are installed.
"""

from __future__ import annotations

import os
import re
import struct
import sys
from pathlib import Path

SHT_DYNAMIC = 6
SHT_GNU_VERNEED = 0x6FFFFFFE
DT_NEEDED = 1
# libstdc++ and libgcc_s belong to the compiler, not to the system: the process may hold
# an older one (torch's) than the one a library was built against.
COMPILER_RUNTIMES = ("libstdc++.so", "libgcc_s.so")


# The glibc versions that have a manylinux policy (auditwheel's, each from a reference
# distribution). A tag between two of them names no reference platform; auditwheel
# rounds a library's ceiling up to the next one, and so does manylinux_tag.
MANYLINUX_GLIBCS = [(2, 17), (2, 24), (2, 26), (2, 27), (2, 28), (2, 31)] + [(2, n) for n in range(34, 42)]


class ElfError(ValueError):
    pass


def _sections(data: bytes):
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    for i in range(shnum):
        # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info, ...
        fields = struct.unpack_from("<IIQQQQII", data, shoff + i * shentsize)
        yield {"type": fields[1], "offset": fields[4], "size": fields[5], "link": fields[6], "info": fields[7]}


def _string(data: bytes, table: dict, offset: int) -> str:
    start = table["offset"] + offset
    return data[start:data.index(b"\0", start)].decode()


def dependencies(path) -> tuple[list[str], dict[str, list[str]]]:
    """(DT_NEEDED libraries, {library: [symbol versions needed from it]})."""
    data = Path(path).read_bytes()
    sections = list(_sections(data))
    needed, versions = [], {}
    for section in sections:
        strings = sections[section["link"]]
        if section["type"] == SHT_DYNAMIC:
            for at in range(section["offset"], section["offset"] + section["size"], 16):
                tag, value = struct.unpack_from("<qQ", data, at)
                if tag == DT_NEEDED:
                    needed.append(_string(data, strings, value))
        elif section["type"] == SHT_GNU_VERNEED:
            at = section["offset"]
            for _ in range(section["info"]):  # sh_info: number of Verneed entries
                _, count, file_name, aux, following = struct.unpack_from("<HHIII", data, at)
                names = versions.setdefault(_string(data, strings, file_name), [])
                entry = at + aux
                for _ in range(count):
                    _, _, _, name, next_aux = struct.unpack_from("<IHHII", data, entry)
                    names.append(_string(data, strings, name))
                    entry += next_aux
                at += following
    return needed, versions


def glibc_ceiling(path) -> tuple[int, ...]:
    """The newest GLIBC_x.y version the library imports; (2, 17) when older or none:
    manylinux tags start there."""
    _, versions = dependencies(path)
    found = [tuple(int(p) for p in v[len("GLIBC_"):].split("."))
             for names in versions.values() for v in names if re.fullmatch(r"GLIBC_\d+(\.\d+)+", v)]
    return max(found + [(2, 17)])[:2]


def compiler_runtimes(path) -> list[str]:
    """The DT_NEEDED entries that are a compiler's C++ runtime (libstdc++, libgcc_s)."""
    needed, _ = dependencies(path)
    return [n for n in needed if n.startswith(COMPILER_RUNTIMES)]


def manylinux_tag(path, machine: str | None = None) -> str:
    """The oldest manylinux tag whose glibc provides every glibc symbol version used."""
    ceiling = glibc_ceiling(path)
    major, minor = min((g for g in MANYLINUX_GLIBCS if g >= ceiling), default=ceiling)
    return f"manylinux_{major}_{minor}_{machine or os.uname().machine}"


def describe(path) -> str:
    needed, versions = dependencies(path)
    newest = {lib: max(v, key=lambda s: [int(x) if x.isdigit() else 0 for x in re.split(r"[_.]", s)])
              for lib, v in versions.items()}
    ceiling = ".".join(map(str, glibc_ceiling(path)))
    return (f"{path}: glibc ceiling {ceiling} ({manylinux_tag(path)}); NEEDED {', '.join(needed)}; "
            f"newest version per library: {', '.join(f'{lib} {v}' for lib, v in sorted(newest.items()))}")


if __name__ == "__main__":
    for library in sys.argv[1:] or ["python/fattn/libfattn.so"]:
        print(describe(library))
