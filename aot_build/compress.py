"""Packs each variant's cubin and PTX as compressed fatbinaries.

The CUDA driver's cuModuleLoadData takes a fatbinary as readily as a raw cubin or
PTX and decompresses it itself, once, when the module first loads; so compression
costs the runtime no code. The cubin and the PTX go into separate fatbinaries, so
that FATTN_FORCE_PTX_ARCH really loads the PTX. Compression needs the CUDA
toolkit's `fatbinary` tool at build time; without it (FATTN_COMPRESS=none, or
auto with no tool on PATH) the raw images are embedded instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path


class CompressError(RuntimeError):
    pass


def mode(env=None) -> str:
    """'fatbinary' or 'none', from FATTN_COMPRESS (auto | fatbinary | none)."""
    env = os.environ if env is None else env
    wanted = env.get("FATTN_COMPRESS", "auto").lower()
    if wanted not in ("auto", "fatbinary", "none"):
        raise CompressError(f"FATTN_COMPRESS={wanted!r}: expected auto, fatbinary or none")
    if wanted == "none":
        return "none"
    tool = shutil.which("fatbinary")
    if tool is None:
        if wanted == "fatbinary":
            raise CompressError("FATTN_COMPRESS=fatbinary but no `fatbinary` (CUDA toolkit) on PATH")
        return "none"
    return "fatbinary"


def _sm_name(arch: int) -> str:
    # Triton compiles sm_90 with the 'a' (arch-specific) features.
    return f"{arch}a" if arch == 90 else str(arch)


def pack(cubin: bytes, ptx: str, arch: int, how: str) -> tuple[bytes, bytes]:
    """(cubin image, ptx image) to embed. Raw PTX is NUL-terminated, as the driver reads it as a C string."""
    if how == "none":
        return cubin, ptx.encode() + b"\0"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "k.cubin").write_bytes(cubin)
        (tmp / "k.ptx").write_text(ptx)
        images = []
        for kind, name in (("elf", "k.cubin"), ("ptx", "k.ptx")):
            out = tmp / f"{kind}.fatbin"
            cmd = ["fatbinary", f"--create={out}", f"--image3=kind={kind},sm={_sm_name(arch)},file={tmp / name}",
                   "--compress-all", "--compress-mode=default"]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                raise CompressError(f"fatbinary failed ({' '.join(cmd)}): {result.stderr.strip()}")
            images.append(out.read_bytes())
    return images[0], images[1]
