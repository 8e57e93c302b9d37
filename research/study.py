"""A study you write: train every condition of a study file once per seed with the key probe, then decide and draw.

Each condition is compared with the baseline (or, without one, with every other condition) in key PR (pr_sv and
pr_var), key norm, the largest key component, the largest attention logit, attention entropy, sink mass, and the
validation and training loss: one family per quantity, or the file's `primary` quantities one family together (the
report's findings; the others exploratory), decided as docs/decisions.md says. The study resumes as every study does
(run the same command again) and research/split_panels.py redraws it.
"""
import sys

from utils.cli import command

from configs.config import ConfigError
from research.studies.runner import run_study
from research.studies.study_file import EXAMPLE, read_study_file

USAGE = "python research/study.py STUDY_FILE [options]"
STUDY_SUFFIXES = (".yaml", ".yml", ".json")
# --help's description: the module docstring, then these details, with the example study file
DESCRIPTION = (__doc__ + """
    python research/study.py my_study.yaml                        # tiny preset on CPU unless the file names one
    python research/study.py my_study.yaml --seeds 0 1 --tokens 100000 --out runs/quick
    python research/split_panels.py research_results/<name>       # redraw from the results

The study file (YAML or JSON; docs/study_files.md walks through one) looks like this:

{example}

The config fields are train_llm.py's (python train_llm.py --help). Options given here override the file's shared
fields for every run (a condition's own fields stay its own). A condition sets training fields only: the budget and
the measurement (tokens, the data and probe fields, and the others docs/study_files.md lists under "What a condition
may set") are the study's, set at the top level.
""").format(example=EXAMPLE.rstrip())


def _split(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the study file, the other arguments): the first argument named .yaml, .yml or .json, else the first
    argument where it is not an option."""
    for i, a in enumerate(argv):
        if a.lower().endswith(STUDY_SUFFIXES) and not a.startswith("-"):
            return a, argv[:i] + argv[i + 1:]
    return (argv[0], argv[1:]) if argv and not argv[0].startswith("-") else (None, argv)


@command
def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    path, rest = _split(argv)
    if path is None:
        if {"-h", "--help"} & set(argv):
            print(f"usage: {USAGE}\n\n{DESCRIPTION}")
            return
        raise ConfigError(f"no study file: {USAGE} (--help shows the study file's format)")
    run_study(read_study_file(path), rest, description=DESCRIPTION)


if __name__ == "__main__":
    main()
