"""Every kind's report answers on its first screen and says each sentence at most twice; report.html beside it is one
self-contained page, read in a real browser (headless Chromium); figures carry at most two lines of text."""
from __future__ import annotations

import collections
import re
import tarfile
from pathlib import Path

import pytest

from research import split_panels
from research.plots.common import with_figures
from research.plots.page import OUTCOMES, outcome_of, page, slug
from research.studies.render import load_and_analyze
from tests.browser import needs_chromium, open_page
from tests.helpers import REPO
from tests.research.studies.stored import BUILDERS, STORED, unpack

PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"
       b"\x00\x00\x00\rIDATx\x9cc\xf8\xcf\xc0\xf0\x1f\x00\x05\x00\x01\xff\x89\x99=\x1d\x00\x00\x00\x00IEND\xaeB`\x82")
LONG = 60  # a sentence this long or longer appears at most twice in a report
MOST = 2


def repeated(text: str) -> dict[str, int]:
    """Sentences of LONG characters or more (the text split at . ; : ! ? and line ends) said more than MOST times."""
    counts = collections.Counter(s.strip() for s in re.split(r"[.;:!?\n]", text) if len(s.strip()) >= LONG)
    return {s: n for s, n in counts.items() if n > MOST}


def stored_reports() -> dict[str, str]:
    """Every report.md the repository stores: the stored study folders' drawings, and the docs' own."""
    out = {}
    for archive in sorted(STORED.glob("*.tar.gz")):
        with tarfile.open(archive) as tar:
            member = tar.extractfile("expected/report.md")
            out[archive.name] = member.read().decode() if member else ""
    out.update({str(p.relative_to(REPO)): p.read_text() for p in (REPO / "docs").rglob("report.md")})
    return out


def test_the_sentence_rule_counts_by_hand():
    sentence = "a sentence of sixty characters or more, said here three times"
    assert len(sentence) >= LONG
    assert repeated(f"{sentence}. {sentence}; {sentence}\nshort. short. short.") == {sentence: 3}
    assert repeated(f"{sentence}. {sentence}.") == {}


@pytest.mark.parametrize("name", sorted(stored_reports()))
def test_no_stored_report_says_a_long_sentence_more_than_twice(name):
    text = stored_reports()[name]
    assert text.startswith("# ") and text.split("\n\n")[1] == "## In short", f"{name}: In short is not first"
    assert repeated(text) == {}, name


def test_every_kind_has_a_stored_report_and_docs_keep_the_main_study():
    reports = stored_reports()
    assert {n.removesuffix(".tar.gz") for n in reports if n.endswith(".tar.gz")} == set(BUILDERS)


# ------------------------------------------------------------------------------------------- the page, by hand

REPORT = """# A study

## In short

- key PR, A/B: **different, beyond the margin** +9.0% [+6.0%, +12.0%] (key PR family, k = 3)
- loss, A−B: **inconclusive**‡ -0.1% [-0.9%, +0.7%] (loss family, k = 3)

‡ open at these seeds; to settle it: a new study.

## Final values <b>bold</b>

| comparison | outcome |
|---|---|
| A − B | equal |
| B − C | inconclusive‡ |
| A − C | not decided (different, size unresolved‡): +1 |

![key PR over tokens](2_key_pr.png)

## Final values <b>bold</b>

<script>alert(1)</script> text
"""


def test_the_page_embeds_marks_and_lays_out_by_hand():
    html = page(REPORT, {"2_key_pr.png": PNG})
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # raw HTML escaped, no script
    assert html.count("data:image/png;base64,") == 1 and 'src="2_key_pr.png"' not in html  # embedded, not linked
    assert '<div class="beside">\n<div class="col">\n<table>' in html and html.index("</table>") < \
        html.index("<figure>") < html.index("</figure></div>")  # the figure beside the table it follows
    assert '<td class="o o-equal">equal</td>' in html and '<td class="o o-open">inconclusive‡</td>' in html
    assert '<td class="o o-unresolved">not decided (different, size unresolved‡): +1</td>' in html
    assert '<strong class="o o-beyond">different, beyond the margin</strong>' in html
    assert '<strong class="o o-open">inconclusive</strong>' in html
    legend = html[html.index('<ul class="legend"'):html.index("</section>")]  # inside the In short box
    assert [w for w in OUTCOMES if f">{w}</span>" in legend] == [
        "different, beyond the margin", "equal", "different, size unresolved", "inconclusive"]
    assert html.index('<section class="short">') < html.index('id="in-short"') < html.index("</section>") < \
        html.index('id="final-values-bboldb"')
    assert 'id="final-values-bboldb-1"' in html  # GitHub's ids for a repeated heading
    assert "<title>A study</title>" in html


