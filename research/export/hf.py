"""Export a run folder of this project as a Hugging Face folder that a built-in transformers class loads.

    info = export_run(run_dir, out_dir)                      # research/export_hf.py is the command line
    model = AutoModelForCausalLM.from_pretrained(out_dir)     # no trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(out_dir)

qk_norm learned or frozen exports as ApertusForCausalLM (this model op for op), none as ArceeForCausalLM; the
variants neither expresses are refused before anything is written (`inexpressible` says why); attn_scale and qk_mult
fold into the q norm's gain. The input embedding is folded with sqrt(d_model) and the export is untied; whatever the
classes default otherwise is set explicitly. Why each choice: docs/export.md.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from configs.config import ConfigError, ModelConfig, RunConfig
from configs.files import load_run_config
from models.llm import MinimalLLM
from research.access.checkpoints import EXPORT_INFO
from training.memory_fit import check_fits
from training.checkpoint import (Checkpoint, CheckpointError, list_checkpoints, load_model_weights,
                                 load_newest_weights, read_state)
from utils.errors import UserError
from utils.io import check_links
from utils.owners import MODEL_KIND, refuse_foreign
from utils.run_names import CONFIG, RUN_FILES, is_own_run

WEIGHTS_FILE = "model.safetensors"
MODEL_FILES = ("config.json", "generation_config.json", WEIGHTS_FILE, EXPORT_INFO)


class ExportError(UserError, RuntimeError):
    """A run folder that cannot be exported, or an output folder that must not be written; the message says why."""


@dataclass(frozen=True)
class Target:
    """A built-in transformers class and where its layers keep what our blocks keep."""

    architecture: str
    config_class: str
    layer_names: dict[str, str]  # our blocks.{i}.<name>.weight -> model.layers.{i}.<name>.weight


_SHARED = {"attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj", "attn.wv": "self_attn.v_proj",
           "attn.wo": "self_attn.o_proj", "ffn.up": "mlp.up_proj", "ffn.down": "mlp.down_proj"}
APERTUS = Target("ApertusForCausalLM", "ApertusConfig", {
    **_SHARED, "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm",
    "attn_norm": "attention_layernorm", "ffn_norm": "feedforward_layernorm"})
ARCEE = Target("ArceeForCausalLM", "ArceeConfig", {
    **_SHARED, "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"})
TARGETS = {"learned": APERTUS, "frozen": APERTUS, "none": ARCEE}

_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)\.weight$")


def inexpressible(cfg: ModelConfig) -> str | None:
    """Why the targets cannot represent this model (the attention variants Apertus and Arcee lack), in one line;
    None where they can. z_loss is training-only: the trained model is the same architecture.

    The built-in classes that have the variants differ elsewhere: Gemma 2 / 3 (attn_logit_softcapping) have
    sandwich norms, a gated MLP and (1 + weight) norm gains; OLMo 2 (q/k norms over the whole projection) has
    post-norm blocks and a gated MLP; none of those with gated attention has the relu2 MLP."""
    problems = []
    if cfg.attn_softcap:
        problems.append(f"attn_softcap={cfg.attn_softcap:g}: the Hugging Face export cannot express attention-logit "
                        f"soft-capping (Apertus and Arcee have no attn_logit_softcapping)")
    if cfg.attn_gate != "none":
        problems.append(f"attn_gate={cfg.attn_gate}: the Hugging Face export cannot express gated attention (Apertus "
                        f"and Arcee have no gate on the heads' outputs)")
    if cfg.rope_fraction != 1:
        problems.append(f"rope_fraction={cfg.rope_fraction:g}: the Hugging Face export cannot express rotating only "
                        f"the highest-frequency pairs (Apertus and Arcee rotate every pair)")
    if cfg.qk_gain_shape != "shared":
        problems.append(f"qk_gain_shape={cfg.qk_gain_shape}: the Hugging Face export cannot express a q/k norm gain "
                        f"per head (Apertus's q_norm and k_norm have one gain of head_dim shared by the heads)")
    if cfg.qk_norm_scope != "head":
        problems.append(f"qk_norm_scope={cfg.qk_norm_scope}: the Hugging Face export cannot express q/k norms over "
                        f"the whole projection (Apertus normalizes each head)")
    if not problems:
        return None
    return "; ".join(problems) + ("; export a run trained without this variant" if len(problems) == 1 else
                                  "; export a run trained without these variants")


def hf_state_dict(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The target's tensors from MinimalLLM's state dict; every tensor of ours is placed exactly once."""
    table = TARGETS[cfg.qk_norm].layer_names
    embed = weights["embed.weight"]
    out = {"model.embed_tokens.weight": embed * math.sqrt(cfg.d_model),  # the same product MinimalLLM.hidden takes
           "lm_head.weight": embed.contiguous(), "model.norm.weight": weights["final_norm.weight"].contiguous()}
    for name, w in weights.items():
        if name in ("embed.weight", "final_norm.weight"):
            continue
        m = _BLOCK.match(name)
        if m is None or m.group(2) not in table:
            raise ExportError(f"no place for {name!r} in {TARGETS[cfg.qk_norm].architecture}: the model code "
                              f"changed since this exporter was written (research/export/hf.py)")
        out[f"model.layers.{m.group(1)}.{table[m.group(2)]}.weight"] = w.contiguous()
    factor = cfg.logit_scale * math.sqrt(cfg.d_head)  # attn_scale and qk_mult against the targets' 1/sqrt(head_dim)
    if factor != 1:  # logits are bilinear in the q norm's gain (in W_q without a q norm): folded in there, exactly
        where = "attn.q_norm" if cfg.qk_norm != "none" else "attn.wq"
        for i in range(cfg.n_layers):
            key = f"model.layers.{i}.{table[where]}.weight"
            out[key] = (out[key].double() * factor).to(out[key].dtype)
    return out


