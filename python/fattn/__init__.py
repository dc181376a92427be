"""fattn: FlashAttention in Triton, compiled ahead of time, served as torch.ops.fattn.*.

Importing fattn loads the prebuilt library (no Triton, no JIT, no compiler) and
registers the fake implementations that torch.compile needs.
"""

from ._library import build_info, library_path, load_library

load_library()

# One module per op family, each holding its public function, its op's fake and autograd.
from .attention import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func  # noqa: E402
from .varlen import (  # noqa: E402
    flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func,
)
from .decode import flash_attn_with_kvcache  # noqa: E402
from .merge import merge_attention_states  # noqa: E402
from . import ring  # noqa: E402
from .ring import ring_flash_attn_func, ring_flash_attn_varlen_func  # noqa: E402
from ._cp_sharding import shard_varlen, unshard_varlen, varlen_shard_layout  # noqa: E402
from .ulysses import ulysses_flash_attn_func, ulysses_flash_attn_varlen_func  # noqa: E402
from .fp8 import quantize_fp8  # noqa: E402

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache",
           "merge_attention_states", "ring_flash_attn_func", "ring_flash_attn_varlen_func", "ring", "shard_varlen", "unshard_varlen",
           "varlen_shard_layout", "ulysses_flash_attn_func", "ulysses_flash_attn_varlen_func", "quantize_fp8",
           "build_info", "library_path"]
__version__ = "0.3.0"  # pyproject.toml's; 0.2: flash_attn_func, 0.3: flash_attn_with_kvcache take flash-attn's positional order
