"""Shared figure style: one colour per condition across every figure, and the small helpers
every figure module uses. Figure builders return matplotlib Figures (laid out, not saved);
`save_figures` writes them. Imports matplotlib and numpy only; never torch.

Figures are `matplotlib.figure.Figure` objects made by `subplots` below, never by pyplot, and the
style is applied only while a builder runs (`@styled`): importing these modules changes neither
matplotlib's backend nor its rcParams, so a notebook keeps its own (inline, widget, ...). A Figure
saves without any backend; in Jupyter it displays as the value of a cell.
"""
from __future__ import annotations

import functools
import io
import json
import math
import re
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from research.analysis.rules import DESCRIPTIVE, NO_DATA, OUTLIER_LEVEL, OUTLIERS, RATIOS
from research.analysis.wording import interval_text, margin_bounds, needed_text, plural, unmissable_text, untested_text
from research.results.values import json_safe
from research.results.vocabulary import REPORT, REPORT_PAGE, label  # noqa: F401 (label: re-exported for the figures)
from utils.io import atomic_write_bytes, remove_matching, temp_file_pattern

# Conditions keep their colour in every figure of every study.
CONDITION_COLORS = {
    "QK": "#1f77b4",         # blue: QK-norm with learned gain
    "QK_frozen": "#ff7f0e",  # orange: QK-norm with gain frozen at 1
    "NoQK": "#2ca02c",       # green: no QK-norm
    "NoQK_clip": "#9467bd",  # purple: no QK-norm, QK-clip
    "qk_norm": "#1f77b4",    # the pilot's names
    "no_qk_norm": "#2ca02c",
    "gains_trained": "#1f77b4",  # the fine-tuning study: q/k norm gains trained
    "gains_frozen": "#ff7f0e",   # ... and frozen at their pretrained values
}
# Layer groups (early / middle / final) keep theirs.
GROUP_COLORS = {"early": "#4c72b0", "middle": "#dd8452", "final": "#c44e52"}

STYLE = {
    "figure.dpi": 110, "savefig.dpi": 130, "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10,
    "legend.fontsize": 9, "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
    "axes.spines.right": False,
}


def styled(build):
    """Run a figure builder under STYLE (rcParams are read while artists are made, so the whole builder runs
    inside the context); the process's own rcParams are untouched."""
    @functools.wraps(build)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(STYLE):
            return build(*args, **kwargs)
    return wrapper


@functools.lru_cache(maxsize=1)
def _default_font():
    from matplotlib import font_manager
    with matplotlib.rc_context(STYLE):
        return font_manager.get_font(font_manager.findfont(font_manager.FontProperties()))


@functools.lru_cache(maxsize=65536)
def _drawable_char(c: str) -> str:
    if c == "$":
        return r"\$"  # two of them would start mathtext
    if c.isprintable() and (c == " " or _default_font().get_char_index(ord(c)) != 0):
        return c
    if not c.isprintable():
        return repr(c)[1:-1]
    return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"


def drawable(text: str, limit: int | None = None) -> str:
    """`text` as a figure label the default font draws without a 'Glyph missing' warning: characters it
    has stay (a token's leading space too), control and invisible characters are escaped as repr does
    (\\n, \\x00, \\u200b), characters it lacks (CJK, emoji) become \\uXXXX / \\UXXXXXXXX, and $ is escaped
    (mathtext); cut to `limit` characters."""
    out = "".join(_drawable_char(c) for c in text)
    return out if limit is None else out[:limit]


def subplots(nrows: int = 1, ncols: int = 1, *, figsize=None, layout=None, **kwargs):
    """(Figure, axes) like pyplot.subplots, but a plain Figure that no pyplot state or backend holds."""
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=figsize, layout=layout)
        return fig, fig.subplots(nrows, ncols, **kwargs)


def color(condition: str) -> str:
    return CONDITION_COLORS.get(condition, "#7f7f7f")


def tokens_axis(ax, tokens) -> np.ndarray:
    """x values in millions of tokens, with the axis labelled accordingly."""
    ax.set_xlabel("training tokens (millions)")
    return np.asarray(tokens, dtype=float) / 1e6


