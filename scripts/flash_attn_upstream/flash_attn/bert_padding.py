"""pad_input and unpad_input as flash-attn's test file uses them (flash_attn.bert_padding): between a
padded batch [batch, seqlen, ...] and the packed rows of the tokens its mask keeps."""

import torch
import torch.nn.functional as F


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """(packed rows, their indices in the flattened batch, cu_seqlens int32 [batch + 1], longest
    sequence (an int), the lengths int32 [batch]). unused_mask marks tokens that are packed but
    count in no sequence's length."""
    all_mask = attention_mask if unused_mask is None else attention_mask | unused_mask
    lengths = all_mask.sum(-1, dtype=torch.int32)
    used = attention_mask.sum(-1, dtype=torch.int32)
    indices = all_mask.flatten().nonzero().flatten()
    cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    return hidden_states.flatten(0, 1)[indices], indices, cu_seqlens, int(lengths.max()), used


def pad_input(hidden_states, indices, batch, seqlen):
    """The packed rows back in a zero-padded [batch, seqlen, ...] (differentiable)."""
    padded = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    return padded.index_copy(0, indices, hidden_states).view(batch, seqlen, *hidden_states.shape[1:])