def test_a_figure_the_report_names_but_was_not_drawn_is_said_not_linked():
    html = page("# T\n\n## In short\n\n- x\n\n![gone](gone.png)\n", {})
    assert "<img" not in html and "gone.png: not drawn" in html


def test_outcome_words_and_ids_by_hand():
    assert outcome_of("different, size unresolved‡") == "different, size unresolved"
    assert outcome_of("different, beyond the margin (a margin that cannot be missed)") == \
        "different, beyond the margin"
    assert outcome_of("equality") is None and outcome_of("n/a") is None
    seen: dict = {}
    assert [slug(t, seen) for t in ("In short", "The write-ups' claims at this scale", "In short")] == [
        "in-short", "the-write-ups-claims-at-this-scale", "in-short-1"]


def test_figures_the_report_does_not_place_are_placed_once_at_its_end():
    report = "# T\n\n![a](a.png)\n"
    out = with_figures(report, {"a.png": object(), "b_c.png": object(), "report.md": ""})
    assert out == "# T\n\n![a](a.png)\n\n## Figures\n\n![b c](b_c.png)\n"
    assert with_figures(out, {"a.png": 1, "b_c.png": 2}) == out


# ------------------------------------------------------------------------------------- every kind, drawn today

@pytest.fixture(scope="module")
def drawn(tmp_path_factory) -> dict[str, Path]:
    """Every stored kind's folder redrawn by split_panels into a folder of its own: kind -> that folder."""
    root = tmp_path_factory.mktemp("drawn")
    out = {}
    for kind in sorted(BUILDERS):
        folder, _ = unpack(kind, root / f"{kind}_stored")
        split_panels.main([str(folder), "--out", str(root / kind)])
        out[kind] = root / kind
    return out


@pytest.mark.slow
def test_every_kind_opens_with_in_short_and_places_each_figure_once(drawn, capsys):
    capsys.readouterr()
    for kind, folder in drawn.items():
        report = (folder / "report.md").read_text()
        assert report.split("\n\n")[1] == "## In short", kind
        short = report.split("## In short\n\n", 1)[1].split("\n\n## ", 1)[0].split("\n\n")[0]
        assert 1 <= len(short.splitlines()) <= 12, kind
        figures = sorted(p.name for p in folder.glob("*.png"))
        html = (folder / "report.html").read_text()
        assert html.count("data:image/png;base64,") == len(figures), kind
        for name in figures:
            assert report.count(f"]({name})") == 1, (kind, name)
        assert repeated(report) == {}, kind


@pytest.mark.slow
def test_every_kinds_figures_carry_at_most_two_lines_below_the_plot(tmp_path):
    for kind in sorted(BUILDERS):
        folder, _ = unpack(kind, tmp_path / kind)
        for name, fig in load_and_analyze(folder).figures.items():
            below = [t for t in fig.texts if t.get_text().strip() and t.get_position()[1] < 0.5]  # not a title
            lines = sum(t.get_text().count("\n") + 1 for t in below)
            assert lines <= 2, (kind, name, [t.get_text() for t in fig.texts])


@pytest.mark.slow
@needs_chromium
@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_every_kinds_page_reads_clean_in_a_real_browser(drawn, kind):
    page_read = open_page(drawn[kind] / "report.html")
    assert page_read.console_errors == [] and page_read.failed == [] and page_read.outside == []
    assert page_read.scripts == 0 and page_read.images and all(ok for _, ok in page_read.images)
    assert page_read.text_visible and page_read.text_top is not None and page_read.text_top < 800
    uri = (drawn[kind] / "report.html").resolve().as_uri()
    assert page_read.requests[0] == uri and all(r == uri or r.startswith("data:") for r in page_read.requests)


def test_the_readme_gives_the_kept_main_report_in_short_and_links_to_its_sections():
    report = (REPO / "docs" / "main_study" / "report.md").read_text()
    readme = (REPO / "README.md").read_text()
    short = report.split("## In short\n\n", 1)[1].split("\n\n## ", 1)[0].strip()
    assert short in readme.split("## What the main study found", 1)[1]
    seen: dict = {}
    anchors = {slug(h, seen) for h in re.findall(r"^#{1,3} (.+)$", report, re.M)}
    linked = re.findall(r"docs/main_study/report\.md#([\w-]+)", readme)
    assert linked and set(linked) <= anchors, set(linked) - anchors
    assert (REPO / "docs" / "figures" / "report_first_screen.png").read_bytes()[:8] == PNG[:8]
