"""The one training path every study shares: arguments, conditions, probing, resume, outputs.

`run_study(study)` parses the command line, builds the runs (`study_runs`: condition x seed x learning rate, each
with its config and folder), hands them with the study's train function (`train_study_run`) to
research.studies.executors, then writes study.json and draws the figures and the report (research.studies.render).

    research_results/<study>/<condition>/results.json          one seed
    research_results/<study>/<condition>/seed_<s>/results.json  several seeds

Resume, locks, rounds of --until_decided, the executors: docs/studies.md, "Running a study" and what follows it.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import math
import os
import textwrap
import time
from pathlib import Path

import torch

from configs import PRESETS, ConfigError, RunConfig, add_config_args, apply_overrides, get_preset
from configs.cli import help_flag, parse_once, shown_value, start_from_args, start_in
from configs.measured import check_measured
from research.analysis.conditions import primary_needs
from research.analysis.rules import LOSS_MARGIN, MARGIN, check_margin
from research.probing.callback import run_callbacks
from research.results import diverged_at, mark_diverged
from research.results.layout import add_study_times, condition_dir, read_study_index, write_study_index
from research.results.vocabulary import RESULTS_FILE
from research.studies.catalog import Study
from research.analysis.sequential import family_record, plan
from research.studies.executors import ExecuteOptions, add_ray_args, check_ray_options, execute
from research.studies.hosts import add_hosts_args, check_hosts, study_threads
from research.studies.kinds import KINDS
from research.studies.looks import Rounds, Until, add_until_args, check_until, rounds_text, run_looks
from research.studies.recorded import check_recorded_runs, check_study_folder
from research.studies.render import render_study
from research.studies.study_runs import StudyError, StudyRun
from training.callbacks import AfterCheckpoint
from training.errors import NonFiniteLossError
from training.memory import needed_bytes, plan_memory
from training.memory_fit import check_fits, plan_target, plan_text
from training.run import train_run
from training.run_files import RunFolder
from training.tracking import LOGGERS, check_logger
from utils.cli import ArgumentParser, once, positive_int, positive_number
from utils.errors import Interrupted, explain
from utils.lock import FolderLock
from utils.runtime import Runtime, resolve_runtime, this_host_kind
from utils.threads import thread_choice
from utils.time_split import add_records, is_record, split_line


def resolve_preset(name: str, device: str, gpu_preset: str, fixed: str | None = None) -> str:
    """'auto': the study file's preset (`fixed`) where it names one, else the study's write-up preset on CUDA, tiny
    on CPU; any other name as it is."""
    if name != "auto":
        return name
    if fixed:
        return fixed
    wants_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return gpu_preset if wants_cuda else "tiny"


def base_config(study: Study, preset: str, overrides: dict) -> RunConfig:
    """The preset with the study's defaults (its tiny settings, ~20 probes per run; a study file's shared fields on
    any preset) and the overrides (the --config file's values and the command line's)."""
    overrides = {**study.shared, **overrides}
    if preset == "tiny":
        defaults = {**study.tiny_overrides, **({"tokens": study.default_tokens} if study.default_tokens else {})}
        overrides = {**defaults, **overrides}
    if overrides.get("probe_every") == 0:
        raise ConfigError("probe_every=0: a study probes its runs; give a positive --probe_every or leave it out "
                          f"(default: steps // {study.probes_per_run})")
    cfg = apply_overrides(get_preset(preset), overrides)
    if "probe_every" not in overrides:
        cfg = apply_overrides(cfg, {"probe_every": max(1, cfg.steps // study.probes_per_run)})
    return cfg


def describe_study(study: Study) -> str:
    """The part of a study's --help made from its catalog entry: its conditions, run folders and outputs."""
    def overrides(o: dict) -> str:
        return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in o.items())
    several = len(study.default_seeds) > 1
    example = condition_dir(Path(), study.runs()[0][0], study.default_seeds[0], several_seeds=several)
    grid = " at each --lr_multipliers rate" if study.lr_multipliers else ""
    runs = (f"Conditions ({len(study.conditions)}, as config overrides): "
            + "; ".join(f"{c} ({overrides(o)})" for c, o in study.conditions.items())
            + f". Each is trained{grid} once per seed, in its own run folder under --out (default "
              f"research_results/{study.name}), e.g. {example.as_posix()}/ with its {RESULTS_FILE}.")
    outputs = f"Then the study writes into --out: {', '.join(study.outputs())}."
    return "\n".join(textwrap.fill(text, 100, break_on_hyphens=False) for text in (runs, outputs))