def smooth(y, window: int) -> np.ndarray:
    """Centered moving average that keeps the length (shorter windows at the ends); None -> nan."""
    y = np.array([np.nan if v is None else v for v in y], dtype=float)
    if window <= 1 or len(y) < 3:
        return y
    out = np.empty_like(y)
    h = window // 2
    for i in range(len(y)):
        out[i] = np.nanmean(y[max(0, i - h): i + h + 1])
    return out


def _serialize(name: str, item) -> bytes:
    """A Figure as the image its file name asks for, a dict as JSON (NaN as null), text as UTF-8."""
    if isinstance(item, Figure):
        buf = io.BytesIO()
        with matplotlib.rc_context(STYLE):  # savefig.dpi
            item.savefig(buf, format=Path(name).suffix.lstrip(".") or "png")
        return buf.getvalue()
    if isinstance(item, dict):
        return (json.dumps(json_safe(item), indent=2) + "\n").encode("utf-8")
    return str(item).encode("utf-8")


def with_page(blobs: dict[str, bytes]) -> dict[str, bytes]:
    """{file name: bytes} with report.html right after report.md where there is one: the same text and the same
    figure bytes as one page (research.plots.page)."""
    if REPORT not in blobs:
        return blobs
    from research.plots.page import page  # markdown-it-py is needed only where a report is written
    images = {name: data for name, data in blobs.items() if name.endswith(".png")}
    html = page(blobs[REPORT].decode("utf-8"), images).encode("utf-8")
    out: dict[str, bytes] = {}
    for name, data in blobs.items():
        out[name] = data
        if name == REPORT:
            out[REPORT_PAGE] = html
    return out


def write_outputs(folder: str | Path, outputs: dict) -> list[Path]:
    """Write {file name: Figure, dict or text} into folder: everything is rendered in memory first (report.md's page,
    report.html, beside it: with_page), then each file is written atomically; returns the paths in order."""
    blobs = with_page({name: _serialize(name, item) for name, item in outputs.items()})
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name in blobs:  # temporary files a killed writer left
        remove_matching(folder, temp_file_pattern(name))
    for name, data in blobs.items():
        atomic_write_bytes(folder / name, data)
    return [folder / name for name in blobs]


def save_figures(folder: str | Path, figures: dict[str, Figure]) -> list[Path]:
    """Write each figure as folder/<name> (atomically); returns the paths in order."""
    return write_outputs(folder, figures)


def figure_line(name: str, what: str) -> str:
    """A figure placed in a report, in Markdown: '![what](name)', put right after the table or paragraph it explains;
    report.html (research.plots.page) embeds the figure there, beside that table; with_figures places the rest."""
    return f"![{what}]({name})"


def cell_text(text: str) -> str:
    """`text` as one cell of a Markdown table: its pipes escaped (a quantity named '|k_i|' would split the row)."""
    return str(text).replace("|", "\\|")


def placed(report: str) -> set[str]:
    """The figure files `report` places (common.figure_line: '![what](name)')."""
    return set(re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", report))


def with_figures(report: str, outputs: dict) -> str:
    """`report` with a closing "Figures" section placing every figure of `outputs` (names ending .png) that it does
    not place itself, so that report.html shows each figure drawn, once."""
    missing = [name for name in outputs if name.endswith(".png") and name not in placed(report)]
    if not missing:
        return report
    return report.rstrip("\n") + "\n\n## Figures\n\n" + "\n\n".join(
        f"![{name.removesuffix('.png').replace('_', ' ')}]({name})" for name in missing) + "\n"


def fmt_num(v, nd: int = 3) -> str:
    """A number for a report table; None and NaN read as n/a."""
    return "n/a" if v is None or not np.isfinite(v) else f"{v:.{nd}f}"


def fmt_code(provenance: dict | None) -> str:
    """The code a result was made with, from its provenance (utils.runtime.provenance): 'git 0123456789' (the
    commit's first 10 digits, '-dirty' kept), 'no git commit (qk-keys 0.1.0)' where the code was no git checkout
    (an installed copy; 'qk-keys not installed' without a version either), 'git commit not recorded' for files
    that predate the version field and hold no commit."""
    prov = provenance if isinstance(provenance, dict) else {}
    commit = prov.get("git_commit")
    if isinstance(commit, str) and commit:
        return f"git {commit[:10]}" + ("-dirty" if commit.endswith("-dirty") and len(commit) > 16 else "")
    if "qk_keys" in prov:
        version = prov["qk_keys"]
        return f"no git commit (qk-keys {version})" if version else "no git commit (qk-keys not installed)"
    return "git commit not recorded"


def fmt_tokens(t: float) -> str:
    """Token counts as 12.3M / 456k / 789."""
    if not np.isfinite(t):
        return "?"
    if t >= 1e6:
        return f"{t / 1e6:.3g}M"
    if t >= 1e3:
        return f"{t / 1e3:.3g}k"
    return f"{t:.0f}"


def fmt_p(p: float) -> str:
    if not math.isfinite(p):
        return "n/a"
    return f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}"


