"""Triton kernels of fattn, one file per family; compiled ahead of time by aot_build.

KERNELS maps each kernel's name to its spec (triton_src/spec.py): the one declaration of
its runtime signature that the build, the generated C++ launchers and the Python launch
helper all derive from.
"""

from .backward import ATTN_BWD_DKDV, ATTN_BWD_DQ, ATTN_BWD_PREPROCESS
from .decode import ATTN_DECODE_MERGE, ATTN_DECODE_SPLIT, KV_APPEND, ROTATE_QUERIES
from .forward import ATTN_FWD
from .merge import ATTN_MERGE

KERNELS = {spec.name: spec for spec in (
    ATTN_FWD, ATTN_BWD_PREPROCESS, ATTN_BWD_DKDV, ATTN_BWD_DQ, ATTN_MERGE, KV_APPEND, ROTATE_QUERIES,
    ATTN_DECODE_SPLIT, ATTN_DECODE_MERGE,
)}
