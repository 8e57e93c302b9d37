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
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from research.analysis.rules import DESCRIPTIVE, NO_DATA, interval_text, needed_text, unmissable_text, untested_text
from research.results.values import json_safe
from research.results.vocabulary import label  # noqa: F401 (re-exported for the figure modules)
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


def write_outputs(folder: str | Path, outputs: dict) -> list[Path]:
    """Write {file name: Figure, dict or text} into folder: everything is rendered in memory first, then each
    file is written atomically; returns the paths in order."""
    blobs = {name: _serialize(name, item) for name, item in outputs.items()}
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
    as put both ends on their side of 0 and of the margin (research.analysis.rules.interval_text)."""
    return f"{interval_text(d, decimals)[1]} ({d.ci_level:.1%})"


def fmt_diff_ci(d, decimals: int) -> str:
    """A Decision's difference, its interval and its level, the difference at the interval's decimals: '-0.80
    [-1.20, -0.40] (98.3%)'."""
    return f"{interval_text(d, decimals)[0]} {fmt_ci(d, decimals)}"


def fmt_rel_ci(d) -> tuple[str, str]:
    """('+10.0%', '[+8.3%, +11.7%]'): a Decision's difference and interval as shares of the compared values' mean,
    with the digits the interval needs against 0 and the margin."""
    return interval_text(d, 1, d.scale)


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
    return f"{fmt_diff_ci(d, decimals)}, {' '.join(fmt_rel_ci(d))} of the mean: {d.outcome}"


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
    more = needed_text(d, unit)
    return (f"not decided ({d.outcome}): {fmt_diff_ci(d, decimals)}, {' '.join(fmt_rel_ci(d))} of the mean"
            + (f"; {more}" if more else ""))


def decision_table(decisions: dict, decimals: int, name_of=str, unit: str = "seed") -> list[str]:
    """Markdown rows of research.analysis.rules Decisions: the difference and its interval, both also as shares
    of the compared values' mean, Bonferroni's p and the outcome read off the interval. `unit`: what the n
    compared values are (seeds; text batches for one model)."""
    rows = ["| comparison | n | difference | CI (level) | % of mean | CI, % of mean | p (Bonferroni) | outcome |",
            "|---|---|---|---|---|---|---|---|"]
    for key, d in decisions.items():
        if not d.tested:
            diff = "n/a" if d.outcome == NO_DATA else f"{d.diff:+.{decimals}f}"
            rel = "n/a" if d.outcome == NO_DATA else f"{d.rel:+.1%}"
            what = {NO_DATA: NO_DATA, DESCRIPTIVE: f"descriptive (one {unit})"}.get(d.outcome) or untested_text(
                d, decimals, unit)
            rows.append(f"| {name_of(key)} | {d.n} | {diff} | n/a | {rel} | n/a | n/a | {what} |")
            continue
        more = "; ".join(x for x in (needed_text(d, unit), unmissable_text(d, decimals)) if x)
        rel, rel_ci = fmt_rel_ci(d)
        rows.append(f"| {name_of(key)} | {d.n} | {interval_text(d, decimals)[0]} | {fmt_ci(d, decimals)} | {rel} | "
                    f"{rel_ci} | {fmt_p(d.p_adj)} | {d.outcome + (f' ({more})' if more else '')} |")
    return rows


@styled
def message_figure(title: str, text: str, size=(8, 4)) -> Figure:
    """A figure that says why there is nothing to draw (instead of a missing or blank file)."""
    fig, ax = subplots(figsize=size)
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=11, transform=ax.transAxes)
    fig.tight_layout()
    return fig
