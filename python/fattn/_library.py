"""Finding and loading the compiled library, and reading what it was built with."""

from __future__ import annotations

import ctypes
import functools
import json
import os
from pathlib import Path

import torch

LIBRARY_NAME = "libfattn.so"


def library_path() -> Path:
    """The library to load: $FATTN_LIBRARY if set, else the one installed beside this file."""
    override = os.environ.get("FATTN_LIBRARY")
    path = Path(override) if override else Path(__file__).with_name(LIBRARY_NAME)
    if not path.exists():
        raise ImportError(
            f"fattn: compiled library not found at {path}. Build it with "
            "`pip install --no-build-isolation -e .` from the source tree (see README.md, Install)."
        )
    return path


@functools.cache
def load_library() -> Path:
    path = library_path()
    torch.ops.load_library(str(path))
    return path


@functools.cache
def _ctypes_handle() -> ctypes.CDLL:
    # The library is already loaded by torch; this reopens the same copy.
    return ctypes.CDLL(str(load_library()))


def build_info() -> dict:
    """What the library holds: Triton version and one record per compiled kernel variant."""
    fn = _ctypes_handle().fattn_build_info_json
    fn.restype = ctypes.c_char_p
    return json.loads(fn().decode())


def prefers_tile_loop(arch: int, bucket: int, seqlen_q: int, packed: bool, right_edge: bool) -> bool:
    """Whether the forward asks for its looping kernel (attn_fwd's TILE_LOOP) first for such a
    call: the op's own rule (csrc/attention/query_tile_programs.h), over the tuned crossovers."""
    fn = _ctypes_handle().fattn_prefers_tile_loop
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
    return bool(fn(arch, bucket, seqlen_q, int(packed), int(right_edge)))


def host_maps_up_to_rows() -> int:
    """The query rows up to which a dense forward call takes host-made maps where the build has
    the variant (attn_fwd's HOST_MAPS): the op's own rule (csrc/attention/host_maps.h)."""
    fn = _ctypes_handle().fattn_host_maps_up_to_rows
    fn.restype = ctypes.c_int64
    return fn()


def backward_host_maps_up_to_rows() -> int:
    """The query rows up to which a dense backward call takes host-made maps where the build has
    the variants (attn_bwd_dkdv's and attn_bwd_dq's HOST_MAPS): csrc/attention/host_maps.h."""
    fn = _ctypes_handle().fattn_backward_host_maps_up_to_rows
    fn.restype = ctypes.c_int64
    return fn()


def query_tile_programs(tiles: int, sequence_heads: int, sms: int, heavy_first: bool) -> int:
    """The programs per (head, sequence) the op gives the looping forward: the op's own rule."""
    fn = _ctypes_handle().fattn_query_tile_programs
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    return fn(tiles, sequence_heads, sms, int(heavy_first))


def pick_path(kernel: str, major: int, minor: int) -> tuple[int, bool] | None:
    """(arch, from_ptx): the compiled arch whose code would serve a GPU of this compute
    capability, and whether that is its PTX (a GPU newer than every cubin); None if none."""
    path = serving_archs(kernel, major, minor)
    return None if path is None else path[:2]


def serving_archs(kernel: str, major: int, minor: int) -> tuple[int, bool, int | None] | None:
    """pick_path's (arch, from_ptx) and the older arch of its major whose code serves the
    variants that arch lacks (sm_86 for sm_89, which holds only the FP8 ones: configs.json
    "served_by"), or None; None if nothing serves the GPU."""
    fn = _ctypes_handle().fattn_pick_arch
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    ptx, older = ctypes.c_int(0), ctypes.c_int(-1)
    arch = fn(kernel.encode(), 10 * major + minor, ctypes.byref(ptx), ctypes.byref(older))
    if arch < 0:
        return None
    return arch, bool(ptx.value), None if older.value < 0 else older.value


def pick_arch(kernel: str, major: int, minor: int) -> int | None:
    """The compiled arch whose cubins serve a GPU of this compute capability (None if none,
    including when only a PTX fallback would: pick_path says so)."""
    path = pick_path(kernel, major, minor)
    return path[0] if path and not path[1] else None


def module_loads() -> dict:
    """{"attempts": module loads started in this process (failed ones included), "functions":
    kernel functions loaded and cached}: equal when every module loaded exactly once."""
    fn = _ctypes_handle().fattn_module_loads
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    functions = ctypes.c_int64(0)
    attempts = fn(ctypes.byref(functions))
    return {"attempts": int(attempts), "functions": int(functions.value)}