def condition_notes(study: Study, defaults: RunConfig) -> dict[str, str]:
    """The default text of the fields a study sets per run, in place of the base config's value: those its
    conditions override, the learning rates its multipliers scale, and the seed its --seeds give."""
    base = {**vars(defaults.model), **vars(defaults.train), **vars(defaults.data), **vars(defaults.probe)}
    notes = {name: "per condition: " + ", ".join(f"{c} {shown_value(o.get(name, base[name]))}"
                                                 for c, o in study.conditions.items())
             for name in dict.fromkeys(k for o in study.conditions.values() for k in o)}
    if study.lr_multipliers:
        for name in ("muon_lr", "adamw_lr"):
            notes[name] = f"{base[name]:g} times each --lr_multipliers rate"
    notes["seed"] = f"each of --seeds ({' '.join(map(str, study.default_seeds))})"
    return notes


def build_parser(study: Study, description: str = "", argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The study's parser whose help shows the values of the preset and --config file argv names."""
    preset, file = start_in(argv, "auto")
    pre = ArgumentParser(add_help=False)
    pre.add_argument("--device")
    return study_parser(study, description, (preset, file, pre.parse_known_args(argv)[0]))


def parse_study_args(study: Study, description: str, argv: list[str] | None) -> argparse.Namespace:
    """The command line, parsed once for the help and the run (configs.cli.parse_once)."""
    return parse_once(lambda start: study_parser(study, description, start), argv, "auto")


def _parser_defaults(study: Study, description: str,
                     start: tuple | None) -> tuple[argparse.ArgumentParser, RunConfig | None, dict[str, str]]:
    """study_parser's empty parser, the config its help shows (None for the parser that only parses) and the notes
    that replace a default's text (condition_notes, and probe_every's rule)."""
    if start is None:
        p = ArgumentParser(add_help=False)
        help_flag(p)
        return p, None, {}
    preset, file, known = start
    device = getattr(known, "device", None) or getattr(known, "cfg__device", None) or \
        (file.values.get("device") if file else None) or "auto"
    preset = resolve_preset(preset, device, study.gpu_preset, study.preset)
    preset = preset if preset in PRESETS else "tiny"
    try:
        defaults = base_config(study, preset, file.values if file else {})
    except ConfigError:  # the file's values may validate only with options still to come
        defaults = base_config(study, preset, {})
    notes = {**condition_notes(study, defaults),
             "probe_every": f"steps // {study.probes_per_run} ({defaults.probe.probe_every} with these defaults)"}
    p = ArgumentParser(description=f"{description.rstrip()}\n\n{describe_study(study)}\n\nDefaults below are "
                                   f"those of the {preset} preset for this study.")
    return p, defaults, notes


def study_parser(study: Study, description: str, start: tuple | None) -> argparse.ArgumentParser:
    """The study's options. `start`: (preset, --config file, arguments parsed so far) for the parser whose help
    shows that preset's values for this study, or None for the parser that only parses (configs.cli.parse_once),
    which builds no config."""
    p, defaults, notes = _parser_defaults(study, description, start)
    p.add_argument("--seeds", type=int, nargs="+", metavar="SEED", action=once("every seed goes after one --seeds"),
                   help=f"Seeds to train every condition with, once each (runs of one seed pair up across "
                        f"conditions). Default: {' '.join(map(str, study.default_seeds))}; --seed N alone: that one "
                        f"seed")
    p.add_argument("--out", help=f"Study folder: the runs, study.json, figures and report. Default: "
                                 f"research_results/{study.name}")
    if study.lr_multipliers:
        p.add_argument("--lr_multipliers", type=positive_number, nargs="+", default=list(study.lr_multipliers),
                       metavar="M",
                       action=once("every rate goes after one --lr_multipliers"),
                       help="Multiples of the preset's Muon and AdamW learning rates (scaled together) to train "
                            f"every condition at. Default: {' '.join(f'{m:g}' for m in study.lr_multipliers)}")
    p.add_argument("--no_progress", action="store_true", help="Log lines only, no progress bars")
    p.add_argument("--logger", default="none", choices=LOGGERS,
                   help="Experiment tracker per condition: tensorboard writes <condition>/tensorboard/ (tensorboard "
                        "--logdir the study folder), wandb one W&B run each (offline without a network), trackio "
                        "<condition>/trackio/. Default: none")
    p.add_argument("--plan", nargs="?", type=int, const=0, metavar="DEVICES",
                   help="Print the memory per device of the study's largest run, on DEVICES devices, and exit "
                        "without training. DEVICES default: torchrun's WORLD_SIZE, else 1")
    p.add_argument("--max_runs", type=positive_int, default=MAX_RUNS, metavar="N",
                   help=f"The most runs (conditions x learning rates x seeds) the study may have: more is refused "
                        f"before anything is planned or written, as a typo in the seeds more likely than a plan. "
                        f"Default: {MAX_RUNS:,}")
    p.add_argument("--replan_schedule", action="store_true",
                   help="Resume conditions with another --tokens under a cosine or warmup schedule: the remaining "
                        "steps follow the schedule of the new total (see train_llm.py --help)")
    margin, loss_margin = study.margin or MARGIN, study.loss_margin or LOSS_MARGIN
    p.add_argument("--margin", type=float, default=margin,
                   help=f"Equivalence margin of key metrics, a share of the compared values' mean: an interval "
                        f"wholly inside +-margin reads 'about equal', wholly beyond it 'different' "
                        f"(docs/decisions.md). Default: {margin}")
    p.add_argument("--loss_margin", type=float, default=loss_margin,
                   help=f"Equivalence margin of losses, as --margin is of key metrics. Default: {loss_margin}")
    add_until_args(p)
    add_hosts_args(p)
    add_ray_args(p)
    add_config_args(p, defaults, default_preset="auto", extra_presets=("auto",),
                    preset_help=f"Named starting config (configs/presets.py), or auto: {study.gpu_preset} (the "
                                f"write-ups' setting) on CUDA, tiny on CPU. Default: the --config file's preset, "
                                f"else auto",
                    notes=notes, file=start[1] if start else None)
    return p


MAX_RUNS = 10_000  # --max_runs: a week of one-minute runs, and a study.json, figures and report still read whole


def study_runs(study: Study, base: RunConfig, seeds: list[int], out: Path) -> list[StudyRun[RunConfig]]:
    """Every run of the study, in the order the in-process executor trains them: seed by seed, each condition."""
    return [StudyRun(cond, seed, run_config(base, overrides, seed),
                     condition_dir(out, cond, seed, several_seeds=len(seeds) > 1))
            for seed in seeds for cond, overrides in study.runs()]


def run_config(base: RunConfig, overrides: dict, seed: int) -> RunConfig:
    """One run's config: the base (the preset, the study's shared fields, the command line), then the condition's own
    fields over it (a condition's value wins over the command line's) and the seed; a run of the learning-rate grid
    (`lr_multiplier`, Study.runs) then has its Muon and AdamW rates scaled by its multiplier. Every value is checked
    as the config is built (a NaN rate of a condition as a NaN rate of the shared config)."""
    overrides = dict(overrides)
    m = overrides.pop("lr_multiplier", None)
    cfg = apply_overrides(base, {**overrides, "seed": seed})
    if m is None:
        return cfg
    return apply_overrides(cfg, {"muon_lr": cfg.train.muon_lr * m, "adamw_lr": cfg.train.adamw_lr * m})


def train_condition(cfg: RunConfig, run_dir: Path, tag: str, progress: bool, replan_schedule: bool = False,
                    divergence_is_a_result: bool = False, logger: str = "none",
                    runtime: Runtime | None = None, after_checkpoint=None) -> dict | None:
    """Train one run with the probe on `runtime` (the study's, settled once; resolved from cfg when None); where
    divergence is a result (the learning-rate grid), a run whose loss became non-finite is recorded as diverged and
    is not trained again. `after_checkpoint(path)`: called after each checkpoint (training.callbacks.AfterCheckpoint).
    Returns the run's summary (summary.json), None for a diverged run."""
    results = run_dir / RESULTS_FILE
    step = diverged_at(results) if divergence_is_a_result else None
    if step is not None:
        print(f"   diverged at step {step} before: kept as it is", flush=True)
        return None

    def callbacks(used_cfg, data, runtime):  # the config the run uses (offline, data/offline.py, may change it)
        return [*run_callbacks(used_cfg, data, run_dir, runtime, tag=tag, logger=logger),
                *([AfterCheckpoint(after_checkpoint)] if after_checkpoint else [])]
    try:  # a condition folder with a run to continue is resumed; one holding other files is refused (the Trainer)
        return train_run(cfg, run_dir, resume=RunFolder(run_dir).resumable(), replan_schedule=replan_schedule,
                         progress=progress, name=tag, callbacks=callbacks, runtime=runtime)
    except NonFiniteLossError as e:
        if not divergence_is_a_result:
            raise
        mark_diverged(results, e.step)
        print(f"   diverged at step {e.step} (non-finite loss): recorded in {results}", flush=True)
        return None


def train_study_run(run: StudyRun[RunConfig], runtime: Runtime | None, *, progress: bool, replan_schedule: bool,
                    logger: str, divergence_is_a_result: bool) -> dict | None:
    """The catalog studies' train function (research.studies.study_runs.Train): one run with the probe, on the study's
    runtime with `progress` bars in this process, on the worker's own without bars in a Ray task (runtime None)."""
    return train_condition(run.cfg, run.run_dir, run.cond, progress=progress and runtime is not None,
                           replan_schedule=replan_schedule, divergence_is_a_result=divergence_is_a_result,
                           logger=logger, runtime=runtime, after_checkpoint=run.after_checkpoint)


def run_study(study: Study, argv: list[str] | None = None, description: str = "") -> Path:
    """Train the study's runs and draw its figures and report; the command's errors end as utils.cli.command
    ends them (the study scripts' `main` is wrapped in it)."""
    started = time.perf_counter()
    args = parse_study_args(study, description, argv)
    for name, value in (("--margin", args.margin), ("--loss_margin", args.loss_margin)):
        check_margin(name, value)
    if args.seeds and len(set(args.seeds)) < len(args.seeds):
        twice = sorted(s for s, n in collections.Counter(args.seeds).items() if n > 1)
        raise ConfigError(f"--seeds {' '.join(map(str, args.seeds))} names seed(s) {', '.join(map(str, twice))} "
                          f"more than once: give each seed once")
    if study.lr_multipliers:
        if not args.lr_multipliers or min(args.lr_multipliers) <= 0:
            raise ConfigError("--lr_multipliers must be positive numbers, e.g. 0.25 1 4 16")
        study = dataclasses.replace(study, lr_multipliers=tuple(sorted(set(args.lr_multipliers))))
    preset, overrides = start_from_args(args, "auto")
    seeds = args.seeds or ([overrides["seed"]] if "seed" in overrides else list(study.default_seeds))  # else --seed N
    until = check_until(args, KINDS[study.kind], seeds, study.name, study.primary)
    check_run_count(study, until.max_seeds if until else len(seeds), args.max_runs)
    try:
        base = base_config(study, resolve_preset(preset, overrides.get("device", "auto"), study.gpu_preset,
                                                 study.preset), overrides)
    except ConfigError as e:
        raise ConfigError(f"{study.source}: the shared config: {e}" if study.source else str(e)) from None
    out = Path(args.out or Path("research_results") / study.name)
    if args.plan is not None:  # planning for CUDA needs no GPU here
        print(study_plan(study, base, args.plan or int(os.environ.get("WORLD_SIZE", "1"))))
        if until:
            print(rounds_plan(study, base, seeds, out, until))
        return out
    runtime = resolve_runtime(base.train.device, base.train.precision)  # once for every run of the study
    check_logger(args.logger)
    storage = check_ray_options(args, study.name, study.kind, out)
    check_runs(study, base, seeds[0], runtime)
    options = ExecuteOptions.from_args(args, runtime, storage, on_cpu=all(  # a run's device: its condition's
        r.cfg.train.device == "cpu" for r in study_runs(study, base, seeds[:1], out)))
    print(start_line(study, base, runtime, seeds, until, out), flush=True)
    for name in dict.fromkeys(k for o in study.conditions.values() for k in o if k in overrides):
        own = [c for c, o in study.conditions.items() if name in o]
        print(f"note: {name}={shown_value(overrides[name])} (the options) is the shared config's: condition(s) "
              f"{', '.join(own)} keep their own {name}", flush=True)
    try:
        check_study_folder(out, study)  # before the lock, which would create the folder
        mix_hosts = check_hosts(out, this_host_kind(runtime.device), runtime.precision, args.mix_hosts)
        if runtime.device.type == "cpu" and args.parallel == 1 and args.ray is None:  # the runs train here
            threads, line = study_threads(out, thread_choice(base.train.threads, runtime.local_world_size),
                                          base.train.threads)
            base = apply_overrides(base, {"threads": threads}) if threads != base.train.threads else base
            if line:
                print(line, flush=True)
        with FolderLock(out, hint="choose another --out"):
            _train_and_render(study, args, base, seeds, out, options, until, mix_hosts, started)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while drawing the figures of {out}: the trained conditions are kept; python "
                          f"research/split_panels.py {out} draws them") from None
    return out


