"""Configuration dataclasses: one per concern, each validating itself.

A run is described by a `RunConfig` holding a `ModelConfig`, a `TrainConfig` and a
`DataConfig`. Field names are unique across the three, so every field can be set
from the command line as `--field value` (see `configs.cli`).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ConfigError: defined in utils, which raises it too (the device)
from utils.errors import ConfigError, PicklesWhole, cut, shown
from utils.formats import loads_json
from utils.telemetry import parse_alarm


# Fields of older saved configs -> the fields that replaced them (configs written before Muon's weight decay had
# its own field decayed both optimizers by `weight_decay`); read by RunConfig.from_dict and configs.files.
LEGACY_TRAIN_FIELDS = {"weight_decay": ("muon_weight_decay", "adamw_weight_decay")}

# The largest float32: the optimizer steps scale float32 weights by their rate in every precision (bf16 autocasts the
# forward only), and torch refuses a step scalar beyond it ("value cannot be converted to type float without
# overflow") at the first step. bf16 has float32's exponent range, so no rate that passes fails there either.
FLOAT32_MAX = 3.4028234663852886e38


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _check_kinds(cfg) -> None:
    """Every float field of a config section is a finite number (NaN and infinity pass some range checks), every
    whole-number field a 64-bit one (torch, numpy and the files written hold no larger), every text field text (YAML
    reads `off` as false)."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.type == "float" and isinstance(value, (int, float)) and not math.isfinite(value):
            raise ConfigError(f"{f.name}={value} must be a finite number")
        if f.type == "int" and isinstance(value, int) and not -2 ** 63 <= value < 2 ** 63:
            raise ConfigError(f"{f.name}={shown(value)} is beyond the 64-bit whole numbers a run computes with: give "
                              f"one below 2**63")
        if f.type == "str" and not isinstance(value, str):
            raise ConfigError(f"{f.name}={shown(value)} must be text")


# The values of each text field that has a fixed set. The field's validation checks FIELD_CHOICES and --help lists
# it (configs.help), so the two cannot disagree.
QK_NORM_MODES = ("learned", "frozen", "none")
SCHEDULES = ("constant", "cosine")
ORTHOGONALIZERS = ("polar_express", "newton_schulz")  # optimizers.muon.ORTHOGONALIZERS implements each
PRECISIONS = ("auto", "fp32", "bf16")
COMPILE_MODES = ("auto", "on", "off")
SHARD_MODES = ("none", "fsdp")
SOURCES = ("english", "stdlib", "files", "hub")
OFFLINE_MODES = ("error", "english")
PROBE_PRECISIONS = ("fp32", "bf16")
QK_OPTIMIZERS = ("muon", "adamw")  # which optimizer updates W_q and W_k (optimizers/split.py)
MUON_UPDATE_SCALES = ("none", "match_rms_adamw")  # optimizers.muon.UPDATE_SCALES implements each
ATTN_GATES = ("none", "elementwise", "headwise")  # models.layers.Attention: a sigmoid gate on each head's output
QK_NORM_SCOPES = ("head", "full")  # per-head RMSNorm (Qwen3, Gemma 3) | over the whole q / k projection (OLMo 2)
FIELD_CHOICES = {"qk_norm": QK_NORM_MODES, "schedule": SCHEDULES, "orthogonalizer": ORTHOGONALIZERS,
                 "precision": PRECISIONS, "compile": COMPILE_MODES, "shard": SHARD_MODES, "source": SOURCES,
                 "offline": OFFLINE_MODES, "probe_precision": PROBE_PRECISIONS,
                 "qk_optimizer": QK_OPTIMIZERS, "muon_update_scale": MUON_UPDATE_SCALES,
                 "attn_gate": ATTN_GATES, "qk_norm_scope": QK_NORM_SCOPES}


# Text fields with a syntax of their own, checked by their parser (which names the values in its message, and --help
# in the field's sentence) rather than against a fixed set.
FIELD_PARSERS = {"spike_alarm": parse_alarm}

# Options refused when given twice on one command line (argparse keeps the last silently): those whose second use
# more likely means "also" than "instead". Any other option given twice keeps the last, as every command line does,
# so that a command can be repeated with an option changed at its end.
GIVEN_ONCE = {"spike_alarm": "a run has one alarm; give the one to watch",
              "paths": "every file goes in one --paths, comma-separated (a.txt,b.jsonl,folder)"}


