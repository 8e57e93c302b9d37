"""Decide, as this project decides its studies, what the runs you already have show: paired by seed, one family,
a margin, five outcomes.

    python research/qk_decide.py runs.csv --baseline base --margin 0.0072        # one row per run
    python research/qk_decide.py tb_logs --run_name '(?P<condition>[^/]+)/seed(?P<seed>\\d+)' --metric val/loss
    python research/qk_decide.py runs.csv --until_decided 8 --round 2 --design plan.json   # looks at more seeds
"""
from utils.cli import command

from research.decide import command as decide_command

DESCRIPTION = __doc__ + """
Reads CSV or TSV (long: one row per run with its condition, seed and metrics; or --wide), JSON lines, a W&B
runs-table export, TensorBoard folders, trackio's store and this project's run and study folders. Each metric's
pairs are compared on the seeds both conditions have (the others named), by per-seed differences (log ratios of a
positive ratio quantity), all comparisons in one family (Bonferroni) unless --primary names the metrics that form
it, each read against its margin: equal, different within the margin, different beyond it, different of unresolved
size, or inconclusive. Conditions that share no seed are compared unpaired (Welch), labelled so; one run a side is
described, not decided. Duplicated runs and runs at different steps are refused. With --until_decided and
--design, a later call with more seeds is a planned look. The procedure and its error rates: docs/decide.md.
"""


def build_parser():
    return decide_command.build_parser(DESCRIPTION)


@command
def main(argv: list[str] | None = None) -> int:
    return decide_command.main(argv, DESCRIPTION)


if __name__ == "__main__":
    raise SystemExit(main())
