"""Constants every kernel family shares.

Scores live in the log2 domain everywhere (the host folds log2(e) into the scale and the
kernels use exp2, one MUFU instruction); lse leaves the kernels as a natural log.
"""

import os

import triton.language as tl

# Set when Triton's interpreter runs the kernels (CPU, numpy), which cannot execute inline PTX.
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")
LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): natural-log values into the log2 domain
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): log2-domain values back to natural logs
