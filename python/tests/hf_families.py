"""The transformers configs of the dense decoder families shardplan reads, written by
transformers' own config classes (no download): tiny ones exercising each family's features
(biases, q/k norms, extra norms, head_dim, sliding windows, soft-capping, tied or untied heads),
and the real sizes with their published hyperparameters."""

import transformers as hf

# The tiny configs' common shape: 2 blocks, hidden 32, 4 heads over 2 key/value heads.
TINY = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)

# Each family's tiny variants: (tag, config class, keyword arguments beyond TINY).
TINY_VARIANTS = [
    ("gpt2", hf.GPT2Config, dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=256,
                                 bos_token_id=0, eos_token_id=0)),
    ("gpt2-untied", hf.GPT2Config, dict(n_embd=32, n_layer=2, n_head=4, n_inner=48,
                                        n_positions=64, vocab_size=256, tie_word_embeddings=False,
                                        bos_token_id=0, eos_token_id=0)),
    ("llama", hf.LlamaConfig, {}),
    ("llama-attention-bias", hf.LlamaConfig, dict(attention_bias=True, tie_word_embeddings=True)),
    ("llama-mlp-bias", hf.LlamaConfig, dict(mlp_bias=True, head_dim=24)),
    ("mistral", hf.MistralConfig, dict(sliding_window=16)),
    ("mistral-head-dim", hf.MistralConfig, dict(head_dim=24, sliding_window=None)),
    ("qwen2", hf.Qwen2Config, {}),
    ("qwen2-window", hf.Qwen2Config, dict(use_sliding_window=True, sliding_window=16,
                                          max_window_layers=1, tie_word_embeddings=True)),
    ("qwen3", hf.Qwen3Config, dict(head_dim=24)),
    ("qwen3-bias", hf.Qwen3Config, dict(attention_bias=True, tie_word_embeddings=True)),
    ("gemma2", hf.Gemma2Config, dict(head_dim=24, sliding_window=16)),
    ("gemma2-bias", hf.Gemma2Config, dict(head_dim=8, attention_bias=True, tie_word_embeddings=False)),
    ("gemma3", hf.Gemma3TextConfig, dict(head_dim=24, sliding_window=16)),
    ("phi3", hf.Phi3Config, {}),
    ("phi3-window", hf.Phi3Config, dict(sliding_window=16)),
    ("olmo2", hf.Olmo2Config, {}),
    ("olmo2-bias", hf.Olmo2Config, dict(attention_bias=True, num_key_value_heads=4)),
]


def tiny(tag):
    """The tiny config `tag` of TINY_VARIANTS."""
    for name, cls, extra in TINY_VARIANTS:
        if name == tag:
            base = {} if cls is hf.GPT2Config else dict(TINY)
            return cls(**{**base, **extra})
    raise KeyError(tag)


def _llama3(**kw):
    return hf.LlamaConfig(vocab_size=128256, max_position_embeddings=8192, num_key_value_heads=8,
                          rope_theta=500000.0, **kw)


# Real sizes: (name, config) with the hyperparameters of each model's published config.json.
REAL = [
    ("GPT-2 medium", lambda: hf.GPT2Config(n_embd=1024, n_layer=24, n_head=16)),
    ("Llama-3-8B", lambda: _llama3(hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=32, num_attention_heads=32)),
    ("Llama-3-70B", lambda: _llama3(hidden_size=8192, intermediate_size=28672,
                                    num_hidden_layers=80, num_attention_heads=64)),
    ("Mistral-7B-v0.1", lambda: hf.MistralConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768,
        sliding_window=4096)),
    ("Qwen2.5-7B", lambda: hf.Qwen2Config(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
        tie_word_embeddings=False)),
    ("Qwen3-8B", lambda: hf.Qwen3Config(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
        tie_word_embeddings=False)),
    ("Gemma-2-9B", lambda: hf.Gemma2Config(
        hidden_size=3584, intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16,
        num_key_value_heads=8, head_dim=256, vocab_size=256000, max_position_embeddings=8192,
        sliding_window=4096, final_logit_softcapping=30.0, attn_logit_softcapping=50.0)),
    ("Gemma-3-12B (text)", lambda: hf.Gemma3TextConfig(
        hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
        num_key_value_heads=8, head_dim=256, vocab_size=262208, max_position_embeddings=131072,
        sliding_window=1024)),
    ("Phi-3-mini-4k", lambda: hf.Phi3Config(
        hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32064, max_position_embeddings=4096,
        sliding_window=2047, pad_token_id=32000, bos_token_id=1, eos_token_id=32000)),
    ("OLMo-2-7B", lambda: hf.Olmo2Config(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=100352, max_position_embeddings=4096,
        pad_token_id=100277, bos_token_id=None, eos_token_id=100257)),
]


def real(name):
    """The real-size config `name` of REAL."""
    return dict(REAL)[name]()


def parameters(config):
    """transformers' own count of `config`'s `*ForCausalLM`, built on the meta device (no memory
    for the weights)."""
    import torch
    with torch.device("meta"):
        model = hf.AutoModelForCausalLM.from_config(config)
    return model.num_parameters()
