"""The score-modifier variants: the one table that names the values of the attention kernels'
SCORE_MOD constexpr.

A variant decides which score-modifier code a kernel is compiled with; its runtime arguments
(softcap_log2, use_alibi, use_bias, dropout_threshold) still turn each piece on or off within
it, so one variant serves any mix of what it compiles. Leaving code out is the point: the bias's
and dropout's code costs registers even when unused, and the softcap's made the Hopper
kernels' consumers spill (docs/notes/tuning.md T29).

Everything else spells the variants from here: the kernels compare SCORE_MOD with the
constexprs below (`if SCORE_MOD == BIAS_DROPOUT:`); aot_build/configs.json names them in its
flags, exclusions and overrides ("SCORE_MOD": ["plain", ...]), which aot_build/grid.py turns into
the values; aot_build/launchers.py writes the table into kernel_launchers.h as the C++ enum
fattn::kernels::score_mod::Value (kPlain, ...), whose values the C++ ops pass as the
SCORE_MOD flag. The values are the variants' identities in the build's table keys and labels:
never renumber one.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton.language as tl


@dataclass(frozen=True)
class ScoreMod:
    name: str   # configs.json's and the Python specs' spelling
    value: int  # the SCORE_MOD constexpr and the C++ flag
    cpp: str    # the C++ enumerator in kernel_launchers.h
    doc: str    # what the variant compiles, per kernel family


SCORE_MODS = (
    ScoreMod("plain", 0, "kPlain",
             "No score modifier: the scores are q.k times the softmax scale. attn_fwd_sm90 leaves them "
             "unscaled and folds the scale into its exp2."),
    ScoreMod("softcap_alibi", 1, "kSoftcapAlibi",
             "The softcap (softcap * tanh(s / softcap), off when softcap_log2 is 0) and ALiBi "
             "(-slope * |i + seqlen_k - seqlen_q + alibi_offset - j|, off when use_alibi is 0) on every "
             "tile; the backward multiplies dS by the softcap's derivative 1 - tanh^2. Every kernel "
             "family builds it."),
    ScoreMod("bias_dropout", 2, "kBiasDropout",
             "softcap_alibi plus an additive bias read through pointers (any layout: broadcast over "
             "queries, heads or batch, any row stride; every tile masked) and dropout; the backward "
             "writes d bias. The Triton kernels' alone (attn_fwd, attn_bwd_dkdv, attn_bwd_dq): the "
             "Hopper kernels read a bias by TMA only (bias_tma)."),
    ScoreMod("alibi_only", 3, "kAlibiOnly",
             "ALiBi alone, compiled without the softcap's code (the op picks it when softcap is 0). "
             "The Hopper kernels' alone (attn_fwd_sm90, attn_bwd_dkdv_sm90, attn_bwd_dq_sm90); "
             "elsewhere ALiBi runs softcap_alibi."),
    ScoreMod("bias_tma", 4, "kBiasTma",
             "A bias whose rows TMA can read (a nonzero row stride, every stride a multiple of 16 bytes "
             "from a 16-byte aligned base), loaded by the producer with the tile it belongs to, and "
             "dropout. The forward keeps the softcap and ALiBi; the backward (attn_bwd_dkdv_sm90, "
             "attn_bwd_dq_sm90) keeps ALiBi and has no softcap code, and with d bias needs seqlen_k a "
             "multiple of 4. The Hopper kernels' alone; elsewhere a bias runs bias_dropout."),
)

_BY_NAME = {m.name: m for m in SCORE_MODS}


def score_mod_value(name: str) -> int:
    """The SCORE_MOD value of a variant's name; a ValueError names the known ones."""
    try:
        return _BY_NAME[name].value
    except (KeyError, TypeError):
        raise ValueError(f"no score-modifier variant {name!r}; triton_src/variants.py names "
                         f"{[m.name for m in SCORE_MODS]}") from None


def score_mod_name(value: int) -> str:
    """The name of a SCORE_MOD value (a variant's label, a test's message)."""
    for m in SCORE_MODS:
        if m.value == value:
            return m.name
    raise ValueError(f"no score-modifier variant has the value {value!r}; triton_src/variants.py has "
                     f"{[m.value for m in SCORE_MODS]}")


# What the kernels compare SCORE_MOD with: module-level constexprs, the only globals that
# @triton.jit and @gluon.jit functions may read.
PLAIN = tl.constexpr(score_mod_value("plain"))
SOFTCAP_ALIBI = tl.constexpr(score_mod_value("softcap_alibi"))
BIAS_DROPOUT = tl.constexpr(score_mod_value("bias_dropout"))
ALIBI_ONLY = tl.constexpr(score_mod_value("alibi_only"))
BIAS_TMA = tl.constexpr(score_mod_value("bias_tma"))