def fmt_ci(d, decimals: int) -> str:
    """A Decision's interval and its level: '[-1.20, -0.40] (98.3%)', at least `decimals` decimals and as many more
    as put both ends on their side of 0 and of the margin (research.analysis.wording.interval_text). One decided on log
    ratios has no interval in units and gives its ratio's: 'ratio [-8.1%, +1.6%] (98.3%)' (A/B - 1), its ends on
    their side of 0 and of the margin's printed bounds, exp(+-m) - 1."""
    return f"{_ratio_word(d)}{interval_text(d, decimals)[1]} ({d.ci_level:.1%})"


def _ratio_word(d) -> str:
    return "ratio " if d.ratio else ""


def fmt_diff_ci(d, decimals: int) -> str:
    """A Decision's difference, its interval and its level, the difference at the interval's decimals: '-0.80
    [-1.20, -0.40] (98.3%)'; decided on log ratios, the ratio minus 1: 'ratio -4.9% [-8.1%, -1.6%] (98.3%)'."""
    est, ci = interval_text(d, decimals)
    return f"{_ratio_word(d)}{est} {ci} ({d.ci_level:.1%})"


def fmt_diff(d, decimals: int) -> str:
    """A Decision's mean difference in units: at its interval's decimals (interval_text) where it has an interval in
    units, else at `decimals` (untested, or decided on log ratios, whose interval is the ratio's); 'n/a' without
    paired values."""
    if d.outcome == NO_DATA:
        return "n/a"
    return interval_text(d, decimals)[0] if d.tested and not d.ratio else f"{d.diff:+.{decimals}f}"


def fmt_rel_ci(d) -> tuple[str, str]:
    """('+10.0%', '[+8.3%, +11.7%]'): a Decision's difference and interval as shares of the compared values' mean
    (decided on log ratios: the ratio minus 1 and its interval), with the digits the interval needs against 0 and
    the margin."""
    return interval_text(d, 1, d.scale)


def shown_effect(d) -> tuple[float, float, float]:
    """(estimate, low, high) of a Decision as a figure draws it: the mean difference and its interval in units, or for
    one decided on log ratios the ratio minus 1 and its interval, in %."""
    if d.ratio:
        lo, hi = d.ci_rel
        return 100 * d.rel, 100 * lo, 100 * hi
    return d.diff, d.ci[0], d.ci[1]


def shown_margin(d) -> tuple[float, float]:
    """A Decision's margin on the scale shown_effect draws: +-margin in units, or the ratio's bounds in %
    (research.analysis.wording.margin_bounds)."""
    lo, hi = margin_bounds(d)
    return (100 * lo, 100 * hi) if d.ratio else (lo, hi)


def effect_bars(decisions: list) -> tuple[np.ndarray, np.ndarray | None, bool]:
    """(heights, error bars [2, n] or None, on ratios) of Decisions drawn as bars: shown_effect's estimates and their
    intervals, on ratios (in %) where every one was decided on log ratios."""
    shown = np.array([shown_effect(d) for d in decisions], float).reshape(-1, 3)
    err = np.abs(shown[:, 1:].T - shown[:, 0])
    return shown[:, 0], (err if np.isfinite(err).any() else None), bool(decisions) and all(d.ratio for d in decisions)


