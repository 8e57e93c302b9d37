"""The closing section of a fixed QK-norm study's report: its open primary comparisons, the exact command that would
answer them, a new study on new seeds planned from its start, and the error a reader of both reports then faces
(research.plots.looks.open_questions)."""
import numpy as np

from research.analysis.rules import Paired, decide
from research.plots.looks import open_questions

# diffs 1, 3: mean 2, sd sqrt 2, t(1) at 1 - 0.05 = 12.7 -> [-15.97, 19.97] against a margin of 0.03 x 2: inconclusive;
# diffs 2.00, 2.01: a spread, the interval about [1.94, 2.07], wholly beyond +-0.06: decided
FAMILY = decide({"A−B": Paired(np.array([1.0, 3.0]), 2.0, 0.0, 2.0),
                 "B−C": Paired(np.array([2.0, 2.01]), 2.0, 0.0, 2.0)})
INDEX = {"study": "qk_norm_50m_study", "kind": "qk_norm", "seeds": [0, 1, 2, 3], "preset": "tiny"}


def test_a_fixed_study_with_an_open_question_ends_with_a_new_study_on_new_seeds_and_the_bound_of_both():
    text = open_questions("qk_norm", INDEX, FAMILY)
    assert text.startswith("## Answering the open questions\n\nPrimary comparisons not decided at these 4 seeds: A−B.")
    assert "A new study on new seeds (4\u20137, then the next integers; no run of this one trained again)" in text
    # a reader of both reports: this study's 5% and the new one's, added (not the new study's 5% alone)
    assert "read with this report, some outcome of the two is wrong with probability at most 10%" in text
    assert text.endswith("\n    python research/qk_norm_25m_study.py --preset tiny --seeds 4 5 6 7 --until_decided 8 "
                         "--out research_results/qk_norm_50m_study_new_seeds_until8\n")


def test_the_new_seeds_follow_the_largest_and_repeat_none_of_the_study():
    text = open_questions("qk_norm", {**INDEX, "seeds": [9, 0, 3], "preset": None}, FAMILY)
    command = text.rstrip("\n").splitlines()[-1]
    assert command == ("    python research/qk_norm_25m_study.py --seeds 10 11 12 --until_decided 6 "
                       "--out research_results/qk_norm_50m_study_new_seeds_until6")
    seeds = command.split("--seeds ")[1].split(" --")[0].split()
    assert not {0, 3, 9} & set(map(int, seeds))  # --until_decided's rounds add the integers after 12: new too


def test_nothing_is_added_where_nothing_is_open_or_the_study_was_planned_or_the_kind_has_no_command():
    assert open_questions("qk_norm", INDEX, {"B−C": FAMILY["B−C"]}) == ""
    planned = {**INDEX, "design": {"seeds": [0, 1, 2, 3], "max_seeds": 8, "round": 2},
               "looks": [{"seeds": [0, 1, 2, 3], "alpha": 0.00625, "planned": True}]}
    assert open_questions("qk_norm", planned, FAMILY) == ""
    assert open_questions("pilot", INDEX, FAMILY) == ""
