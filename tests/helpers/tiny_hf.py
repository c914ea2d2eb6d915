"""Tiny random Hugging Face models saved as local folders (config +
safetensors + a word-level tokenizer), for both backends: llama, qwen2, qwen3
and gemma3 (`ARCHS`, the seam's own tests), and the architecture matrix
(`MATRIX`: sliding windows, soft-capping, logit scaling, mixtures of experts,
learned sink logits)."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 50
BOS, EOS, PAD = 1, 2, 0  # ids of <bos>, <eos>, <pad> in the tiny tokenizer
ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
# Each with what sets it apart switched on at a size where it matters for 12
# tokens: windows of 4 keys, soft-caps near the logits' own scale, granite's
# logits divided by 2, gpt-oss's learned sink logits.
MATRIX = ("llama", "qwen2", "qwen3", "gemma3", "gpt2", "gpt_neox", "mistral", "phi3", "olmo2", "gemma2",
          "granite", "stablelm", "qwen3_moe", "mixtral", "gpt_oss")
WINDOW = 4  # the sliding window of mistral, gemma2 and gpt_oss


def tiny_tokenizer(folder: Path):
    """A word-level tokenizer over "w3" .. "w49" plus <pad>, <bos>, <eos>,
    saved into `folder` and loaded back (so it knows its own path)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<bos>": BOS, "<eos>": EOS, **{f"w{i}": i for i in range(3, VOCAB)}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    tok.save_pretrained(str(folder))
    return AutoTokenizer.from_pretrained(str(folder))


def tiny_config(arch: str, *, n_layers: int = 2, n_heads: int = 4, d_head: int = 8, n_kv: int | None = None):
    """A transformers config of the given architecture, d_model = n_heads * d_head."""
    import transformers as tf

    d_model = n_heads * d_head
    common = dict(vocab_size=VOCAB, hidden_size=d_model, intermediate_size=4 * d_model, num_hidden_layers=n_layers,
                  num_attention_heads=n_heads, num_key_value_heads=n_kv or n_heads, max_position_embeddings=64,
                  bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=False)
    if arch == "llama":
        return tf.LlamaConfig(**common, head_dim=d_head), tf.LlamaForCausalLM
    if arch == "qwen2":
        return tf.Qwen2Config(**common), tf.Qwen2ForCausalLM
    if arch == "qwen3":
        return tf.Qwen3Config(**common, head_dim=d_head), tf.Qwen3ForCausalLM
    if arch == "gemma3":
        cfg = tf.Gemma3TextConfig(**common, head_dim=d_head, query_pre_attn_scalar=d_head, sliding_window=16)
        return cfg, tf.Gemma3ForCausalLM
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if arch == "gpt2":
        return tf.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=d_model, n_layer=n_layers, n_head=n_heads,
                             bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
                             tie_word_embeddings=False), tf.GPT2LMHeadModel
    if arch == "gpt_neox":  # rotary on a quarter of each head, parallel residual
        common.pop("num_key_value_heads")
        return tf.GPTNeoXConfig(**common), tf.GPTNeoXForCausalLM
    if arch == "mistral":
        return tf.MistralConfig(**common, head_dim=d_head, sliding_window=WINDOW), tf.MistralForCausalLM
    if arch == "phi3":
        return tf.Phi3Config(**common, rope_parameters=rope), tf.Phi3ForCausalLM
    if arch == "olmo2":
        return tf.Olmo2Config(**common, rope_parameters=rope), tf.Olmo2ForCausalLM
    if arch == "gemma2":  # both soft-caps near the scores' and logits' own scale, windows on alternate layers
        return tf.Gemma2Config(**common, head_dim=d_head, query_pre_attn_scalar=d_head, sliding_window=WINDOW,
                               final_logit_softcapping=2.0, attn_logit_softcapping=1.0), tf.Gemma2ForCausalLM
    if arch == "granite":  # logits divided by 2, scaled embeddings, residual and attention
        return tf.GraniteConfig(**common, rope_parameters=rope, logits_scaling=2.0, embedding_multiplier=2.0,
                                residual_multiplier=0.5, attention_multiplier=1.0 / d_head), tf.GraniteForCausalLM
    if arch == "stablelm":
        return tf.StableLmConfig(**common, rope_parameters={**rope, "partial_rotary_factor": 0.25},
                                 use_qkv_bias=True), tf.StableLmForCausalLM
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(**common, head_dim=d_head, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=2 * d_model), tf.Qwen3MoeForCausalLM
    if arch == "mixtral":
        return tf.MixtralConfig(**common, head_dim=d_head, num_local_experts=4, num_experts_per_tok=2), \
            tf.MixtralForCausalLM
    if arch == "gpt_oss":  # learned per-head sink logits in the softmax, windows on alternate layers
        return tf.GptOssConfig(**common, head_dim=d_head, num_local_experts=4, num_experts_per_tok=2,
                               sliding_window=WINDOW, rope_parameters=rope), tf.GptOssForCausalLM
    raise ValueError(f"unknown tiny architecture {arch!r}; one of {MATRIX}")


def save_tiny(folder: Path, arch: str = "llama", seed: int = 0, **dims) -> Path:
    """Build a random model of `arch` (weights from `seed`) and save it with its tokenizer."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg, cls = tiny_config(arch, **dims)
    cfg.architectures = [cls.__name__]
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    # TransformerLens' own initialisation scale (0.8 / sqrt(d_model)), not
    # transformers' 0.02: attention far from uniform, as in the HookedTransformer tiny model.
    std = 0.8 / cfg.hidden_size ** 0.5
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, std)
            elif p.ndim == 3:  # experts stacked [expert, d_in, d_out]
                p.normal_(0.0, 0.8 / p.shape[1] ** 0.5)
            elif name.endswith(".sinks"):
                # learned sink logits of the order of the attention scores, so
                # they take a visible share of each row (not transformers' 0.02)
                p.normal_(1.0, 1.0)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # tests read stderr: no "Writing model shards" bar
    model.save_pretrained(str(folder), safe_serialization=True)
    tiny_tokenizer(folder)
    return folder


def eager_reference(folder: Path, tokens: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """transformers' own eager attention patterns (one [batch head q k] per layer)
    and log-probabilities [batch pos vocab] for `tokens`."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        out = hf(tokens, output_attentions=True)
    return list(out.attentions), torch.log_softmax(out.logits.float(), -1)
