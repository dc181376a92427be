"""fattn as a Hugging Face transformers attention backend.

    import fattn.integrations.transformers  # registers "fattn"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fattn")

Importing this module registers `attention_forward` under "fattn" in transformers'
AttentionInterface, and transformers' own FlashAttention mask function under the same name in
AttentionMaskInterface: the model then hands each layer either no mask (no padding) or the 2D
padding mask [batch, kv_length], never a dense 4D mask.

Each call takes the path transformers' own FlashAttention integration
(modeling_flash_attention_utils._flash_attention_forward) takes, in its order:

1. a 2D padding mask: the valid tokens run packed through flash_attn_varlen_func;
2. cu_seq_lens_q/k and max_length_q/k all given (DataCollatorWithFlattening with
   return_flash_attn_kwargs=True): the batch is already packed documents, run through
   flash_attn_varlen_func with those boundaries;
3. a padding-free packed batch (one row whose position_ids restart at each document,
   DataCollatorWithFlattening's default): the boundaries are read off position_ids with
   transformers' own helpers, then as in 2;
4. otherwise one dense flash_attn_func call.

Sliding windows, softcap, attention sinks (`s_aux`, gpt-oss) and dropout are passed on in every
path. transformers is an optional dependency; fattn is not on a package index, so the extra is
installed from the source tree: `pip install ".[transformers]"`.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
from transformers.modeling_flash_attention_utils import _is_packed_sequence, prepare_fa_kwargs_from_position_ids

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
    if attention_mask is not None:
        return _padded_forward(q, k, v, attention_mask, dropout, sinks, options), None
    boundaries = [kwargs.get(n) for n in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")]
    if any(x is None for x in boundaries):
        # Without the collator's boundaries a packed row is known only by its position_ids
        # restarting; this check reads them on the host, as transformers' own does, every layer.
        position_ids = kwargs.get("position_ids")
        if not _is_packed_sequence(position_ids, q.shape[0]):
            return fattn.flash_attn_func(q, k, v, dropout, sinks=sinks, **options), None
        if q.shape[1] != k.shape[1]:  # the boundaries below cover the queries only, not cached keys
            raise ValueError(f"fattn: packed sequences (position_ids restarting within the row) need as many keys "
                             f"as queries, got {k.shape[1]} keys for {q.shape[1]} queries; pass a 2D "
                             f"attention_mask or cu_seq_lens_q/k and max_length_q/k instead")
        (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(position_ids)
    else:
        cu_q, cu_k, max_q, max_k = boundaries
    return _packed_forward(q, k, v, cu_q, cu_k, max_q, max_k, dropout, sinks, options), None


def _padded_forward(q, k, v, attention_mask, dropout, sinks, options):
    """Attention over a padded batch: its valid tokens packed, run through flash_attn_varlen_func
    and scattered back, zeros at the padding."""
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
    return padded.view(q.shape[0], q.shape[1], *out.shape[1:])


def _packed_forward(q, k, v, cu_q, cu_k, max_q, max_k, dropout, sinks, options):
    """Attention over documents laid back to back along the rows of q, k, v ([batch, seqlen, heads,
    dim], every token in a document): document b is tokens [cu[b], cu[b + 1]) of the flattened
    batch. cu_q/cu_k may come as int64 (FlashAttentionKwargs types them LongTensor) or on the host,
    max_q/max_k as 0-d tensors (prepare_fa_kwargs_from_position_ids returns those)."""
    cu_q_in, max_q_in = cu_q, max_q
    cu_q = _cu_seqlens(cu_q, q.device)
    cu_k = cu_q if cu_k is cu_q_in else _cu_seqlens(cu_k, q.device)
    max_q = int(max_q)  # max_seqlen must be an int: a host read of a 0-d tensor, once where q's and k's are one
    max_k = max_q if max_k is max_q_in else int(max_k)
    out = fattn.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, max_q, max_k,
                                       dropout, sinks=sinks, **options)
    return out.view(q.shape[0], q.shape[1], *out.shape[1:])


def _cu_seqlens(cu: torch.Tensor, device: torch.device) -> torch.Tensor:
    """cu_seqlens as fattn's varlen functions take them: int32, contiguous, on q's device (a no-op
    where they already are)."""
    return cu.to(device=device, dtype=torch.int32).contiguous()


def register() -> None:
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)


register()
