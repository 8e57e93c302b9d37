"""Export a run folder as a Hugging Face model folder that transformers loads with a built-in class.

    python research/export_hf.py RUN_DIR OUT_DIR [--force] [--step N]
"""
from __future__ import annotations

import argparse
import sys

from utils.cli import ArgumentParser, command

from research.export import export_run


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
RUN_DIR: a folder written by train_llm.py or one run of a study (research_results/<study>/<condition>
[/lr_<multiplier>][/seed_<s>]). Its newest checkpoint (the last step's, for a finished run; --step N: the
checkpoint of step N, e.g. to follow keys over training with research/checkpoint_keys_study.py), its
tokenizer and export.json (where the export came from: run, checkpoint step, mapping) are written to
OUT_DIR, which AutoModelForCausalLM / AutoTokenizer.from_pretrained then load without
trust_remote_code: qk_norm learned or frozen as ApertusForCausalLM, none as ArceeForCausalLM
(research/export/hf.py says why and what is folded).
"""


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=DESCRIPTION)
    p.add_argument("run_dir", help="Run folder to export: a train_llm.py output folder or one run folder of a "
                                   "study. Required")
    p.add_argument("out_dir", help="Folder to write the Hugging Face model into; it must be new or empty unless "
                                   "--force, and never a run folder. Required")
    p.add_argument("--force", action="store_true",
                   help="Write into a non-empty OUT_DIR: files of the export's names are replaced, others kept")
    p.add_argument("--step", type=int, default=None,
                   help="Export the checkpoint of this training step (one the run kept under checkpoints/). "
                        "Default: the newest checkpoint that reads back")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.step is not None and args.step < 0:
        p.error(f"--step {args.step}: give a step of 0 or more")
    return args


@command
def main(argv=None) -> int:
    args = parse_args(argv)
    info = export_run(args.run_dir, args.out_dir, force=args.force, step=args.step)
    print(f"exported {args.run_dir} (checkpoint step {info['step']}, qk_norm={info['qk_norm']}) as "
          f"{info['architecture']} to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
