"""The closing section of a fixed QK-norm study's report: its open primary comparisons and the exact command that would
answer them under a design planned from its start (research.plots.looks.open_questions)."""
import numpy as np

from research.analysis.rules import Paired, decide
from research.plots.looks import open_questions

# diffs 1, 3: mean 2, sd sqrt 2, t(1) at 1 - 0.05 = 12.7 -> [-15.97, 19.97] against a margin of 0.03 x 2: inconclusive;
# diffs 2.00, 2.01: a spread, the interval about [1.94, 2.07], wholly beyond +-0.06: decided
FAMILY = decide({"A−B": Paired(np.array([1.0, 3.0]), 2.0, 0.0, 2.0),
                 "B−C": Paired(np.array([2.0, 2.01]), 2.0, 0.0, 2.0)})
INDEX = {"study": "qk_norm_50m_study", "kind": "qk_norm", "seeds": [0, 1, 2, 3], "preset": "tiny"}


def test_a_fixed_study_with_an_open_question_ends_with_the_planned_command():
    text = open_questions("qk_norm", INDEX, FAMILY)
    assert text.startswith("## Answering the open questions\n\nPrimary comparisons not decided at these 4 seeds: A−B.")
    assert text.endswith("\n    python research/qk_norm_25m_study.py --preset tiny --seeds 0 1 2 3 --until_decided 8 "
                         "--out research_results/qk_norm_50m_study_until8\n")


def test_nothing_is_added_where_nothing_is_open_or_the_study_was_planned_or_the_kind_has_no_command():
    assert open_questions("qk_norm", INDEX, {"B−C": FAMILY["B−C"]}) == ""
    planned = {**INDEX, "design": {"seeds": [0, 1, 2, 3], "max_seeds": 8, "round": 2},
               "looks": [{"seeds": [0, 1, 2, 3], "alpha": 0.00625, "planned": True}]}
    assert open_questions("qk_norm", planned, FAMILY) == ""
    assert open_questions("pilot", INDEX, FAMILY) == ""