def hf_config(cfg: ModelConfig, special_ids: dict[str, int | None], dtype: torch.dtype):
    """The target's config with every field that differs from its defaults set from the run."""
    import transformers
    target = TARGETS[cfg.qk_norm]
    return getattr(transformers, target.config_class)(
        architectures=[target.architecture], vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, hidden_act="relu2", rms_norm_eps=cfg.norm_eps,
        max_position_embeddings=cfg.max_seq_len, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
        dtype=str(dtype).removeprefix("torch."), **special_ids)


# ----------------------------------------------------------------------------------------------
# Reading the run folder

def _load_step(run_dir: Path, model: MinimalLLM, step: int) -> Checkpoint:
    """The checkpoint of `step` loaded into model, or an ExportError listing the steps the run holds."""
    ckpts = list_checkpoints(run_dir / "checkpoints")
    ckpt = next((c for c in ckpts if c.step == step), None)
    if ckpt is None:
        held = ", ".join(str(c.step) for c in ckpts) or "none"
        raise ExportError(f"{run_dir} has no complete checkpoint of step {step} (steps held: {held}): pass one of "
                          f"them to --step, or leave --step out for the newest")
    try:
        load_model_weights(ckpt.path, model)
    except CheckpointError as e:
        raise ExportError(f"checkpoint {ckpt.path} cannot be read ({e}): restore it from a copy, or export another "
                          f"--step") from e
    return ckpt


def load_native(run_dir: Path, step: int | None = None) -> tuple[RunConfig, Checkpoint, dict[str, torch.Tensor]]:
    """(config, checkpoint, MinimalLLM state dict) of a run folder, or an ExportError naming the problem. The
    checkpoint is that of `step`, or the newest that reads back when step is None."""
    if not run_dir.is_dir():
        raise ExportError(f"run folder {run_dir} not found")
    check_links(run_dir, "export another run", ExportError)
    if not (run_dir / "config.json").is_file():
        raise ExportError(f"{run_dir} has no config.json: expected a folder written by train_llm.py or a study "
                          f"condition (research_results/<study>/<condition>[/seed_<s>])")
    try:
        cfg = load_run_config(run_dir / "config.json")
    except (ConfigError, RuntimeError) as e:
        raise ExportError(str(e)) from e
    why = inexpressible(cfg.model)
    if why:
        raise ExportError(f"{run_dir}: {why}")
    check_fits(cfg)  # the model is built in this machine's memory: refused with the numbers when it cannot be
    model = MinimalLLM(cfg.model)
    if step is not None:
        ckpt = _load_step(run_dir, model, step)
        ckpt.state = read_state(ckpt)
        return cfg, ckpt, {k: v.detach() for k, v in model.state_dict().items()}
    # the newest checkpoint whose weights read back (a damaged newer one is named and skipped)
    ckpt, failed = load_newest_weights(run_dir / "checkpoints", model)
    if ckpt is None:
        why = "; ".join(f"{c.path.name}: {reason}" for c, reason in failed)
        raise ExportError(f"{run_dir} has no checkpoint that reads back under {run_dir / 'checkpoints'} "
                          + (f"({why})" if failed else "(a run writes one at its last step; an interrupted run may "
                                                       "have none yet)"))
    for c, reason in failed:
        print(f"export: skipped {c.path.name} ({reason}); exporting {ckpt.path.name}", file=sys.stderr)
    ckpt.state = read_state(ckpt)
    return cfg, ckpt, {k: v.detach() for k, v in model.state_dict().items()}


