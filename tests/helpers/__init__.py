"""The one place for what the tests share; test modules import from here, never from
one another.

common: devices, random q/k/v, the contract's lse dtype, the accuracy rules;
kvcache: KV caches in every layout and decode's accuracy rule;
library: the stable-ABI contract of a built libfattn.so.
"""

from .common import (
    HAS_GPU, check_accuracy, check_gradients, expected_lse_dtype, grads_of, make_qkv, poison_allocator,
    requires_gpu,
)
from .kvcache import CACHE_LAYOUTS, KVCache, check_outputs, new_tokens, references, run_decode, seqlens_tensor
from .library import check_stable_abi

__all__ = [
    "CACHE_LAYOUTS", "HAS_GPU", "KVCache", "check_accuracy", "check_gradients", "check_outputs", "check_stable_abi",
    "expected_lse_dtype", "grads_of", "make_qkv", "new_tokens", "poison_allocator", "references", "requires_gpu",
    "run_decode", "seqlens_tensor",
]
