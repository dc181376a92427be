"""build_flags.txt, read for setup.py and the toolchain's command line (CMakeLists.txt parses the
same file by the same rules)."""

import re
import shlex
from pathlib import Path

FLAGS_FILE = Path(__file__).resolve().parent.parent / "build_flags.txt"


def read_build_flags(path=FLAGS_FILE):
    """build_flags.txt as {key: [words]}."""
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