def special_token_ids(tok_dir: Path) -> dict[str, int | None]:
    """bos/eos/pad ids of the run's tokenizer (None where it has no such token)."""
    if not tok_dir.is_dir():
        raise ExportError(f"{tok_dir.parent} has no tokenizer/ folder to export with the model")
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(str(tok_dir))
    except Exception as e:  # noqa: BLE001 - tokenizer loading raises many types
        raise ExportError(f"AutoTokenizer cannot load {tok_dir} ({type(e).__name__}: {e})") from e
    return {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}


# ----------------------------------------------------------------------------------------------
# Writing the export

def _is_run(folder: Path) -> bool:
    """A folder holding a run's files. Its config.json alone counts only where it is a run's config (with sections
    model, train, data): other model folders have a config.json too, and --force may replace theirs."""
    if not folder.is_dir() or (folder / EXPORT_INFO).is_file():
        return False
    return any((folder / name).exists() for name in RUN_FILES if name != CONFIG) or is_own_run(folder)


def _run_part(out_dir: Path) -> Path | None:
    """The run folder whose own files `out_dir` is or lies among (a run folder, its checkpoints/, tokenizer/, ...);
    None when it is none of them."""
    out = out_dir.resolve()
    if _is_run(out):
        return out
    for part in (out, *out.parents):
        if part.name in RUN_FILES and _is_run(part.parent):
            return part.parent
    return None


def check_out_dir(out_dir: Path, run_dir: Path, force: bool) -> None:
    """Refuse an output that is a file, that is or lies inside a run folder's own files (no --force reaches into
    a run), that belongs to another owner (a study's, a redraw's, an inspection's: utils.owners; no --force
    either), or that is not empty without --force."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"output {out_dir} is a file, not a folder")
    check_links(out_dir, "choose another output folder", ExportError)
    run = _run_part(out_dir)
    if out_dir.resolve() == run_dir.resolve() or run is not None:
        where = "is the run folder itself" if out_dir.resolve() == run_dir.resolve() else (
            "is a run folder" if run == out_dir.resolve() else f"lies inside the run folder {run}")
        raise ExportError(f"output {out_dir} {where}: an export never writes into a run's files, even with "
                          f"--force; choose another folder (e.g. {run_dir.resolve().parent / (run_dir.name + '-hf')})")
    refuse_foreign(out_dir, "export", "export_hf.py", fix="choose another output folder", accept=(MODEL_KIND,))
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ExportError(f"output folder {out_dir} is not empty: choose another, or pass --force to write into "
                          f"it (files of the same names are replaced, other files are kept)")


def _write(tmp: Path, run_dir: Path, cfg: RunConfig, ckpt: Checkpoint, weights: dict[str, torch.Tensor],
           special: dict[str, int | None]) -> dict:
    """The export's files into tmp; returns export.json's dict."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig
    for f in (run_dir / "tokenizer").iterdir():
        if f.name in MODEL_FILES or f.is_symlink() or not f.is_file():
            raise ExportError(f"tokenizer file {f} would collide with the model's files, or is a link or not a plain "
                              f"file (an export holds only the run's own files): restore the run's tokenizer/ folder")
        shutil.copy2(f, tmp / f.name)
    hf = hf_config(cfg.model, special, weights["embed.weight"].dtype)
    hf.save_pretrained(str(tmp))
    GenerationConfig(**special).save_pretrained(str(tmp))
    save_file(hf_state_dict(cfg.model, weights), str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    target = TARGETS[cfg.model.qk_norm]
    info = {"source": str(run_dir.resolve()), "checkpoint": ckpt.path.name, "step": ckpt.step,
            "tokens": ckpt.state.get("tokens"), "qk_norm": cfg.model.qk_norm, "architecture": target.architecture,
            "embedding_scale_folded": math.sqrt(cfg.model.d_model), "tie_word_embeddings": False}
    (tmp / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return info


def export_run(run_dir: str | Path, out_dir: str | Path, force: bool = False, step: int | None = None) -> dict:
    """Write the checkpoint of `step` of run_dir (the newest when None), its tokenizer and export.json to out_dir;
    returns export.json's dict.

    Everything is written to a temporary folder beside out_dir first and moved in when complete, so a
    failure while writing leaves out_dir as it was; with force, files named like ours are replaced and others kept.
    """
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    check_out_dir(out_dir, run_dir, force)
    cfg, ckpt, weights = load_native(run_dir, step)
    special = special_token_ids(run_dir / "tokenizer")
    tmp = None
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".tmp-{out_dir.name}-"))
        info = _write(tmp, run_dir, cfg, ckpt, weights, special)
        out_dir.mkdir(exist_ok=True)
        for f in tmp.iterdir():
            os.replace(f, out_dir / f.name)
    except OSError as e:
        raise ExportError(f"cannot write {out_dir}: {e}") from e
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return info
