"""fattn as a transformers attention backend (fattn.integrations.transformers), on CPU: tiny
random-weight Llama, Mistral (sliding window), Gemma 2 (softcap + sliding window) and gpt-oss
(sinks + sliding window) models, unpadded and left-padded batches, padding-free packed batches
(DataCollatorWithFlattening: documents back to back in one row) and greedy generation with a KV
cache, against the same model run by transformers' own attention.

The truth is the model in float32 with transformers' eager attention (in float64 it gives NaN on
padded batches); fattn's float32 logits must be within 2x of the error of transformers' sdpa in
float32, plus 1e-5 (where the installed transformers gives the model no sdpa, as for gpt-oss:
within 1e-5)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")  # an optional dependency: CI installs it
import fattn  # noqa: E402
import fattn.integrations.transformers as backend  # noqa: E402  (registers "fattn")
from helpers import requires_gpu  # noqa: E402

VOCAB = 97


def _configs():
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return {
        "llama": transformers.LlamaConfig(**common),
        "mistral-window5": transformers.MistralConfig(**common, sliding_window=5),
        "gemma2-softcap-window4": transformers.Gemma2Config(**common, head_dim=16, sliding_window=4,
                                                            attn_logit_softcapping=5.0, query_pre_attn_scalar=16),
        "gpt-oss-sinks-window4": transformers.GptOssConfig(**common, head_dim=16, sliding_window=4,
                                                           num_local_experts=4, num_experts_per_tok=2),
    }


CONFIGS = _configs()


def _model(name):
    """(model, its sdpa peer or None): sdpa support per model varies between transformers versions
    (Gemma 2 has it in 5.17, not in 5.23)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[name], attn_implementation="eager").eval()
    for name_, p in model.named_parameters():
        if name_.endswith("sinks"):  # gpt-oss initialises its sinks at 0: make them matter
            p.data.normal_(0.0, 1.0)
    return model, "sdpa" if getattr(model, "_supports_sdpa", False) else None


def _logits(model, impl, dtype, ids, mask):
    model = model.to(dtype)
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits.double()


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_within_2x_of_transformers_own_attention(name, padded):
    model, peer = _model(name)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, 17), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :6] = 0  # left padding, as for generation
        mask[2, :1] = 0
    truth = _logits(model, "eager", torch.float32, ids, mask)
    got = _logits(model, "fattn", torch.float32, ids, mask)
    valid = mask.bool()
    assert torch.isfinite(truth[valid]).all()
    err = (got - truth)[valid].abs().max().item()
    peer_err = 0.0
    if peer is not None:
        peer_err = (_logits(model, peer, torch.float32, ids, mask) - truth)[valid].abs().max().item()
    assert err <= 2 * peer_err + 1e-5, f"{name}: fattn error {err:.3e}, {peer} error {peer_err:.3e}"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_generation_with_a_cache_matches(name):
    model, _ = _model(name)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, VOCAB, (2, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    outputs = {}
    for impl in ("eager", "fattn"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            outputs[impl] = model.generate(ids, attention_mask=mask, max_new_tokens=6,
                                                             do_sample=False, pad_token_id=0)
    assert torch.equal(outputs["fattn"], outputs["eager"])


def test_attention_weights_are_refused_clearly():
    model, _ = _model("llama")
    model.set_attn_implementation("fattn")
    with pytest.raises(ValueError, match="output_attentions"):
        model(torch.zeros(1, 4, dtype=torch.long), output_attentions=True)


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_training_mode_passes_the_attention_dropout(monkeypatch, padded):
    """A module in training mode hands its attention_dropout to fattn (dense or packed call), whose
    dropout then acts: the same seed reproduces the logits and their gradients run, another seed
    changes them, and eval mode passes 0."""
    config = transformers.LlamaConfig(**{**CONFIGS["llama"].to_dict(), "attention_dropout": 0.5})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="fattn")
    seen = []
    for name in ("flash_attn_func", "flash_attn_varlen_func"):
        real = getattr(fattn, name)

        def recording(*args, _real=real, _name=name, **kwargs):
            seen.append((_name, args[3] if _name == "flash_attn_func" else args[7]))
            return _real(*args, **kwargs)
        monkeypatch.setattr(fattn, name, recording)
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :4] = 0

    def logits(seed):
        torch.manual_seed(seed)
        return model(ids, attention_mask=mask).logits

    model.train()
    first = logits(7)
    assert {p for _, p in seen} == {0.5}
    assert {n for n, _ in seen} == {"flash_attn_varlen_func" if padded else "flash_attn_func"}
    valid = mask.bool()
    assert torch.equal(first[valid], logits(7)[valid])
    assert not torch.allclose(first[valid], logits(8)[valid])
    first[valid].sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    seen.clear()
    model.eval()
    with torch.no_grad():
        evaluated = model(ids, attention_mask=mask).logits
    assert {p for _, p in seen} == {0.0}
    assert not torch.allclose(first[valid], evaluated[valid])


