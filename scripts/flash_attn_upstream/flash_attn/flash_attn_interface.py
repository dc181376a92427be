"""What flash-attn's test file imports from flash_attn.flash_attn_interface besides the public
functions: the key-block width its test helper normalize_flash_attn_S assumes of S_dmask, and the
ROCm switch."""

from fattn import *  # noqa: F401,F403

USE_TRITON_ROCM = False


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """fattn's S_dmask holds exp(s - m) with m the max of the whole row (python/fattn/_attn_probs.py):
    one block of keys per row, so the width covers every key."""
    return 2**31 - 1
