"""The qk-decide command (research/qk_decide.py): read runs from the files given (research.decide.readers, this
project's folders through research.decide.own), lay them out and check them (compare.lay_out), decide the pairs named
per metric (compare.decide_runs; at a design's looks with --design), print the report (report.report) and write
--json. docs/decide.md.

    main(argv, description)
"""
from __future__ import annotations

import json
from pathlib import Path

from research.analysis.runs import DecideError, comparison_pairs, decide_runs, lay_out, parse_margins
from research.decide.report import json_record, report
from utils.cli import ArgumentParser
from utils.io import atomic_write_text


def build_parser(description: str = "") -> ArgumentParser:
    p = ArgumentParser(description=description)
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="CSV or TSV (one row per run, or --wide), JSON lines, a W&B runs-table export (CSV), a "
                        "TensorBoard folder, a trackio folder or .db, or this project's run or study folders (its "
                        "runs' TensorBoard or trackio files instead with --run_name). Required")
    read = p.add_argument_group("reading the runs")
    read.add_argument("--condition", default="condition", help="The column or config key of the condition (a run "
                      "folder of this project: a dotted config key such as model.qk_norm). Default: %(default)s")
    read.add_argument("--seed", default="seed", help="The column or config key of the seed. Default: %(default)s")
    read.add_argument("--step", default="step", help="The column of the step, where the runs have one; runs at "
                      "different steps are refused. Default: %(default)s")
    read.add_argument("--metric", nargs="+", default=None, help="The metrics to decide (default: every numeric "
                      "column, key or tag)")
    read.add_argument("--wide", default=None, metavar="METRIC", help="A wide CSV: a seed column and one column per "
                      "condition, each cell that condition's METRIC at that seed")
    read.add_argument("--run_name", default=None, metavar="REGEX", help="Condition and seed from each run's name "
                      "(TensorBoard run folders, trackio and W&B run names): a regex with groups (?P<condition>...) "
                      "and (?P<seed>...), e.g. '(?P<condition>[^/]+)/seed(?P<seed>\\d+)'")
    read.add_argument("--at_step", type=int, default=None, help="TensorBoard and trackio: each metric's value at "
                      "this step (default: its last value)")
    fam = p.add_argument_group("what is compared, and how")
    fam.add_argument("--baseline", default=None, help="Compare each condition with this one (condition minus it)")
    fam.add_argument("--compare", nargs=2, action="append", metavar=("A", "B"), default=None,
                     help="Compare A with B (A minus B); may be given several times. Default: every pair, in the "
                          "files' order (the first minus the second)")
    fam.add_argument("--primary", nargs="+", default=None, metavar="METRIC", help="The metrics that form the one "
                     "family (Bonferroni over their comparisons); every other metric is an exploratory family of "
                     "its own. Default: every metric in one family")
    fam.add_argument("--margin", action="append", default=None, metavar="[METRIC=]SIZE",
                     help="Equivalence margin: absolute in the metric's units (0.0072) or a share of the pair's "
                          "mean (0.5%%), for every metric or one (bpb=0.0072); may be given several times. Default: "
                          "0.5%% of the mean for a loss, bits-per-byte or perplexity, 3%% otherwise")
    fam.add_argument("--unpaired", action="store_true", help="Compare every pair unpaired (Welch's t), ignoring "
                     "seeds; labelled so. Without it only pairs that share no seed are")
    seq = p.add_argument_group("looks at more seeds")
    seq.add_argument("--until_decided", type=int, default=None, metavar="MAX", help="Plan looks up to MAX seeds "
                     "(with --design FILE), as the studies' --until_decided: a later call with more seeds is a "
                     "planned look, decided at the design's calibrated levels")
    seq.add_argument("--round", type=int, default=None, help="Seeds added between planned looks. Default: 1")
    seq.add_argument("--design", default=None, metavar="FILE", help="The design file: written at the first look, "
                     "read (and a look added) by every later call")
    p.add_argument("--json", default=None, metavar="FILE", help="Write every comparison to FILE as JSON "
                                                                "(docs/schema/decide.schema.json)")
    return p