FLASH_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
BOUNDARIES = ["position-ids", "collator-kwargs", "int64-and-0d-kwargs"]


def _packed_batch(lengths, seed, boundaries, device="cpu"):
    """(the documents, DataCollatorWithFlattening's batch of them): one row, position_ids
    restarting at 0 at each document, labels -100 at each document's first token; with
    boundaries other than "position-ids" also cu_seq_lens_q/k and max_length_q/k, as the collator
    gives them (int32 tensors and ints) or as FlashAttentionKwargs types them (LongTensors, and
    0-d tensors as transformers' prepare_fa_kwargs_from_position_ids returns)."""
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(0, VOCAB, (n,), generator=g) for n in lengths]
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=boundaries != "position-ids")
    batch = collator([{"input_ids": d.tolist()} for d in docs])
    if boundaries == "int64-and-0d-kwargs":
        batch.update({n: torch.as_tensor(batch[n], dtype=torch.int64) for n in FLASH_KWARGS})
    return [d.to(device) for d in docs], {n: t.to(device) if torch.is_tensor(t) else t for n, t in batch.items()}


def _forward(model, impl, dtype, **inputs):
    """The model's output without a cache, as in training: with a cache transformers' eager and
    sdpa masks ignore the packing in position_ids."""
    model = model.to(dtype)
    model.set_attn_implementation(impl)
    return model(**inputs, use_cache=False)


def _packed_logits(model, impl, dtype, batch):
    """Logits [tokens, vocab] (float64) of the packed batch."""
    with torch.no_grad():
        return _forward(model, impl, dtype, **{n: t for n, t in batch.items() if n != "labels"}).logits[0].double()


def _alone_logits(model, impl, dtype, docs):
    """Logits [tokens, vocab] (float64) of the documents run one by one, laid back to back."""
    with torch.no_grad():
        return torch.cat([_forward(model, impl, dtype, input_ids=d[None]).logits[0] for d in docs]).double()