def start_line(study: Study, base: RunConfig, runtime: Runtime, seeds: list[int], until: Until | None,
               out: Path) -> str:
    """The study's first line: where and in what precision it trains, how many runs of how many tokens, where to."""
    return (f"{study.name}: preset {base.preset} on {runtime.device_choice()}, precision "
            f"{runtime.precision_choice()}; {len(study.conditions)} conditions x "
            + (f"{len(study.lr_multipliers)} learning rates x " if study.lr_multipliers else "")
            + f"{len(seeds)} seed(s)"
            + (f" (up to {until.max_seeds}, {until.round} more a round while undecided)" if until else "")
            + f" x {base.steps * base.tokens_per_step:,} tokens; probe every {base.probe.probe_every} steps; "
            f"writing {out}")


def check_run_count(study: Study, n_seeds: int, max_runs: int) -> None:
    """At most `max_runs` runs (--max_runs), before any config is built: ConfigError with the count and both ways
    out."""
    per_seed = len(study.runs())
    if per_seed * n_seeds <= max_runs:
        return
    rates = f"{len(study.lr_multipliers)} learning rates x " if study.lr_multipliers else ""
    where = f"{study.source}: " if study.source else ""
    raise ConfigError(f"{where}the study has {per_seed * n_seeds:,} runs ({len(study.conditions)} conditions x "
                      f"{rates}{n_seeds:,} seeds), more than --max_runs {max_runs:,}. Fix: fewer seeds or conditions, "
                      f"or --max_runs {per_seed * n_seeds} if that many is meant (nothing was written)")