def _check_choices(cfg) -> None:
    """Every field of `cfg` that has a fixed set of values (FIELD_CHOICES) holds one of them."""
    for f in dataclasses.fields(cfg):
        choices = FIELD_CHOICES.get(f.name)
        value = getattr(cfg, f.name)
        _check(choices is None or value in choices,
               f"{f.name}={shown(value)}: choose one of {', '.join(choices or ())}")


@dataclass
class ModelConfig:
    """The transformer. d_head = d_model // n_heads."""

    vocab_size: int = 4096
    n_layers: int = 6
    d_model: int = 128
    n_heads: int = 2
    n_kv_heads: int = 1
    d_ff: int = 512
    max_seq_len: int = 2048  # RoPE tables are built for positions < max_seq_len
    rope_theta: float = 10000.0
    qk_norm: str = "learned"  # learned | frozen | none
    qk_norm_scope: str = "head"  # head: one RMSNorm per head's D-vector | full: over the whole projection (OLMo 2)
    attn_softcap: float = 0.0  # attention logits -> cap * tanh(logit / cap) (Gemma 2); 0: off
    attn_gate: str = "none"  # none | elementwise | headwise: sigmoid gate on each head's output (arXiv 2505.06708)
    norm_eps: float = 1e-6
    init_std: float = 0.02

    def __post_init__(self) -> None:
        _check_kinds(self)
        _check_choices(self)
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
        _check(self.norm_eps > 0, f"norm_eps={self.norm_eps} must be positive (RMSNorm divides by sqrt(mean(x^2) + "
                                  f"eps)), e.g. 1e-6")
        _check(self.init_std > 0, f"init_std={self.init_std} must be positive (the standard deviation of the initial "
                                  f"weights), e.g. 0.02")
        _check(self.attn_softcap >= 0, f"attn_softcap={self.attn_softcap} must be >= 0 (0 disables soft-capping), "
                                       f"e.g. 50")
        _check(self.qk_norm_scope == "head" or self.qk_norm != "none",
               f"qk_norm_scope={self.qk_norm_scope!r} with qk_norm='none': there is no q/k norm to scope; use "
               f"--qk_norm learned or frozen, or leave --qk_norm_scope head")

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

    tokens: int = 1_000_000  # total training tokens; steps = tokens // tokens_per_step
    batch_size: int = 16  # sequences per micro-batch (global, split across ranks)
    grad_accum: int = 1
    muon_lr: float = 0.024
    adamw_lr: float = 0.006
    momentum: float = 0.95
    nesterov: bool = True
    muon_weight_decay: float = 0.0  # the write-ups' Muon decays nothing
    adamw_weight_decay: float = 0.2  # embedding and (with wd_on_gains) the norm gains
    wd_on_gains: bool = True  # the write-ups decay norm gains too; it pulls key norms down
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999  # PyTorch's default, which the write-ups used
    grad_clip: float = 1.0  # 0 disables clipping
    qk_clip: float = 0.0  # QK-clip threshold tau on attention logits (Kimi K2; optimizers/qk_clip.py); 0: off
    z_loss: float = 0.0  # coefficient of mean(logsumexp(logits)^2) added to the objective (PaLM); 0: off
    schedule: str = "constant"  # constant | cosine (warmup then cosine decay)
    warmup_frac: float = 0.0
    min_lr_frac: float = 0.1  # cosine decays to this fraction of the peak
    orthogonalizer: str = "polar_express"  # polar_express | newton_schulz
    ortho_steps: int = 5
    # Optimizer variants (docs/training.md, "Optimizer variants"); the defaults are the recipe above.
    qk_optimizer: str = "muon"  # muon | adamw: the optimizer of every attention W_q and W_k
    qk_lr_multiplier: float = 1.0  # W_q's and W_k's peak learning rate is this times their optimizer's
    muon_update_scale: str = "none"  # none: sqrt(max(1, rows/cols)) | match_rms_adamw: 0.2 sqrt(max(rows, cols))
    eval_every: int = 0  # optimizer steps between validations; 0: only at the end
    eval_batches: int = 4
    log_every: int = 10
    ckpt_every: int = 0  # 0: only at the end
    keep_last: int = 2
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "auto"  # auto | fp32 | bf16 (autocast)
    compile: str = "auto"  # auto | on | off: torch.compile of the model's forward and loss (utils.runtime)
    fused_loss: bool = True  # LM head + cross-entropy in one chunked pass (models/loss.py); false: two steps
    grad_checkpointing: bool = False
    shard: str = "none"  # none: every rank holds the whole model (DDP) | fsdp: FSDP2 shards it (training/sharding.py)
    telemetry: bool = True  # logit_max, key_norm, update_rms on each logged metrics.jsonl line (step_telemetry.py)
    spike_alarm: str = "none"  # SIGNAL[:THRESHOLD] (utils/telemetry.py): a line and a record when it is crossed

    def __post_init__(self) -> None:
        self.compile = {True: "on", False: "off", "true": "on", "false": "off"}.get(self.compile, self.compile)
        _check_kinds(self)
        _check_choices(self)
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
        _check(0 <= self.seed < 2 ** 63, f"seed={self.seed} must be in [0, 2**63)")
        _check(not (self.qk_clip and self.shard == "fsdp"), "--qk_clip does not work with --shard fsdp yet: drop one "
                                                             "of them")
        alarm = FIELD_PARSERS["spike_alarm"](self.spike_alarm)
        _check(alarm is None or self.telemetry or alarm.signal.name == "grad_norm",
               f"spike_alarm={shown(self.spike_alarm)} watches {alarm.signal.name if alarm else ''}, which only the "
               f"telemetry records: drop --telemetry false, or watch grad_norm")


