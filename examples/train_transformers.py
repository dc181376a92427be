"""A few training steps of a small Llama through fattn's transformers backend, on padding-free
packed batches (transformers' DataCollatorWithFlattening: the documents of a batch back to back in
one row, each attending only to itself).

    python examples/train_transformers.py            # CPU, float32, random weights, a few seconds
    python examples/train_transformers.py --steps 50 --device cuda --dtype bfloat16

Any checkpoint works the same way: AutoModelForCausalLM.from_pretrained(name, attn_implementation="fattn").
"""

import argparse

import torch
import transformers

import fattn.integrations.transformers  # noqa: F401  (registers attn_implementation="fattn")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="fattn")
    model.to(device=args.device, dtype=getattr(torch, args.dtype)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    losses = []
    for step in range(args.steps):
        documents = [{"input_ids": torch.randint(0, 128, (int(n),)).tolist()} for n in torch.randint(5, 40, (4,))]
        batch = {k: v.to(args.device) if isinstance(v, torch.Tensor) else v for k, v in collator(documents).items()}
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        print(f"step {step}: {len(documents)} documents, {batch['input_ids'].shape[1]} tokens, loss {loss.item():.4f}")
    return losses


if __name__ == "__main__":
    main()