@pytest.mark.parametrize("boundaries", BOUNDARIES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_packed_documents_attend_only_within_themselves(monkeypatch, name, boundaries):
    """A padding-free packed batch gives each document the logits it has alone: fattn runs it
    through flash_attn_varlen_func with the documents' boundaries, from the collator's kwargs
    where given (position_ids are then not read on the host), else from position_ids."""
    model, peer = _model(name)
    docs, batch = _packed_batch((5, 9, 4), 4, boundaries)
    seen = []
    with monkeypatch.context() as patch:
        for fn in ("flash_attn_func", "flash_attn_varlen_func"):
            real = getattr(fattn, fn)

            def recording(*args, _real=real, _fn=fn, **kwargs):
                seen.append((_fn, *args[3:7]))
                return _real(*args, **kwargs)
            patch.setattr(fattn, fn, recording)
        if boundaries != "position-ids":
            def unread(*args):
                raise AssertionError("the collator's boundaries were given: position_ids need not be read")
            patch.setattr(backend, "_is_packed_sequence", unread)
        got = _packed_logits(model, "fattn", torch.float32, batch)
    assert len(seen) == CONFIGS[name].num_hidden_layers and {fn for fn, *_ in seen} == {"flash_attn_varlen_func"}
    for _, cu_q, cu_k, max_q, max_k in seen:
        for cu in (cu_q, cu_k):
            assert cu.dtype == torch.int32 and cu.tolist() == [0, 5, 14, 18]
        assert (max_q, max_k) == (9, 9) and type(max_q) is int and type(max_k) is int
    truth = _alone_logits(model, "eager", torch.float32, docs)
    assert torch.isfinite(truth).all()
    peer_err = 0.0
    if peer is not None:
        peer_err = (_alone_logits(model, peer, torch.float32, docs) - truth).abs().max().item()
    tolerance = 2 * peer_err + 1e-5
    err = (got - truth).abs().max().item()
    assert err <= tolerance, f"{name}: packed fattn error {err:.3e}, {peer} error {peer_err:.3e}"
    err = (got - _alone_logits(model, "fattn", torch.float32, docs)).abs().max().item()
    assert err <= tolerance, f"{name}: packed against alone, fattn {err:.3e}, {peer} error {peer_err:.3e}"


def _loss_gradients(model, impl, **inputs):
    """{parameter name: gradient} of the model's loss (training mode, no cache)."""
    model.zero_grad()
    _forward(model, impl, torch.float32, **inputs).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("boundaries", BOUNDARIES[:2])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_packed_training_gradients_are_the_sum_over_documents(name, boundaries):
    """Training on a packed batch: the loss summed over its predicted tokens (num_items_in_batch
    fixes the divisor, so the packed loss is the sum of the documents') back-propagates through
    flash_attn_varlen_func to finite gradients that are the sum of the documents' run alone, within
    2x of sdpa's error against eager's."""
    model, peer = _model(name)
    model.train()  # attention_dropout is 0 in these configs: the gradients are deterministic
    docs, batch = _packed_batch((5, 9, 4), 5, boundaries)
    items = sum(len(d) - 1 for d in docs)
    got = _loss_gradients(model, "fattn", **batch, num_items_in_batch=items)
    assert all(torch.isfinite(g).all() for g in got.values())

    def summed_alone(impl):
        total = {}
        for d in docs:
            for n, g in _loss_gradients(model, impl, input_ids=d[None], labels=d[None],
                                        num_items_in_batch=items).items():
                total[n] = total[n] + g if n in total else g
        return total

    truth = summed_alone("eager")
    assert got.keys() == truth.keys()

    def error(grads):
        return max((grads[n] - truth[n]).abs().max().item() for n in truth)
    peer_err = 0.0 if peer is None else error(summed_alone(peer))
    tolerance = 2 * peer_err + 1e-5
    assert error(got) <= tolerance, f"{name}: packed fattn error {error(got):.3e}, {peer} error {peer_err:.3e}"
    alone = summed_alone("fattn")
    err = max((got[n] - alone[n]).abs().max().item() for n in got)
    assert err <= tolerance, f"{name}: packed against alone, fattn {err:.3e}, {peer} error {peer_err:.3e}"


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_bf16_on_gpu_within_2x_of_transformers_own_attention(name, padded):
    """The same models in bfloat16 on CUDA: fattn against the float32 eager truth, within 2x of
    sdpa's bfloat16 error (eager's for gpt-oss, which has no sdpa)."""
    model, peer = _model(name)
    model = model.cuda()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (3, 40), generator=g).cuda()
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :11] = 0
        mask[2, :1] = 0
    truth = _logits(model, "eager", torch.float32, ids, mask)
    got = _logits(model, "fattn", torch.bfloat16, ids, mask)
    base = _logits(model, peer or "eager", torch.bfloat16, ids, mask)
    valid = mask.bool()
    err = (got - truth)[valid].abs().max().item()
    peer_err = (base - truth)[valid].abs().max().item()
    assert err <= 2 * peer_err + 1e-5, f"{name}: fattn error {err:.3e}, {peer or 'eager'} bf16 error {peer_err:.3e}"


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("boundaries", BOUNDARIES[:2])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_bf16_on_gpu_packed_documents_attend_only_within_themselves(name, boundaries):
    """A packed batch in bfloat16 on CUDA: each document's fattn logits against the float32 eager
    truth of that document alone, within 2x of sdpa's bfloat16 error (eager's for gpt-oss), and
    against fattn's bfloat16 logits of the document alone within the same."""
    model, peer = _model(name)
    model = model.cuda()
    docs, batch = _packed_batch((11, 40, 6), 6, boundaries, device="cuda")
    truth = _alone_logits(model, "eager", torch.float32, docs)
    got = _packed_logits(model, "fattn", torch.bfloat16, batch)
    base = _alone_logits(model, peer or "eager", torch.bfloat16, docs)
    peer_err = (base - truth).abs().max().item()
    tolerance = 2 * peer_err + 1e-5
    err = (got - truth).abs().max().item()
    assert err <= tolerance, f"{name}: packed fattn error {err:.3e}, {peer or 'eager'} bf16 error {peer_err:.3e}"
    err = (got - _alone_logits(model, "fattn", torch.bfloat16, docs)).abs().max().item()
    assert err <= tolerance, (f"{name}: packed against alone, fattn {err:.3e}, "
                              f"{peer or 'eager'} bf16 error {peer_err:.3e}")
