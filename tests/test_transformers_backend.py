"""fattn as a transformers attention backend (fattn.integrations.transformers), on CPU: tiny
random-weight Llama, Mistral (sliding window), Gemma 2 (softcap + sliding window) and gpt-oss
(sinks + sliding window) models, unpadded and left-padded batches and greedy generation with a
KV cache, against the same model run by transformers' own attention.

The truth is the model in float32 with transformers' eager attention (in float64 it gives NaN on
padded batches); fattn's float32 logits must be within 2x of the error of transformers' sdpa in
float32, plus 1e-5 (where the installed transformers gives the model no sdpa, as for gpt-oss:
within 1e-5)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")  # an optional dependency: CI installs it
import fattn  # noqa: E402
import fattn.integrations.transformers  # noqa: E402,F401  (registers "fattn")
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