def check_runs(study: Study, base: RunConfig, seed: int, runtime: Runtime) -> None:
    """Every run's config is built, measures what the study decides (configs.measured: its primary quantities, a
    key-cache one with the key cache's measurement on) and fits this machine (training.memory_fit.check_fits), and
    every run trains the same tokens (a condition may set grad_accum, and steps = tokens // tokens_per_step rounds
    down), before the first run trains: ConfigError names the condition (and the study file) and the field. The seed
    changes none of it."""
    where = f"{study.source}: " if study.source else ""
    first: tuple[str, RunConfig] | None = None
    for cond, overrides in study.runs():
        try:
            cfg = run_config(base, overrides, seed)
            check_measured(cfg, primary_needs(study.primary))
            check_fits(cfg, runtime)
        except ConfigError as e:
            raise ConfigError(f"{where}condition {cond}: {e} (nothing was trained)") from None
        first = first or (cond, cfg)
        if cfg.steps * cfg.tokens_per_step != first[1].steps * first[1].tokens_per_step:
            raise ConfigError(f"{where}condition {cond}: {budget_mismatch(first, (cond, cfg), overrides)} (nothing "
                              f"was trained)")


def budget_mismatch(first: tuple[str, RunConfig], other: tuple[str, RunConfig], overrides: dict) -> str:
    """Why two runs' budgets differ, and the tokens that give both the same: a multiple of both steps' tokens."""
    def trained(cfg: RunConfig) -> str:
        return f"{cfg.steps * cfg.tokens_per_step:,} tokens ({cfg.steps} steps of {cfg.tokens_per_step:,})"
    (name, a), (_, b) = first, other
    step = math.lcm(a.tokens_per_step, b.tokens_per_step)
    fields = ", ".join(f"{k}={overrides[k]}" for k in ("grad_accum", "batch_size", "seq_len") if k in overrides)
    return (f"{fields or 'its config'} trains {trained(b)}, condition {name} {trained(a)}: every condition must "
            f"train the same tokens, or all are compared at the shortest run's budget, the others mid-schedule. Fix: "
            f"give tokens as a multiple of {step:,} (e.g. {max(step, b.train.tokens // step * step):,})")


