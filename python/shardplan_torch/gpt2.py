"""GPT-2 in transformers as shardplan's GPT-2 workload trains it: the `GPT2Config` of a zoo
model table (gelu_new, no dropout, tied embeddings, LayerNorm eps 1e-5), the AdamW that
`shardplan run` applies (weight decay on tensors of two or more dimensions only), the batches
`shardplan run --data` cuts from a byte file, and the reference training run on them.

`python -m shardplan_torch.gpt2 --model models/gpt2-tiny.toml --steps 3 --out DIR` writes a
reference for checks on machines without torch (scripts/gpu-check): `init.safetensors` (a
random-initialized `GPT2LMHeadModel`, seed 0), `data.txt`, `losses.json` (transformers' loss
before each step) and `trained.safetensors` (the weights after the steps)."""

import argparse
import json
import pathlib
import tomllib

import torch


def config(spec):
    """The `GPT2Config` of a parsed zoo model file (models/gpt2-*.toml)."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=spec["vocab"], n_positions=spec["seq_len"], n_embd=spec["hidden"],
        n_layer=spec["layers"], n_head=spec["heads"], n_inner=spec["ffn"],
        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        layer_norm_epsilon=1e-5, tie_word_embeddings=True, bos_token_id=None, eos_token_id=None)


def adamw(model, training):
    """`torch.optim.AdamW` with the model file's `[training]` settings and shardplan's defaults."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": training.get("weight_decay", 0.1)},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=training["learning_rate"], betas=tuple(training.get("betas", (0.9, 0.95))),
        eps=training.get("eps", 1e-8))


def batches(data, seq, batch, steps):
    """What `shardplan run --data` feeds: sequence n starts at (n mod W)·seq, W = (len−1)//seq."""
    windows = (len(data) - 1) // seq
    out = []
    for k in range(steps):
        rows = [(((k * batch + j) % windows) * seq) for j in range(batch)]
        x = torch.tensor([list(data[s:s + seq]) for s in rows])
        y = torch.tensor([list(data[s + 1:s + seq + 1]) for s in rows])
        out.append((x, y))
    return out


def train(model, spec, data, steps):
    """Trains `model` `steps` AdamW steps on `data`'s batches: K = `[training] micro_batches`
    forward and backward passes per step, micro-batch m of step k on batch k·K + m, each loss
    divided by K before its backward (gradients average over the step's K·B sequences); the
    mean loss of each step's micro-batches."""
    t = spec["training"]
    k = t.get("micro_batches", 1)
    opt = adamw(model, t)
    losses = []
    micro = batches(data, spec["seq_len"], t["batch_size"], steps * k)
    for step in range(steps):
        opt.zero_grad()
        total = 0.0
        for x, y in micro[step * k:(step + 1) * k]:
            logits = model(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            total += loss.item()
            (loss / k).backward()
        losses.append(total / k)
        opt.step()
    return losses


def write_reference(model_file, steps, data, out):
    """The reference files the module doc names, in directory `out`."""
    from safetensors.torch import save_file
    from transformers import GPT2LMHeadModel

    spec = tomllib.loads(pathlib.Path(model_file).read_text())
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config(spec)).float()
    model.save_pretrained(out / "init", safe_serialization=True)
    (out / "init.safetensors").write_bytes((out / "init" / "model.safetensors").read_bytes())
    (out / "data.txt").write_bytes(data)
    losses = train(model, spec, data, steps)
    (out / "losses.json").write_text(json.dumps(losses))
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    state.pop("lm_head.weight")  # tied to transformer.wte.weight, as save_pretrained writes it
    save_file(state, out / "trained.safetensors", metadata={"format": "pt"})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--data", help="a text file (default: README.md and every byte value)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    root = pathlib.Path(__file__).resolve().parents[2]
    data = pathlib.Path(args.data).read_bytes() if args.data else sample_text(root)
    write_reference(args.model, args.steps, data, args.out)


def sample_text(root):
    """Deterministic bytes with structure (so the loss falls) and every byte value."""
    return (root / "README.md").read_bytes() + bytes(range(256))


if __name__ == "__main__":
    main()
