"""The examples in examples/ run on CPU as written, and do what they say: training steps through the
transformers backend on packed documents, greedy generation over a paged KV cache (the tokens
equal those of the whole sequence recomputed without a cache), and ring attention under torchrun
(gloo) matching attention of the whole sequence."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fattn

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_steps_through_the_transformers_backend():
    pytest.importorskip("transformers")
    losses = _load("train_transformers").main(["--steps", "3"])
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))


def test_paged_generation_equals_the_whole_sequence_recomputed():
    example = _load("generate_paged")
    prompts, generated, model = example.main(["--new-tokens", "6"])
    sequence = torch.cat([prompts, generated], 1)
    with torch.no_grad():  # every position at once, dense causal attention, no cache
        batch, length = sequence.shape
        q, k, v = model.qkv(model.embed(sequence)).split(
            [example.HEADS * example.HEAD_DIM, example.KV_HEADS * example.HEAD_DIM, example.KV_HEADS * example.HEAD_DIM], -1)
        out = fattn.flash_attn_func(q.view(batch, length, example.HEADS, -1), k.view(batch, length, example.KV_HEADS, -1),
                                    v.view(batch, length, example.KV_HEADS, -1), causal=True)
        greedy = model.head(out.flatten(2)).argmax(-1)
    start = prompts.shape[1] - 1
    assert torch.equal(greedy[:, start:start + generated.shape[1]], generated)


def test_ring_attention_under_torchrun_with_gloo():
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             str(EXAMPLES / "ring_attention.py"), "--tokens-per-rank", "48"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.count("out and gradients match") == 2, result.stdout
