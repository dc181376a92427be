"""Triton kernels of fattn, one file per family; compiled ahead of time by aot_build.

KERNELS maps each kernel's name to its spec (triton_src/spec.py): the one declaration of
its runtime signature that the build, the generated C++ launchers and the Python launch
helper all derive from. IMPLEMENTATIONS are other kernel functions under a family's contract
(its spec's parameters and constexprs, its grid and results), which configs.json's
"implementations" build for some archs, buckets and flags in the family's place: the C++ ops
launch them through the family's launcher without knowing.
"""

from .backward import ATTN_BWD_DKDV, ATTN_BWD_DQ, ATTN_BWD_PREPROCESS
from .backward_dq_sm90 import ATTN_BWD_DQ_SM90
from .backward_sm90 import ATTN_BWD_DKDV_SM90
from .decode import ATTN_DECODE_MERGE, ATTN_DECODE_SPLIT, KV_APPEND, ROTATE_QUERIES
from .forward import ATTN_FWD
from .fp8 import FP8_TRANSPOSE_V
from .forward_sm90 import ATTN_FWD_SM90
from .merge import ATTN_MERGE
from .segments import SEGMENT_SPANS

KERNELS = {spec.name: spec for spec in (
    ATTN_FWD, ATTN_BWD_PREPROCESS, ATTN_BWD_DKDV, ATTN_BWD_DQ, SEGMENT_SPANS, ATTN_MERGE, KV_APPEND,
    ROTATE_QUERIES, ATTN_DECODE_SPLIT, ATTN_DECODE_MERGE, FP8_TRANSPOSE_V,
)}

IMPLEMENTATIONS = {spec.name: spec for spec in (ATTN_FWD_SM90, ATTN_BWD_DKDV_SM90, ATTN_BWD_DQ_SM90)}