def fmt_at(tokens) -> str:
    """The probe(s) values come from: 'at 300k tokens'; several budgets are all named ('at 300k / 600k tokens')."""
    ts = sorted({float(t) for t in np.atleast_1d(np.asarray(tokens, float)) if np.isfinite(t)})
    return f"at {' / '.join(fmt_tokens(t) for t in ts) or '?'} tokens"


def fmt_final(tokens) -> str:
    """Where a "final" value comes from: 'final (at 300k tokens)'."""
    return f"final ({fmt_at(tokens)})"


def decided_text(d, decimals: int, unit: str = "seed") -> str:
    """A comparison as far as its decision goes: '+3.00 [+2.50, +3.50] (95.0%), +10.0% [+8.3%, +11.7%] of the mean:
    different, beyond the margin' when its size is settled, undecided_text otherwise."""
    if not d.decided:
        return undecided_text(d, decimals, unit)
    return f"{_compared_text(d, decimals)}: {d.outcome}"


def _compared_text(d, decimals: int) -> str:
    """A tested comparison's estimates: '+3.00 [+2.50, +3.50] (95.0%), +10.0% [+8.3%, +11.7%] of the mean'; decided
    on log ratios, '+1.23 mean difference; ratio +4.1% [+2.0%, +6.3%] (98.8%)' (a difference in units has no interval
    there). Each interval with the digits its ends need (fmt_diff_ci, fmt_rel_ci)."""
    if d.ratio:
        return f"{d.diff:+.{decimals}f} mean difference; {fmt_diff_ci(d, decimals)}"
    return f"{fmt_diff_ci(d, decimals)}, {' '.join(fmt_rel_ci(d))} of the mean"


def undecided_text(d, decimals: int, unit: str = "seed") -> str:
    """A comparison whose size is not settled, as a report says it: 'not decided (inconclusive): +0.194
    [-2.600, +2.200] (98.3%), +12.0% of the mean; about 9 seeds would settle it'. Nothing derived from it (a share,
    a ranking, a count) may stand beside this."""
    if d.outcome == NO_DATA:
        return f"not decided ({NO_DATA})"
    if d.outcome == DESCRIPTIVE:
        return f"not decided (one {unit}, no test): {d.diff:+.{decimals}f}"
    if not d.tested:
        return f"not decided ({untested_text(d, decimals, unit)})"
    return f"not decided ({d.outcome}{needed_text(d, unit)}): {_compared_text(d, decimals)}"


def decision_table(decisions: dict, decimals: int, name_of=str, unit: str = "seed",
                   what: str = "comparison") -> list[str]:
    """Markdown rows of research.analysis.rules Decisions: the difference and its interval, both also as shares
    of the compared values' mean, Bonferroni's p, the outcome read off the interval, and each seed's value (outliers
    marked). `unit`: what the n compared values are (seeds; text batches for one model). `what`: the first column's
    header, what its rows compare (a report of several such tables names the quantity there, so that no two headers
    are the same line). A comparison decided on log ratios (Decision.ratio) gives its mean difference in units and its
    ratio with the ratio's interval; a table of them alone has columns for that, a mixed one says per row. A note
    under the table explains marks and points to the ratio rule."""
    ratios = [d.ratio for d in decisions.values()]
    what = cell_text(what)
    if ratios and all(ratios):
        rows = [f"| {what} | n | mean difference | ratio \u2212 1 | CI of ratio \u2212 1 (level) | "
                f"p (Bonferroni) | outcome | per {unit} (ratio \u2212 1) |", "|---|---|---|---|---|---|---|---|"]
    else:
        rows = [f"| {what} | n | difference | CI (level) | % of mean | CI, % of mean | p (Bonferroni) | outcome | "
                f"per {unit} |", "|---|---|---|---|---|---|---|---|---|"]
    for key, d in decisions.items():
        cells = _decision_cells(d, decimals, unit, all(ratios))
        rows.append(f"| {name_of(key)} | {d.n} | " + " | ".join(cells) + f" | {per_seed_text(d, decimals)} |")
    return rows + table_notes(decisions.values(), unit)


