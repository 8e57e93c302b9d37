"""Tiny random models of each supported family and a word-level tokenizer, built locally (no download)."""
from __future__ import annotations

import torch

SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "the sun is hot and the sky is blue",
             "we read a book about the sea", "birds fly over the old town at night"]
PROMPT = "the cat ran over the old park at night and the dog sat on the mat"


def make_tokenizer(out_dir, specials=("[UNK]", "<s>", "</s>"), pad_token=None):
    """A word-level tokenizer of SENTENCES whose first ids are `specials` (in that order)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=list(specials)))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>",
                                   pad_token=pad_token)
    fast.save_pretrained(out_dir)
    return fast


def hf_config(family, **overrides):
    import transformers as tf
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    if family == "llama":
        return tf.LlamaConfig(**common)
    if family == "qwen3":
        return tf.Qwen3Config(**common, head_dim=16)
    if family == "qwen2":
        return tf.Qwen2Config(**common)
    if family == "mistral":
        return tf.MistralConfig(**common, head_dim=16)
    if family == "olmo2":  # q/k norms over the whole projection
        return tf.Olmo2Config(**common)
    if family == "olmo3":  # OLMo 2's norms, sliding windows of 4 on 2 of 3 layers, RoPE per layer type
        return tf.Olmo3Config(**common, sliding_window=4,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    if family == "qwen3_5":  # linear-attention layers 0-2, full attention at 3 (and 7): 8 layers
        return tf.Qwen3_5TextConfig(**{**common, "num_hidden_layers": 8}, head_dim=16, linear_num_value_heads=2,
                                    linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16)
    if family == "smollm3":  # the second layer without RoPE (NoPE)
        return tf.SmolLM3Config(**common, no_rope_layers=[1, 0, 1], bos_token_id=None, eos_token_id=None,
                                pad_token_id=None)
    if family == "gemma3":
        return tf.Gemma3TextConfig(**common, head_dim=16, sliding_window=4, query_pre_attn_scalar=32,
                                   layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    if family == "gemma4":  # sliding heads of 16, full-attention heads of 32 with one KV head and K = V, the last
        # two layers reading layers 2 and 3's keys (KV sharing), per-layer inputs, proportional RoPE on full layers
        return tf.Gemma4TextConfig(**{**common, "num_hidden_layers": 6}, head_dim=16, global_head_dim=32,
                                   num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2,
                                   sliding_window=4, layer_types=["sliding_attention", "full_attention"] * 3,
                                   hidden_size_per_layer_input=8, vocab_size_per_layer_input=300,
                                   final_logit_softcapping=30.0)
    if family == "gpt2":
        return tf.GPT2Config(vocab_size=300, n_embd=64, n_layer=3, n_head=4, n_positions=128)
    if family == "apertus":  # what research/export_hf.py writes for qk_norm learned / frozen
        return tf.ApertusConfig(**common, head_dim=16, hidden_act="relu2", bos_token_id=None, eos_token_id=None,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if family == "arcee":  # ... and for qk_norm none
        return tf.ArceeConfig(**common, head_dim=16, bos_token_id=None, eos_token_id=None)
    if family == "gpt_neox":  # Pythia's settings: a quarter of each head rotated, parallel residual, biases
        return tf.GPTNeoXConfig(vocab_size=300, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                intermediate_size=128, max_position_embeddings=128,
                                **{"rotary_pct": 0.25, "use_parallel_residual": True, **overrides})
    if family == "opt":  # a family no adapter reads
        return tf.OPTConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
                            word_embed_proj_dim=64, max_position_embeddings=128)
    raise ValueError(family)


def make_hf(family, seed=0, **overrides):
    """A tiny random model of `family` in memory, its norm gains moved off their initial values; `overrides`: config
    fields of a GPT-NeoX model (rotary_pct, use_parallel_residual)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(family, **overrides))
    with torch.no_grad():  # random norm gains, so gain statistics and the norms' role are exercised
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or ".ln_" in name):
                p.add_(0.1 * torch.randn_like(p))
    return model


def make_hf_model(family, out_dir, seed=0):
    model = make_hf(family, seed)
    model.save_pretrained(out_dir)
    make_tokenizer(out_dir)
    return out_dir


def make_own_run(out_dir, qk_norm="learned"):
    from configs import get_preset
    from configs.files import save_run_config
    from models.llm import MinimalLLM
    from training.checkpoint import save_checkpoint
    cfg = get_preset("debug")
    cfg.model.vocab_size, cfg.model.n_layers, cfg.model.qk_norm = 300, 3, qk_norm
    cfg.model.n_heads, cfg.model.n_kv_heads, cfg.model.d_model = 4, 2, 64
    torch.manual_seed(0)
    model = MinimalLLM(cfg.model)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_run_config(cfg, out_dir / "config.json")
    save_checkpoint(out_dir / "checkpoints", 3, model, [], {"tokens": 0}, keep_last=1)
    make_tokenizer(out_dir / "tokenizer")
    return out_dir


FAMILIES = ["llama", "qwen3", "gemma3", "gpt2", "gpt_neox", "own"]
