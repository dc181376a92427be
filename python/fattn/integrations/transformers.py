"""fattn as a Hugging Face transformers attention backend.

    import fattn.integrations.transformers  # registers "fattn"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fattn")

Importing this module registers `attention_forward` under "fattn" in transformers'
AttentionInterface, and transformers' own FlashAttention mask function under the same name in
AttentionMaskInterface: the model then hands each layer either no mask (no padding) or the 2D
padding mask [batch, kv_length], never a dense 4D mask. A padded batch runs packed through
flash_attn_varlen_func; sliding windows, softcap and attention sinks (`s_aux`, gpt-oss) are
passed on. transformers is an optional dependency (`pip install fattn[transformers]`).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

import fattn

NAME = "fattn"


def _window(sliding_window: int | None, key_length: int) -> tuple[int, int]:
    """transformers' FlashAttention convention: a layer with sliding_window w sees w - 1 keys back
    (and, with causal, none ahead)."""
    if sliding_window is None or key_length <= sliding_window:
        return -1, -1
    return sliding_window - 1, sliding_window - 1


def _packed(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[batch, seqlen, heads, dim] -> [tokens, heads, dim], the rows where `rows` ([batch * seqlen]
    indices) points."""
    return x.flatten(0, 1).index_select(0, rows)


def _offsets(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(row indices of the valid tokens, cu_seqlens int32 [batch + 1], longest sequence) of a 2D
    padding mask. The longest length is read on the host, as max_seqlen must be an int."""
    lengths = mask.sum(dim=1, dtype=torch.int32)
    cu = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    return mask.flatten().nonzero().squeeze(1), cu, int(lengths.max())


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None,
                      is_causal: bool | None = None, s_aux: torch.Tensor | None = None, **kwargs):
    """transformers' attention-function signature: query [batch, heads, q_len, dim], key/value
    [batch, kv_heads, kv_len, dim]; returns ([batch, q_len, heads, dim], None)."""
    if kwargs.get("output_attentions", False):
        raise ValueError("fattn does not return attention weights (output_attentions=True); use eager")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    is_causal = module.is_causal if is_causal is None else is_causal
    if is_causal and q.shape[1] == 1:
        is_causal = False  # one query token over a cache sees every key: the same, and cheaper to say
    options = dict(softmax_scale=scaling, causal=is_causal, window_size=_window(sliding_window, k.shape[1]),
                   softcap=softcap or 0.0)
    sinks = None if s_aux is None else s_aux.float()
    if attention_mask is None:
        return fattn.flash_attn_func(q, k, v, dropout, sinks=sinks, **options), None
    mask = attention_mask[:, -k.shape[1]:].bool()
    k_rows, cu_k, max_k = _offsets(mask)
    if q.shape[1] == k.shape[1]:  # prefill: the same tokens (and one host read of the longest, not two)
        q_rows, cu_q, max_q = k_rows, cu_k, max_k
    else:  # queries are the last positions (left padding)
        q_rows, cu_q, max_q = _offsets(mask[:, -q.shape[1]:])
    out = fattn.flash_attn_varlen_func(_packed(q, q_rows), _packed(k, k_rows), _packed(v, k_rows), cu_q, cu_k, max_q,
                                       max_k, dropout, sinks=sinks, **options)
    padded = out.new_zeros(q.shape[0] * q.shape[1], *out.shape[1:])
    padded.index_copy_(0, q_rows, out)
    return padded.view(q.shape[0], q.shape[1], *out.shape[1:]), None


def register() -> None:
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)


register()
