"""flash-attn's public names bound straight to fattn's functions, for running flash-attn's own test
file (tests/test_flash_attn.py of flash-attn 2.8) against fattn: no adapter between the test and
fattn's public API. scripts/flash_attn_upstream/README.md says how to run it."""

from fattn import (  # noqa: F401
    flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache,
)

__version__ = "2.8-on-fattn"