def _read(files: list[str], args) -> tuple[list, list]:
    """(runs, study rows): this project's study folders decided as their studies decide, other folders of its runs
    read as runs, everything else through research.decide.readers."""
    from research.decide import own, readers
    key = args.condition if args.condition != "condition" else None
    readers.OWN_READER = lambda path, columns: own.own_runs(Path(path), key)  # a run folder met below a path
    runs, rows = [], []
    plain = []
    for f in files:
        path = Path(f)
        if own.is_study(path):
            rows += own.study_rows(path)[0]
        elif path.is_dir() and args.run_name is None and own.run_folders(path):  # --run_name: its trackers
            runs += own.own_runs(path, key)
        else:
            plain.append(f)
    if plain:
        runs += readers.read_runs(plain, readers.Columns(
            condition=args.condition, seed=args.seed, step=args.step, metrics=tuple(args.metric or ()),
            wide=args.wide, run_name=args.run_name, at_step=args.at_step))
    return runs, rows


def main(argv=None, description: str = "") -> int:
    args = build_parser(description).parse_args(argv)
    if (args.until_decided is not None or args.round is not None) and args.design is None:
        raise DecideError("--until_decided and --round plan looks into a design file: add --design FILE")
    if args.design and args.unpaired:
        raise DecideError("--design plans looks at more seeds of paired runs: --unpaired has no seeds to add. Fix: "
                          "leave one out")
    if args.round is not None and args.round < 1:
        raise DecideError(f"--round {args.round}: give 1 or more seeds a round")
    runs, study = _read(args.files, args)
    if study and (runs or args.design or args.compare or args.baseline or args.primary or args.margin):
        raise DecideError("a study folder of this project is decided as its study decides (its family, margins and "
                          "looks): pass it alone, without --baseline, --compare, --primary, --margin or --design")
    if study:
        return _print(study, None, [], args, [str(f) for f in args.files], {"study": True})
    table = lay_out(runs, args.metric)
    pairs = comparison_pairs(table.conditions, args.baseline, [tuple(c) for c in args.compare or []])
    margins = parse_margins(args.margin or [])
    primary = args.primary or []
    for m in primary:
        if m not in table.metrics:
            raise DecideError(f"--primary {m}: not a metric of the runs ({', '.join(table.metrics)}). Fix: name one")
    family = {"pairs": [list(p) for p in pairs], "metrics": table.metrics, "primary": primary,
              "margins": sorted(args.margin or []), "unpaired": args.unpaired}
    looks_text, looks = "", None
    if args.design:
        from research.analysis.sequential import at_looks
        from research.decide.design import look_at
        seeds = _shared_seeds(table, pairs, primary or table.metrics)
        design, taken, said = look_at(args.design, seeds, family, args.until_decided, args.round)
        with at_looks(taken, design):
            rows = decide_runs(table, pairs, margins, primary, args.unpaired)
        looks = [{"seeds": list(x.seeds), "alpha": x.alpha, "planned": x.planned} for x in taken]
        looks_text = f"Looks: {said}. " + _next(rows, design, taken)
    else:
        rows = decide_runs(table, pairs, margins, primary, args.unpaired)
    return _print(rows, table, looks, args, [str(f) for f in args.files], family, looks_text)


def _shared_seeds(table, pairs, metrics) -> list:
    """The seeds every compared condition has in every stated metric: what a look is counted in."""
    sets = [set(table.values[m][c]) for m in metrics for p in pairs for c in p]
    return sorted(set.intersection(*sets), key=str) if sets else []


def _next(rows, design, looks) -> str:
    from research.analysis.sequential import undecided
    from research.decide.design import done
    stated = {f"{r.metric} {r.a}-{r.b}": r.decision for r in rows if not r.family.startswith("exploratory")}
    open_ = undecided(stated)
    if not open_:
        return "Every stated comparison is decided: no more seeds are needed."
    if done(design, looks):
        return f"The design's last look is taken; {len(open_)} comparison(s) stay open."
    n = next(x for x in design.looks if x > len(looks[-1].seeds))
    return f"{len(open_)} comparison(s) open: add runs up to {n} seeds (the next planned look) and run the same " \
           f"command."


def _print(rows, table, looks, args, sources, family, looks_text: str = "") -> int:
    from research.analysis.runs import Table
    if table is None:  # a study folder: its conditions and quantities as decided
        conds = list(dict.fromkeys(c for r in rows for c in (r.a, r.b)))
        table = Table({}, conds, list(dict.fromkeys(r.metric for r in rows)), None)
    print(report(rows, table, [], sources, looks_text), end="")
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(json_record(rows, table, sources, family, [], looks),
                                                      indent=1, allow_nan=False) + "\n")
    return 0
