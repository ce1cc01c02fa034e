"""GPT-2 in transformers as shardplan's GPT-2 workload trains it: the `GPT2Config` of a zoo
model table (gelu_new, no dropout, tied embeddings, LayerNorm eps 1e-5) and the AdamW that
`shardplan run` applies (weight decay on tensors of two or more dimensions only)."""

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
