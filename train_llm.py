"""Train one model from a preset plus command-line overrides.

    python train_llm.py --preset tiny --tokens 200000 --out runs/tiny
    python train_llm.py --preset tiny --out runs/tiny --resume          # continue the newest checkpoint
    python train_llm.py --preset tiny --out runs/p --probe-every 25     # key probe -> runs/p/results.json
    torchrun --nproc_per_node 2 train_llm.py --preset tiny --out runs/ddp

Every config field is an option (`--n_layers 8`, `--qk_norm frozen`, ...); see --help.
"""
from __future__ import annotations

import argparse
import sys

from configs import ConfigError, add_config_args, config_from_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--out", required=True, help="output folder (config, metrics, checkpoints, tokenizer)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    p.add_argument("--tag", help="condition name in results.json (default from qk_norm: QK, QK_frozen, NoQK)")
    add_config_args(p)
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        sys.exit(f"config error: {e}")

    from data import DataError  # heavy imports after argument checks
    from research.results import ResultsError
    from training.trainer import NonFiniteLossError, Trainer

    try:
        trainer = Trainer(cfg, args.out, resume=args.resume, progress=not args.no_progress)
        if cfg.probe.probe_every:
            from research.recorder import ProbeRecorder
            trainer.add_callback(ProbeRecorder(trainer, tag=args.tag))
        try:
            summary = trainer.fit()
        finally:
            trainer.close()
    except (ConfigError, DataError, FileExistsError, NonFiniteLossError, ResultsError) as e:
        sys.exit(f"error: {e}")
    if trainer.is_main:
        print(f"done: {summary['steps']} steps, {summary['tokens']:,} tokens, loss {summary['final_loss']}, "
              f"val_loss {summary['final_val_loss']:.4f}, {summary['tokens_per_s'] or 0:,.0f} tokens/s; "
              f"wrote {args.out}")
    return summary


if __name__ == "__main__":
    main()
