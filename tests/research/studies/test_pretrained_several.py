"""A pretrained-keys study of several tiny models, one of them without RoPE (GPT-2): it runs, its report opens with
"In short", says what each model's sections measure once and each model's numbers in its own section, and repeats no
long sentence (tests.research.plots.test_report_page.repeated)."""
from __future__ import annotations

import pytest

from research import pretrained_keys_study
from research.plots.in_short import MOST
from research.plots.pretrained_report import NO_ROPE
from research.results.vocabulary import REPORT
from tests.research.inspection.builders import make_hf_model
from tests.research.plots.test_report_page import repeated
from tests.research.studies.stored import _text

FAMILIES = ("llama", "qwen3", "gpt2")


@pytest.mark.slow  # about 5 s on a quiet 2-core CPU: three models measured, each with its untrained twin
def test_three_models_one_without_rope(tmp_path):
    models = [str(make_hf_model(f, tmp_path / f)) for f in FAMILIES]
    out = tmp_path / "study"
    assert pretrained_keys_study.main(["--models", *models, "--text", str(_text(tmp_path)), "--batches", "3",
                                       "--batch", "2", "--seq_len", "16", "--out", str(out), "--no_progress"]) == 0
    report = (out / REPORT).read_text()
    assert report.startswith("# ") and report.split("\n\n")[1] == "## In short"
    short = report.split("## In short\n\n", 1)[1].split("\n\n")[0].splitlines()
    assert 0 < len(short) <= MOST
    assert repeated(report) == {}
    # each model a section of its numbers, in the order given; what they measure said once, before them
    heads = [line for line in report.splitlines() if line.startswith("## ")]
    assert heads[-3:] == [f"## {f}" for f in FAMILIES]  # each by the last part of its path, the table saying whence
    assert all(f"| {f} | {f} ({f}) |" in report and f"| {m} |" in report for f, m in zip(FAMILIES, models))
    assert report.count("Gu et al. 2024") == 1 and report.count("docs/probing.md defines every measure") == 1
    assert report.index("## The models and what their sections measure") < report.index("## llama")
    # the model without RoPE says so once, in its key-cache part; the others show their keys after RoPE
    gpt2 = report.split("## gpt2\n", 1)[1]
    assert report.count(NO_ROPE) == 1 and NO_ROPE in gpt2 and "after RoPE" not in gpt2.replace(NO_ROPE, "")
    assert report.count("- Key rank after RoPE (k_rope") == 2