def study_plan(study: Study, base: RunConfig, world_size: int) -> str:
    """The memory plan of the study's run that needs the most (conditions differ in q/k norms and learning
    rates only, so by a few parameters at most)."""
    configs = [run_config(base, overrides, base.train.seed) for _, overrides in study.runs()]
    largest = max(configs, key=lambda c: needed_bytes(plan_memory(c, *plan_target(c), world_size)))
    return f"{study.name}: the largest of its {len(configs)} runs\n{plan_text(largest, world_size)}"


def rounds_plan(study: Study, base: RunConfig, seeds: list[int], out: Path, until: Until) -> str:
    """--plan's rounds of --until_decided, timed by the finished runs the study's folder already holds."""
    design = plan(len(seeds), until.max_seeds, until.round)
    every = [*seeds, *range(max(seeds) + 1, max(seeds) + 1 + until.max_seeds - len(seeds))]
    summaries = [RunFolder(r.run_dir, log=lambda *_: None).read_summary() for r in study_runs(study, base, every, out)]
    return rounds_text(design, len(study.runs()), [s["wall_time_s"] for s in summaries if s and s.get("wall_time_s")])


def study_times(out: Path, trained_s: float, figures_s: float, command_s: float) -> dict:
    """The study's time split: the time splits its runs' summary.json record (utils.time_split, each over all its
    sessions), summed, with this command's figures and its driver's own time (the command's wall time less the time
    in the runs, `trained_s`, and the figures) in `rest`. Runs without one (trained before time splits) are left
    out of the sum; "runs" says how many are in it."""
    index = read_study_index(out)
    folders = dict.fromkeys(Path(p).parent for paths in index.get("conditions", {}).values() for p in paths)
    records = [s["time_split"] for s in (RunFolder(f, log=lambda *_: None).read_summary() for f in folders)
               if s and is_record(s.get("time_split"))]
    total = add_records(records)
    driver = max(0.0, command_s - trained_s - figures_s)
    total.update(wall_s=total["wall_s"] + figures_s + driver, figures=total["figures"] + figures_s,
                 rest=total["rest"] + driver, runs=len(records))
    return total


