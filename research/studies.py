"""The one training path every study shares: arguments, conditions, probing, resume, outputs.

A study is data: a name, the kind of figures it draws, and its conditions as config
overrides. `run_study(study)` parses the command line, trains every condition (per
seed) with the key probe attached, and then draws the figures and the report from the
results files (research/plots), exactly as `split_panels.py` would redraw them.

    runs/<study>/<condition>/results.json          one seed
    runs/<study>/<condition>/seed_<s>/results.json  several seeds

An interrupted study started again resumes: finished conditions are kept (their
folder is resumed, which trains nothing), the running one continues from its newest
checkpoint.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from configs import ConfigError, add_config_args, apply_overrides, get_preset
from configs.cli import overrides_from_args
from research.plots import condition_dir, render_study
from utils.io import atomic_write_text


@dataclass(frozen=True)
class Study:
    name: str  # output folder under research_results/
    kind: str  # which figures and report (research/plots/<kind>.py)
    conditions: dict[str, dict] = field(default_factory=dict)  # condition -> config overrides
    gpu_preset: str = "88m"  # the write-ups' setting, used on CUDA when --preset is auto
    default_tokens: int | None = None  # tokens per condition on the tiny preset (None: the preset's)
    description: str = ""


def build_parser(study: Study) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=study.description, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", help="train every condition once per seed (default: --seed)")
    p.add_argument("--out", help=f"study folder (default research_results/{study.name})")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
    add_config_args(p, default_preset="auto", extra_presets=("auto",),
                    preset_help=f"auto (default): {study.gpu_preset} on CUDA, tiny on CPU; or a named preset")
    return p


def resolve_preset(name: str, device: str, gpu_preset: str) -> str:
    if name != "auto":
        return name
    import torch  # only here: choosing needs to know whether CUDA exists

    wants_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return gpu_preset if wants_cuda else "tiny"


def base_config(study: Study, args: argparse.Namespace):
    overrides = overrides_from_args(args)
    preset = resolve_preset(args.preset, overrides.get("device", "auto"), study.gpu_preset)
    if preset == "tiny" and study.default_tokens and "tokens" not in overrides:
        overrides["tokens"] = study.default_tokens
    cfg = apply_overrides(get_preset(preset), overrides)
    if "probe_every" not in overrides:  # about 20 probes over the run
        cfg = apply_overrides(cfg, {"probe_every": max(1, cfg.steps // 20)})
    return cfg


def train_condition(cfg, run_dir: Path, tag: str, progress: bool) -> None:
    from research.recorder import ProbeRecorder
    from training.trainer import Trainer

    trainer = Trainer(cfg, run_dir, resume=(run_dir / "config.json").exists(), progress=progress, name=tag)
    try:
        trainer.add_callback(ProbeRecorder(trainer, tag=tag))
        trainer.fit()
    finally:
        trainer.close()


def run_study(study: Study, argv: list[str] | None = None) -> Path:
    args = build_parser(study).parse_args(argv)
    try:
        base = base_config(study, args)
    except ConfigError as e:
        sys.exit(f"config error: {e}")
    out = Path(args.out or Path("research_results") / study.name)
    seeds = args.seeds or [base.train.seed]
    from utils.runtime import resolve_device, resolve_precision

    device = resolve_device(base.train.device)
    print(f"{study.name}: preset {base.preset} on {device} ({resolve_precision(base.train.precision, device)}); "
          f"{len(study.conditions)} conditions x {len(seeds)} seed(s) x {base.steps * base.tokens_per_step:,} "
          f"tokens; probe every {base.probe.probe_every} steps; writing {out}", flush=True)

    from data import DataError
    from research.results import ResultsError
    from training.trainer import NonFiniteLossError

    paths: dict[str, list[str]] = {}
    for seed in seeds:
        for cond, overrides in study.conditions.items():
            cfg = apply_overrides(base, {**overrides, "seed": seed})
            run_dir = condition_dir(out, cond, seed, several_seeds=len(seeds) > 1)
            print(f"== {cond} (seed {seed}) -> {run_dir}", flush=True)
            try:
                train_condition(cfg, run_dir, cond, progress=not args.no_progress)
            except (ConfigError, DataError, FileExistsError, NonFiniteLossError, ResultsError) as e:
                sys.exit(f"error in condition {cond}, seed {seed}: {e}\n(finished conditions in {out} are kept; "
                         f"run the same command again to resume)")
            paths.setdefault(cond, []).append(str((run_dir / "results.json").relative_to(out)))

    atomic_write_text(out / "study.json", json.dumps(
        {"study": study.name, "kind": study.kind, "seeds": seeds, "preset": base.preset,
         "conditions": paths}, indent=2) + "\n")
    for path in render_study(out):
        print(f"wrote {path}")
    return out