def _decision_cells(d, decimals: int, unit: str, ratio_columns: bool) -> list[str]:
    """A decision's cells between n and the per-seed values: difference, interval(s), p and outcome; each interval
    with the digits its ends need against 0 and the margin (fmt_ci, fmt_rel_ci), the estimates at its decimals, and
    a margin that cannot be missed marked beside the outcome (wording.unmissable_text)."""
    if not d.tested:
        what = {NO_DATA: NO_DATA, DESCRIPTIVE: f"descriptive (one {unit})"}.get(d.outcome) or untested_text(
            d, decimals, unit)
    else:
        unmissable = unmissable_text(d, decimals)
        what = d.outcome + needed_text(d, unit) + (f" ({unmissable})" if unmissable else "")
    diff = fmt_diff(d, decimals)
    rel = "n/a" if d.outcome == NO_DATA else f"{d.rel:+.1%}"
    p = fmt_p(d.p_adj) if d.tested else "n/a"
    rel_ci = "n/a"
    if d.tested:
        rel, rel_ci = fmt_rel_ci(d)
    if ratio_columns:
        return [diff, rel, f"{rel_ci} ({d.ci_level:.1%})" if d.tested else "n/a", p, what]
    if d.ratio:  # a ratio among differences: no interval in units; its % columns are the ratio's
        return [diff, "on ratios", f"{rel} (ratio)", fmt_ci(d, decimals) if d.tested else "n/a", p, what]
    if not d.tested:
        return [diff, "n/a", rel, "n/a", p, what]
    return [diff, fmt_ci(d, decimals), rel, rel_ci, p, what]


def per_seed_text(d, decimals: int) -> str:
    """Each compared value of a Decision in seed order: its difference in units, or the ratio minus 1 of one decided
    on log ratios, an outlier marked \u2020 (rules.outliers): '-5.1%, -4.2%, -6.0%, -24.9%\u2020'."""
    if not d.values:
        return "n/a"
    order = _seed_order(d.seeds, len(d.values))
    marks, shown = d.outliers, d.per_seed
    text = [(f"{shown[i]:+.1%}" if d.ratio else f"{shown[i]:+.{decimals}f}") + (OUTLIER_MARK if marks[i] else "")
            for i in order]
    return ", ".join(text)


OUTLIER_MARK = "\u2020"


def _seed_order(seeds, n: int) -> list[int]:
    """Indices of the values in seed order (numbers before names), as given where the seeds are not known."""
    if seeds is None or len(seeds) != n:
        return list(range(n))
    return sorted(range(n), key=lambda i: (not isinstance(seeds[i], int), str(seeds[i]).zfill(12)))


# Under a table with ratios: a pointer, the rule itself being said once per report, in its procedure's paragraph
# (wording.ratio_text); every sentence of it shorter than a line, so that a report of many tables repeats no long one
RATIO_NOTE = "Ratios: from per-{unit} log ratios (the ratio rule: " + RATIOS + ")."


def table_notes(decisions, unit: str = "seed", ratios: bool = True) -> list[str]:
    """The lines under a decision table that point to the ratio rule where it has ratios (RATIO_NOTE; unless `ratios`
    is False: the table says it), its fall-backs to differences and its outlier marks; [] where it has none. The rule
    itself, ratio_text, is the report's procedure paragraph's."""
    notes, decisions = [], list(decisions)
    if ratios and any(d.ratio for d in decisions):
        notes.append(RATIO_NOTE.format(unit=unit))
    if any(d.note for d in decisions):
        notes += [d.note + "." for d in decisions if d.note]
    if any(any(d.outliers) for d in decisions):
        notes.append(f"{OUTLIER_MARK} outlier: a {unit} whose value lies outside the {OUTLIER_LEVEL:.0%} prediction "
                     f"interval of the other {plural(unit)}' values ({OUTLIERS}).")
    return ["", *notes] if notes else []


@styled
def message_figure(title: str, text: str, size=(8, 4)) -> Figure:
    """A figure that says why there is nothing to draw (instead of a missing or blank file)."""
    fig, ax = subplots(figsize=size)
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=11, transform=ax.transAxes)
    fig.tight_layout()
    return fig
