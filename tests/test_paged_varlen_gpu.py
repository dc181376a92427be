"""flash_attn_varlen_func with block_table on a GPU (skipped without one): packed query
sequences over a paged cache, each against its own float64 attention by the 2x rule."""

import pytest
import torch

from helpers import check_paged_varlen, requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]


@pytest.mark.parametrize("page_size", [16, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lens_q,lens_k,causal,window", [
    ([1, 17, 128, 0, 3], [1000, 17, 3000, 5, 300], True, (-1, -1)),
    ([1000, 40], [1000, 5000], True, (256, 0)),
    ([33, 2], [700, 2], False, (-1, -1)),
])
def test_paged_varlen(lens_q, lens_k, causal, window, dtype, page_size):
    check_paged_varlen(lens_q, lens_k, 16, 4, 128, page_size, dtype, "cuda", causal=causal, window_size=window)


def test_paged_varlen_head_dim_80_mqa_softcap():
    check_paged_varlen([64, 300], [4000, 300], 8, 1, 80, 16, torch.bfloat16, "cuda", causal=True, softcap=20.0)