@dataclass
class DataConfig:
    """Where text comes from, how it is tokenized and cut into blocks."""

    source: str = "english"  # english (pinned English text) | stdlib (Python code) | files | hub
    paths: list[str] = field(default_factory=list)  # for source=files: files, folders, glob patterns
    text_field: str = "text"
    hub_dataset: str = "HuggingFaceTB/smollm-corpus"
    hub_subset: str = "cosmopedia-v2"
    hub_docs: int = 200_000  # documents streamed from the hub dataset
    stdlib_max_bytes: int = 20_000_000  # cap on the stdlib corpus: library code first, then test suites
    tokenizer: str = "bpe"  # bpe: byte-level BPE trained on the corpus; a folder, a .gguf file, smollm2-gguf, hub id
    offline: str = "error"  # what source=hub does when the Hub cannot be reached: error | english (see data/offline.py)
    offline_note: str = ""  # set when the run fell back from the Hub to local data: what it asked for, and why
    seq_len: int = 128
    val_frac: float = 0.02
    cache_dir: str = "auto"  # auto: the user cache's data/ folder, wherever the run starts (utils.cache)

    def __post_init__(self) -> None:
        _check_kinds(self)
        _check_choices(self)
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

    probe_every: int = 0  # optimizer steps between probes (and step 0); 0: no probing
    probe_batch: int = 8  # sequences of the fixed evaluation batch (the first validation blocks); docs/probing.md
    probe_precision: str = "fp32"  # fp32 | bf16: precision of the probe's forward pass

    def __post_init__(self) -> None:
        _check_choices(self)
        _check(self.probe_every >= 0, f"probe_every={self.probe_every} must be >= 0 (0 disables probing)")
        _check(self.probe_batch > 0, f"probe_batch={self.probe_batch} must be positive")


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig, "probe": ProbeConfig}
BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def split_list(text: str) -> list[str]:
    """'a,b,,c' -> ['a', 'b', 'c'] (a list field written as text, in a file or on the command line)."""
    return [p for p in text.split(",") if p]


