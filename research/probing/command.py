"""The train_llm command (train_llm.py, qk-train): one run from a preset, a --config file and options, with the key
probe attached where --probe_every asks for it.

    main(argv, description)   # parse once, plan or train, and say how to go on after Ctrl-C
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from configs import PRESETS, add_config_args, config_from_args, get_preset
from configs.cli import help_defaults, help_flag, parse_once, start_in
from training.tracking import LOGGERS, check_logger
from utils.cli import ArgumentParser
from utils.errors import Interrupted
from utils.run_names import CHECKPOINTS, CONFIG, METRICS, RESULTS, SUMMARY, TOKENIZER


def build_parser(argv: list[str] | None = None, description: str = "") -> argparse.ArgumentParser:
    """The parser whose help shows the values of the preset argv chooses with its --config file's values over them."""
    preset, file = start_in(argv, "tiny")
    return parser((preset, file, None), description)


def parser(start: tuple | None, description: str = "") -> argparse.ArgumentParser:
    """The options. `start`: (preset, --config file, _) for the parser whose help shows the preset's values with
    the file's over them, or None for the parser that only parses (configs.cli.parse_once), which builds no config."""
    if start is None:
        p, defaults, file = ArgumentParser(add_help=False), None, None
        help_flag(p)
    else:
        preset, file, _ = start
        preset = preset if preset in PRESETS else "tiny"
        defaults = help_defaults(get_preset(preset), file)
        source = f"the {preset} preset" + (f" with {file.path}" if file else "")
        p = ArgumentParser(description=f"{description}\nDefaults below are those of {source}.")
    p.add_argument("--out", help=f"Output folder: {CONFIG}, {METRICS}, {SUMMARY}, {CHECKPOINTS}/, {TOKENIZER}/, "
                                 f"{RESULTS} when probing, tensorboard/, wandb/ or trackio/ with --logger. Required "
                                 f"unless --plan")
    p.add_argument("--plan", nargs="?", type=int, const=0, metavar="DEVICES",
                   help="Print the memory this run needs per device, on DEVICES devices, and exit without allocating "
                        "anything. DEVICES default: torchrun's WORLD_SIZE, else 1")
    p.add_argument("--resume", action="store_true",
                   help="Continue from the newest checkpoint in --out that loads (a finished run trains nothing)")
    p.add_argument("--replan_schedule", action="store_true",
                   help="With --resume and another --tokens under a cosine or warmup schedule: the remaining steps "
                        "follow the schedule of the new total (the learning rate jumps once, at the resume step)")
    p.add_argument("--no_progress", action="store_true", help="Log lines only, no progress bar")
    from research.results.vocabulary import TAG_BY_QK_NORM  # no torch: --help stays quick
    tags = ", ".join(f"{mode}: {tag}" for mode, tag in TAG_BY_QK_NORM.items())
    p.add_argument("--tag", help=f"Condition name written into results.json. Default: from qk_norm ({tags})")
    p.add_argument("--logger", default="none", choices=LOGGERS,
                   help="Experiment tracker of losses, learning rates, tokens/s, grad norm and probe metrics: "
                        "tensorboard writes OUT/tensorboard/, wandb a W&B run (offline without a network), trackio "
                        "OUT/trackio/ (TRACKIO_DIR=OUT/trackio trackio show). "
                        "Default: none")
    add_config_args(p, defaults, file=file)
    return p


def main(argv: list[str] | None = None, description: str = "") -> dict | None:
    args = parse_once(lambda start: parser(start, description), argv, "tiny")
    cfg = config_from_args(args)
    check_logger(args.logger)
    if args.plan is not None:  # a plan for CUDA may be made on a machine without one
        from training.memory_fit import plan_text
        print(plan_text(cfg, args.plan or int(os.environ.get("WORLD_SIZE", "1"))))
        return None
    from utils.runtime import resolve_runtime
    runtime = resolve_runtime(cfg.train.device, cfg.train.precision)  # once; a device this machine lacks: named now
    if not args.out:
        parser(None).error("the following arguments are required: --out")

    from research.probing.callback import run_callbacks  # heavy imports after argument checks
    from training.errors import RunInterrupted
    from training.run import train_run

    def callbacks(used_cfg, data, runtime):  # the config the run uses (offline, data/offline.py, may change it)
        return run_callbacks(used_cfg, data, args.out, runtime, tag=args.tag, logger=args.logger)

    try:
        summary = train_run(cfg, args.out, resume=args.resume, replan_schedule=args.replan_schedule,
                            progress=not args.no_progress, callbacks=callbacks, runtime=runtime)
    except RunInterrupted as e:  # Ctrl-C: one line, how to go on
        raise Interrupted(f"{e}; {continue_command(argv, e.resumable)}") from None
    if summary is not None:  # rank 0
        print(f"done: {summary['steps']} steps, {summary['tokens']:,} tokens, loss {summary['final_loss']}, "
              f"val_loss {summary['final_val_loss']:.4f}, {summary['tokens_per_s'] or 0:,.0f} tokens/s; "
              f"wrote {args.out}")
    return summary


def continue_command(argv: list[str] | None, resumable: bool) -> str:
    """How to go on after an interrupt: the same command (as it was typed: qk-train or python train_llm.py), with
    --resume once the folder holds a run to continue."""
    args = list(sys.argv[1:] if argv is None else argv)
    program = "qk-train" if os.path.basename(sys.argv[0]) == "qk-train" else "python train_llm.py"
    if not resumable:
        return f"run the same command again: {program} {shlex.join(args)}"
    if "--resume" not in args:
        args.append("--resume")
    return f"continue with: {program} {shlex.join(args)}"
