"""The options the studies that measure models on real-text windows share: the windows, the margin, where
the results go (research/pretrained_keys_study.py, research/checkpoint_keys_study.py)."""
from __future__ import annotations

import sys

from research.analysis.rules import MARGIN, check_margin
from research.access.loading import CACHE_HELP, DEFAULT_CACHE
from research.inspection.text import ENGLISH


def add_measure_options(p, *, default_out: str, results_file: str, report_file: str, seed_help: str,
                        margin_reads: str) -> None:
    """--text, --batches, --batch, --seq_len, --seed, --margin, --out, --cache_dir, --render_only and --no_progress
    (checked by check_measure_options). margin_reads: what an interval wholly inside the margin is called."""
    p.add_argument("--text", default=ENGLISH,
                   help="Real text the windows are cut from: 'english' (the pinned corpus english-v1) or a UTF-8 "
                        "text file. Default: %(default)s")
    p.add_argument("--batches", type=int, default=8,
                   help="Text batches, the unit of uncertainty of every decision. Default: %(default)s")
    p.add_argument("--batch", type=int, default=4, help="Text windows per batch. Default: %(default)s")
    p.add_argument("--seq_len", type=int, default=256, help="Tokens per window, 8 or more. Default: %(default)s")
    p.add_argument("--seed", type=int, default=0, help=f"{seed_help}. Default: %(default)s")
    p.add_argument("--margin", type=float, default=MARGIN,
                   help=f"Equivalence margin, a share of the compared values' mean: an interval wholly inside "
                        f"+-margin reads '{margin_reads}' (docs/decisions.md). Default: %(default)s")
    p.add_argument("--out", default=default_out,
                   help="Folder to write the results file, the figures and the report into. Default: %(default)s")
    p.add_argument("--cache_dir", default=DEFAULT_CACHE, help=CACHE_HELP)
    p.add_argument("--render_only", action="store_true",
                   help=f"Redraw the figures and {report_file} from --out/{results_file}; measure nothing")
    p.add_argument("--no_progress", action="store_true", help="Log lines only, no progress bars")


def check_measure_options(p, args) -> None:
    """p.error (one line, exit 2) for options that cannot work; a note when one batch leaves nothing to test."""
    for name in ("batches", "batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name} {getattr(args, name)}: give 1 or more")
    if args.seq_len < 8:
        p.error(f"--seq_len {args.seq_len}: give 8 or more tokens (at most the model's context, checked once it is "
                f"loaded)")
    if args.seed < 0:
        p.error(f"--seed {args.seed}: give 0 or more (numpy takes no negative seed)")
    try:
        check_margin("--margin", args.margin)  # the one check of margins (refuses nan too)
    except ValueError as e:
        p.error(str(e))
    if args.batches < 2 and not args.render_only:
        print("note: with one batch there is no uncertainty to estimate: the report is descriptive", file=sys.stderr)