def coerce_value(name: str, hint, value, where: str) -> object:
    """`value` as the field's type, or ConfigError "<where><name>: expected ..., found ..."; YAML reads 1e-3 as
    text, so numbers in text are accepted for float fields (never for whole numbers)."""
    def bad(kind: str):
        return ConfigError(f"{where}{name}: expected {kind}, found {shown(value)}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in BOOL_WORDS:
            return BOOL_WORDS[value.strip().lower()]
        raise bad("true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad("a whole number")
    if hint is float:
        try:
            if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                return float(value)
        except ValueError:
            pass
        raise bad("a number")
    if typing.get_origin(hint) is list:
        if isinstance(value, str):
            return split_list(value)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise bad("a list of strings")
    if isinstance(value, (str, bool)):  # a bool reaches the field's own check (YAML reads `compile: off` as false)
        return value
    raise bad("a string")


class DuplicateKey(PicklesWhole, ValueError):
    """A mapping of a config file that names one key twice (JSON and YAML readers would keep the last)."""

    def __init__(self, key, where: str = ""):
        super().__init__(f"key {shown(key)} appears twice in one mapping{where}: a reader would keep only the last, "
                         f"silently. Fix: keep one of them")


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def parse_json(text: str) -> object:
    """JSON text as Python values, refusing an object that names a key twice (DuplicateKey; json.loads keeps the
    last); the one JSON reader of config files (--config, config.json)."""
    return loads_json(text, object_pairs_hook=_unique_pairs)


@functools.cache
def field_hints() -> dict[str, tuple[str, object]]:
    """{field name: (section, type hint)} of every config field (resolved once: callers only read it)."""
    return {f.name: (section, typing.get_type_hints(cls)[f.name])
            for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}


def section_values(section: str, body, where: str) -> dict[str, object]:
    """The typed values of one section's mapping; ConfigError names the section, the key and the problem, after
    `where` (the file, as "path: ")."""
    if not isinstance(body, dict):
        raise ConfigError(f"{where}section {section!r} must be a mapping of its fields, found {shown(body)}")
    hints = field_hints()
    out: dict[str, object] = {}
    for key, value in body.items():
        if section == "train" and key in LEGACY_TRAIN_FIELDS:  # an old field sets its successors unless given
            for new in LEGACY_TRAIN_FIELDS[key]:
                if new not in body:
                    out[new] = coerce_value(key, float, value, f"{where}[{section}] ")
            continue
        if key not in hints or hints[key][0] != section:
            home = f" (it belongs to section {hints[key][0]!r})" if key in hints else ""
            raise ConfigError(f"{where}unknown key {shown(key)} in section {section!r}{home}; the fields of "
                              f"{section} are: {', '.join(f.name for f in dataclasses.fields(SECTIONS[section]))}")
        out[key] = coerce_value(key, hints[key][1], value, f"{where}[{section}] ")
    return out


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

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "") -> "RunConfig":
        """The config a to_dict() wrote (config.json, a checkpoint's state.json), every value type-checked as a
        --config file's; ConfigError names the section and field after `where` (e.g. "path: ")."""
        if not isinstance(d, dict) or not {"model", "train", "data"} <= set(d):
            found = f"keys {', '.join(map(str, d))}" if isinstance(d, dict) else type(d).__name__
            raise ConfigError(f"{where}not a run config (found {found or 'nothing'}); expected keys model, train, "
                              f"data")
        unknown = sorted(str(k) for k in set(d) - {*SECTIONS, "preset"})
        if unknown:
            raise ConfigError(f"{where}unknown key(s) {cut(', '.join(map(shown, unknown)))}: a run config holds "
                              f"{', '.join(SECTIONS)} and preset")
        preset = d.get("preset", "custom")
        if not isinstance(preset, str):
            raise ConfigError(f"{where}preset: expected a string, found {shown(preset)}")
        values = {s: section_values(s, d.get(s, {}), where) for s in SECTIONS}
        try:
            return cls(**{s: c(**values[s]) for s, c in SECTIONS.items()}, preset=preset)
        except ConfigError as e:  # a value out of its range: the file is named too
            raise ConfigError(f"{where}{e}") from None

    def save(self, path: str | Path) -> None:
        from utils.io import atomic_write_text
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "RunConfig":
        """A saved config.json; ConfigError names the file, the field and the fix."""
        path = Path(path)
        try:
            return cls.from_dict(parse_json(path.read_text()), where=f"{path}: ")
        except ConfigError as e:
            raise ConfigError(f"cannot read config {e}; fix or restore {path.name}") from e
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, DuplicateKey) as e:
            raise ConfigError(f"cannot read config {path}: {cut(str(e))}; fix or restore {path.name}") from e


def flops_per_token(m: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 * (non-embedding matmul params + LM head) + attention.

    Forward matmuls cost 2 FLOPs per weight per token; backward twice that. Attention
    scores and the weighted sum add 2 * 2 * T * d_model per layer forward for full
    (non-causal) attention; causal masking halves the useful work, which we count.
    """
    d, kv = m.d_model, m.n_kv_heads * m.d_head
    per_layer = d * d * 2 + d * kv * 2 + 2 * d * m.d_ff  # wq, wo, wk, wv, up, down
    per_layer += d * {"none": 0, "elementwise": m.n_heads * m.d_head, "headwise": m.n_heads}[m.attn_gate]  # wg
    matmul_params = m.n_layers * per_layer + m.vocab_size * d  # + LM head
    attn = m.n_layers * 2 * seq_len * d  # causal: half of 4*T*d per layer, forward
    return 6 * matmul_params + 3 * attn