def _train_and_render(study: Study, args, base: RunConfig, seeds: list[int], out: Path, options: ExecuteOptions,
                      until: Until | None, mix_hosts: bool, started: float) -> None:
    train = functools.partial(train_study_run, progress=not args.no_progress, replan_schedule=args.replan_schedule,
                              logger=args.logger, divergence_is_a_result=bool(study.lr_multipliers))
    trained_s = [0.0]  # seconds this command spent in the executor (the runs' own time splits say where)

    def train_runs(runs: list[StudyRun[RunConfig]], done: set) -> None:  # a round's new runs, together
        check_recorded_runs(runs, args.replan_schedule)
        t = time.perf_counter()
        try:
            execute(runs, out, train, options, finished=lambda run: run.run_dir in done)
        finally:
            trained_s[0] += time.perf_counter() - t

    def write_index(seeds: list[int], conditions: dict, looks: list[dict], design: dict | None) -> None:
        write_study_index(out, name=study.name, kind=study.kind, seeds=seeds, preset=base.preset,
                          conditions=conditions, margin=args.margin, loss_margin=args.loss_margin,
                          baseline=study.baseline, primary=study.primary, logit_margin=study.logit_margin,
                          kv_loss_margin=study.kv_loss_margin, looks=looks, design=design, mix_hosts=mix_hosts)
    try:
        family = family_record([name for name, _ in study.runs()], margin=args.margin, loss_margin=args.loss_margin,
                               baseline=study.baseline, primary=study.primary, logit_margin=study.logit_margin,
                               kv_loss_margin=study.kv_loss_margin)
        run_looks(out, seeds, until, Rounds(lambda s: study_runs(study, base, s, out), train_runs, write_index, family))
        t = time.perf_counter()
        for path in render_study(out, margin=args.margin, loss_margin=args.loss_margin):
            print(f"wrote {path}")
        figures_s = time.perf_counter() - t
        record = study_times(out, trained_s[0], figures_s, time.perf_counter() - started)
        add_study_times(out, record)
        print(f"{study.name} time ({record['runs']} runs summed): {split_line(record)}", flush=True)
    except OSError as e:
        raise StudyError(f"cannot write the figures and report into {out}: {explain(e)}; the trained conditions are "
                         f"kept (python research/split_panels.py {out} --out DIR draws them elsewhere)") from None
