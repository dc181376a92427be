"""Compiles one variant with triton.compile (no GPU needed) and caches the result.

The cache key covers everything that changes the binary: the source of every
kernel file, the variant (constants, warps, stages, arch, dtype), the signature
and the Triton version. A rebuild with nothing changed reads only the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from . import compress, ptx_passes
from .grid import Variant
from .signatures import kernel_spec, runtime_params, triton_signature

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNEL_DIR = REPO_ROOT / "triton_src"


class BuildError(RuntimeError):
    """A variant cannot be built as configured (e.g. it needs more shared memory than its arch has)."""


@dataclass
class Artifact:
    variant: Variant
    cubin: bytes
    ptx: str
    meta: dict          # name, shared, num_warps, scratch sizes, params
    cubin_image: bytes  # what gets embedded: the cubin, or a compressed fatbinary of it
    ptx_image: bytes    # NUL-terminated PTX, or a compressed fatbinary of it
    seconds: float
    cached: bool


# The caller's own TRITON_CACHE_DIR, if any, before compile_variant sets it.
_CALLERS_TRITON_CACHE = os.environ.get("TRITON_CACHE_DIR")


def _kernel_source_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(KERNEL_DIR.rglob("*.py")):
        h.update(path.relative_to(KERNEL_DIR).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def cache_key(variant: Variant, triton_version: str, source_digest: str) -> str:
    key = {
        "source": source_digest, "variant": repr(variant), "triton": triton_version,
        "line_info": "disabled", "format": 1,
    }
    if ptx_passes.passes_for(variant.implementation or variant.kernel):
        key["ptx_passes"] = ptx_passes.passes_digest()
    blob = json.dumps(key, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def default_cache_dir() -> Path:
    return Path(os.environ.get("FATTN_AOT_CACHE", REPO_ROOT / "build" / "aot_cache"))


def _source_class(fn):
    """Triton's ASTSource, or for a Gluon kernel (@gluon.jit: explicit layouts, shared memory,
    barriers and async wgmma) Gluon's, which differs only in the front end; the rest of the build
    (signature, target, cubin, launch ABI) is the same for both."""
    from triton.compiler import ASTSource

    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource  # Triton 3.6's home for it

        return GluonASTSource
    return ASTSource


def compile_variant(variant: Variant, shared_limit: int, cache_dir: Path | None = None,
                    source_digest: str | None = None, packing: str = "none") -> Artifact:
    # Line info would embed absolute paths of this machine in the binaries.
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    import triton
    from triton.backends.compiler import GPUTarget

    cache_dir = default_cache_dir() if cache_dir is None else Path(cache_dir)
    source_digest = source_digest or _kernel_source_digest()
    entry_dir = cache_dir / cache_key(variant, triton.__version__, source_digest)
    start = time.time()
    if (entry_dir / "meta.json").exists():
        meta = json.loads((entry_dir / "meta.json").read_text())
        cubin = (entry_dir / "kernel.cubin").read_bytes()
        ptx = (entry_dir / "kernel.ptx").read_text()
        cached = True
    else:
        name = variant.implementation or variant.kernel
        passes = ptx_passes.passes_for(name)
        # Keep Triton's own cache inside ours (or where the caller's TRITON_CACHE_DIR says) so
        # builds never touch ~/.triton. Triton 3.6's key does not see the PTX passes, so kernels
        # with passes keep theirs apart, by the passes' digest.
        triton_cache = Path(_CALLERS_TRITON_CACHE) if _CALLERS_TRITON_CACHE else cache_dir / "triton"
        if passes:
            triton_cache = triton_cache / f"ptx-passes-{ptx_passes.passes_digest()}"
        os.environ["TRITON_CACHE_DIR"] = str(triton_cache)
        fn = kernel_spec(name).kernel
        signature, attrs = triton_signature(name, variant.dtype, variant.constant_dict)
        src = _source_class(fn)(fn, signature, variant.constant_dict, attrs)
        removed: dict = {}
        # A process-wide knob: the build compiles one variant at a time per process.
        callers_hook = triton.knobs.runtime.add_stages_inspection_hook
        triton.knobs.runtime.add_stages_inspection_hook = ptx_passes.stages_hook(passes, removed) if passes else None
        try:
            compiled = triton.compile(src, target=GPUTarget("cuda", variant.arch, 32),
                                      options={"num_warps": variant.num_warps,
                                               "num_stages": variant.num_stages})
        finally:
            triton.knobs.runtime.add_stages_inspection_hook = callers_hook
        md = compiled.metadata
        meta = {
            "name": md.name, "shared": md.shared, "num_warps": md.num_warps,
            "num_stages": md.num_stages,
            "global_scratch_size": md.global_scratch_size,
            "global_scratch_align": md.global_scratch_align,
            "profile_scratch_size": md.profile_scratch_size,
            "profile_scratch_align": md.profile_scratch_align,
            "params": [list(p) for p in runtime_params(variant.kernel)],  # as JSON reads it back
            # The host-made maps' boxes, swizzles and element types, in the kernel's order of its
            # map parameters: what the launcher encodes each call's maps with.
            "maps": [dict(m) for m in (getattr(md, "tensordesc_meta", None) or [])],
            "triton_version": triton.__version__,
        }
        if passes:
            meta["ptx_passes"] = removed  # what each pass removed (a count), or {} from Triton's cache
        cubin, ptx = compiled.asm["cubin"], compiled.asm["ptx"]
        tmp = entry_dir.with_name(entry_dir.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "kernel.cubin").write_bytes(cubin)
        (tmp / "kernel.ptx").write_text(ptx)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            tmp.rename(entry_dir)  # atomic: a half-written entry is never seen
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another build won the race, same content
        cached = False
    if meta["shared"] > shared_limit:
        raise BuildError(
            f"{variant.label}: needs {meta['shared']} bytes of shared memory but sm{variant.arch} "
            f"allows {shared_limit}; shrink BLOCK_M/BLOCK_N/num_stages for this arch in "
            f"aot_build/configs.json")
    cubin_image, ptx_image = _packed(entry_dir, cubin, ptx, variant.arch, packing)
    return Artifact(variant, cubin, ptx, meta, cubin_image, ptx_image, time.time() - start, cached)


def _packed(entry_dir: Path, cubin: bytes, ptx: str, arch: int, packing: str) -> tuple[bytes, bytes]:
    """The embeddable images, cached beside the raw ones (packing costs two tool runs)."""
    if packing == "none":
        return compress.pack(cubin, ptx, arch, packing)
    paths = entry_dir / f"cubin.{packing}", entry_dir / f"ptx.{packing}"
    if all(p.exists() for p in paths):
        return paths[0].read_bytes(), paths[1].read_bytes()
    images = compress.pack(cubin, ptx, arch, packing)
    for path, image in zip(paths, images):
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_bytes(image)
        tmp.replace(path)
    return images
