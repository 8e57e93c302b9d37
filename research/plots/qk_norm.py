"""Figures and report of the QK-norm study: learned gain (A), gain frozen at 1 (B), no QK-norm (C).

Everything here is drawn from results dicts alone (research.results schema; files that carry only the
write-ups' fields work too) and imports neither torch nor the model.

    runs = {"QK": [res_seed0, res_seed1, ...], "QK_frozen": [...], "NoQK": [...]}
    render(folder, runs)        -> the five PNGs
    write_report(folder, runs)  -> report.md
    summary(runs)               -> per-condition finals for combined.json

Conditions may be missing (e.g. only QK and NoQK) and may have one run or several seeds. With one run the
figures show plain lines; with several, the mean over seeds and a shaded 95% confidence band
(research.stats.mean_ci95 at each probe, over the probes all seeds of a condition share).

"Final" values are the last entry of a run's `mean_pr`, `loss` and `val_loss`.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib.transforms as mtransforms
import numpy as np

from research.plots.common import color, label, plt, save, tokens_axis
from research.stats import diff_ci95, mean_ci95, roughly_equal, spearman_rho, welch_t_test

CONDITIONS = ("QK", "QK_frozen", "NoQK")
LETTERS = {"QK": "A", "QK_frozen": "B", "NoQK": "C"}
FIGURES = ("1_loss.png", "2_key_pr_causal.png", "3_per_layer.png", "4_causal_decomposition.png",
           "5_gamma_cv.png")

# The equality rule (stated in report.md): two conditions are "equal" in a quantity when the difference of
# their means is below REL_TOL of the mean of the two, AND, when both have >= 2 seeds, Welch's t-test does
# not reject equality at ALPHA. Key PR differences of a few percent are visible in the write-ups' curves;
# losses of the three conditions sit within ~2% of each other, so loss uses a finer threshold (0.5% is
# ~0.02 nats at loss 3.6).
PR_REL_TOL = 0.03
LOSS_REL_TOL = 0.005
ALPHA = 0.05
# U-shaped trajectory: the minimum of mean_pr lies strictly inside, and both the start and the end are
# above the minimum by at least U_MARGIN of the minimum.
U_MARGIN = 0.05
_FROZEN_ZERO = 1e-9

_SITE = "k_norm output, pre-RoPE"


# ---------------------------------------------------------------------------------------------------------
# Data helpers


def _conditions(runs: dict) -> list[str]:
    """Conditions with at least one run: the study's three in A, B, C order, then any others."""
    known = [c for c in CONDITIONS if runs.get(c)]
    return known + [c for c in runs if c not in CONDITIONS and runs.get(c)]


def _runs(runs: dict, cond: str) -> list[dict]:
    r = runs.get(cond) or []
    return [r] if isinstance(r, dict) else list(r)


def _name(cond: str) -> str:
    """'A: QK-norm, learned gain (QK)' for the study's conditions; the label for others."""
    letter = LETTERS.get(cond)
    return f"{letter}: {label(cond)} ({cond})" if letter else f"{label(cond)} ({cond})"


def _num(v) -> float:
    return math.nan if v is None else float(v)


def _last(res: dict, field: str) -> float:
    values = res.get(field) or []
    return _num(values[-1]) if values else math.nan


def _finals(runs: dict, cond: str, field: str) -> list[float]:
    return [_last(r, field) for r in _runs(runs, cond)]


def _aligned(run_list: list[dict], get) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, Y[n_runs, n_probes]) over the token counts every run has; None -> nan.

    `get(res)` returns a per-probe list of the run (e.g. res["mean_pr"])."""
    if not run_list:
        return np.zeros(0), np.zeros((0, 0))
    common = set(run_list[0]["tokens"])
    for r in run_list[1:]:
        common &= set(r["tokens"])
    tokens = sorted(common)
    y = np.full((len(run_list), len(tokens)), np.nan)
    for i, r in enumerate(run_list):
        values = get(r)
        if values is None:
            continue
        where = {t: j for j, t in enumerate(r["tokens"])}
        for k, t in enumerate(tokens):
            j = where[t]
            if j < len(values):
                y[i, k] = _num(values[j])
    return np.asarray(tokens, dtype=float), y


def _mean_band(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column-wise mean and 95% CI half width (nan where fewer than 2 finite values)."""
    mean = np.full(y.shape[1], np.nan)
    half = np.full(y.shape[1], np.nan)
    for k in range(y.shape[1]):
        mean[k], half[k] = mean_ci95(y[:, k])
    return mean, half


def _layers(res_list: list[dict], field: str = "layer_pr") -> list[str]:
    keys: set[str] = set()
    for r in res_list:
        keys |= set((r.get(field) or {}).keys())
    return sorted(keys, key=lambda k: (int(k) if str(k).lstrip("-").isdigit() else math.inf, str(k)))


def _head_dim(runs: dict) -> int | None:
    """D (key dimension) from the config or from the recorded gain values, if any run carries it."""
    for cond in _conditions(runs):
        for r in _runs(runs, cond):
            model = (r.get("config") or {}).get("model") or {}
            if model.get("head_dim"):
                return int(model["head_dim"])
            if model.get("d_model") and model.get("n_heads"):
                return int(model["d_model"]) // int(model["n_heads"])
            for values in (r.get("gamma_final") or {}).values():
                if values:
                    return len(values)
    return None


def _seed_note(runs: dict) -> str:
    ns = sorted({len(_runs(runs, c)) for c in _conditions(runs)})
    if ns == [1]:
        return "one run per condition"
    return f"mean of {'/'.join(map(str, ns))} seeds, shaded: 95% CI"


def _plot_series(ax, x, y, cond, *, ls="-", marker=None, lw=2.0, with_label=True, ms=3.5):
    """One condition's line: the single run, or mean over seeds with its 95% CI band."""
    mean, half = _mean_band(y) if y.shape[0] > 1 else (y[0], np.full(y.shape[1], np.nan))
    lab = _name(cond) + (f", n={y.shape[0]}" if y.shape[0] > 1 else "") if with_label else None
    ax.plot(x, mean, ls=ls, color=color(cond), lw=lw, marker=marker, ms=ms, label=lab)
    if y.shape[0] > 1 and np.isfinite(half).any():
        ax.fill_between(x, mean - half, mean + half, color=color(cond), alpha=0.18, lw=0)
    return mean, half


def _message_figure(path: Path, title: str, message: str) -> Path:
    fig, ax = plt.subplots(figsize=(9, 5))
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, wrap=True, transform=ax.transAxes)
    return save(fig, path)


def _end_labels(ax, items: list[tuple[float, float, str, str]], decimals: int = 1):
    """Value labels just right of the lines' last points, nudged apart vertically so they never overlap."""
    items = sorted((it for it in items if np.isfinite(it[1])), key=lambda it: it[1])
    if not items:
        return
    ax.margins(x=0.07)
    lo, hi = ax.get_ylim()
    gap = 0.05 * (hi - lo)
    placed: list[float] = []
    for it in items:
        placed.append(it[1] if not placed else max(it[1], placed[-1] + gap))
    shift = max(0.0, placed[-1] - (hi - 0.5 * gap))
    to_right = mtransforms.offset_copy(ax.transData, fig=ax.figure, x=6, units="points")
    for (xv, yv, text_color, _), yp in zip(items, placed):
        ax.text(xv, yp - shift, f"{yv:.{decimals}f}", transform=to_right, ha="left", va="center",
                color=text_color, fontsize=9, fontweight="bold", clip_on=False)


# ---------------------------------------------------------------------------------------------------------
# Figures


def _fig_loss(folder: Path, runs: dict) -> Path:
    conds = _conditions(runs)
    path = folder / FIGURES[0]
    if not conds:
        return _message_figure(path, "Training and validation loss", "no runs")
    series = {}
    for c in conds:
        x, tr = _aligned(_runs(runs, c), lambda r: r["loss"])
        _, va = _aligned(_runs(runs, c), lambda r: r["val_loss"])
        series[c] = (x / 1e6, tr, va)
    xmax = max((np.nanmax(s[0]) for s in series.values() if len(s[0])), default=0.0)
    n_zoom = max((int(np.sum(s[0] >= 0.5 * xmax)) for s in series.values()), default=0)
    zoom = n_zoom >= 4
    fig, axes = plt.subplots(1, 2 if zoom else 1, figsize=(13, 5.2) if zoom else (9, 5.2), squeeze=False)
    axes = axes[0]
    ranges = []
    for k, ax in enumerate(axes):
        for c in conds:
            x, tr, va = series[c]
            tokens_axis(ax, x * 1e6)
            m_tr, h_tr = _plot_series(ax, x, tr, c, ls="-", lw=2.0, with_label=(k == 0))
            m_va, h_va = _plot_series(ax, x, va, c, ls="--", lw=1.6, with_label=False)
            if k == 1:
                sel = x >= 0.5 * xmax
                for m, h in ((m_tr, h_tr), (m_va, h_va)):
                    h = np.where(np.isfinite(h), h, 0.0)
                    ranges += [np.nanmin((m - h)[sel]) if np.isfinite(m[sel]).any() else np.nan,
                               np.nanmax((m + h)[sel]) if np.isfinite(m[sel]).any() else np.nan]
        ax.set_ylabel("loss (nats per token)")
    axes[0].set_title(f"Training and validation loss ({_seed_note(runs)})")
    if zoom:
        ax = axes[1]
        ax.set_xlim(0.5 * xmax - 0.01 * xmax, xmax * 1.01)
        finite = [v for v in ranges if np.isfinite(v)]
        if finite:
            lo, hi = min(finite), max(finite)
            pad = 0.08 * (hi - lo if hi > lo else 1.0)
            ax.set_ylim(lo - pad, hi + pad)
        ax.set_title("Zoom: second half of training (numbers: final train loss)")
        _end_labels(ax, [(series[c][0][-1], _nanmean_last(series[c][1]), color(c), c) for c in conds], 3)
    style = [plt.Line2D([], [], color="0.25", ls="-", lw=2.0, label="train (mean over the last probe_every steps)"),
             plt.Line2D([], [], color="0.25", ls="--", lw=1.6, label="validation")]
    handles, labels = axes[0].get_legend_handles_labels()
    axes[0].legend(handles + style, labels + [h.get_label() for h in style], loc="upper right")
    return save(fig, path)


def _nanmean_last(y: np.ndarray) -> float:
    if y.size == 0:
        return math.nan
    col = y[:, -1]
    return float(np.nanmean(col)) if np.isfinite(col).any() else math.nan


def _fig_mean_pr(folder: Path, runs: dict) -> Path:
    conds = _conditions(runs)
    path = folder / FIGURES[1]
    title = "Mean key PR over training: does the gain or the normalization drive it?"
    if not conds:
        return _message_figure(path, title, "no runs")
    fig, ax = plt.subplots(figsize=(10, 5.8))
    ends, starts = [], []
    for c in conds:
        x, y = _aligned(_runs(runs, c), lambda r: r["mean_pr"])
        if not len(x):
            continue
        x = tokens_axis(ax, x)
        mean, _ = _plot_series(ax, x, y, c, marker="o", lw=2.2)
        ends.append((x[-1], mean[-1], color(c), c))
        if x[0] == 0 and np.isfinite(mean[0]):
            starts.append(mean[0])
    if starts:
        init = float(np.mean(starts))
        ax.axhline(init, color="0.45", ls=":", lw=1.3, label=f"value at initialization ({init:.1f})")
    d = _head_dim(runs)
    ax.set_ylabel("mean key PR over layers (effective dimensions" + (f", max {d})" if d else ")"))
    ax.set_title(f"{title}\n({_SITE}; {_seed_note(runs)})")
    _end_labels(ax, ends)
    ax.legend(loc="best")
    tri = triangulate(runs)
    fig.text(0.01, 0.01, f"Verdict at the last probe: {tri['verdict']}.   Rule: {tri['rule_short']}",
             fontsize=9, color="0.2", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def _layer_matrix(run_list: list[dict], layers: list[str], probe: int) -> tuple[np.ndarray, float]:
    """Y[n_runs, n_layers] of layer_pr at the common probe `probe` (-1: last, 0: first); tokens there."""
    tokens = sorted(set.intersection(*(set(r["tokens"]) for r in run_list))) if run_list else []
    if not tokens:
        return np.full((len(run_list), len(layers)), np.nan), math.nan
    t = tokens[probe]
    y = np.full((len(run_list), len(layers)), np.nan)
    for i, r in enumerate(run_list):
        j = r["tokens"].index(t)
        for k, layer in enumerate(layers):
            values = (r.get("layer_pr") or {}).get(layer)
            if values is not None and j < len(values):
                y[i, k] = _num(values[j])
    return y, float(t)


def _fig_per_layer(folder: Path, runs: dict) -> Path:
    conds = _conditions(runs)
    path = folder / FIGURES[2]
    all_runs = [r for c in conds for r in _runs(runs, c)]
    layers = _layers(all_runs)
    if not layers:
        return _message_figure(path, "Key PR per layer", "no per-layer PR (layer_pr) in these runs")
    xs = np.arange(len(layers))
    fig, ax = plt.subplots(figsize=(10, 5.5))
    last_tokens, init = [], []
    for c in conds:
        y, t = _layer_matrix(_runs(runs, c), layers, -1)
        last_tokens.append(t)
        _plot_series(ax, xs, y, c, marker="o", lw=2.0)
        y0, t0 = _layer_matrix(_runs(runs, c), layers, 0)
        if t0 == 0:
            init.append(np.nanmean(y0, axis=0))
    if init:
        ax.plot(xs, np.nanmean(np.vstack(init), axis=0), color="0.45", ls=":", lw=1.5,
                label="at initialization (mean of conditions)")
    ax.set_xticks(xs if len(xs) <= 16 else xs[::2])
    ax.set_xticklabels([layers[i] for i in (xs if len(xs) <= 16 else xs[::2])])
    ax.set_xlabel("layer index (0 = first)")
    d = _head_dim(runs)
    ax.set_ylabel("key PR (effective dimensions" + (f", max {d})" if d else ")"))
    t_txt = ", ".join(sorted({f"{t / 1e6:.3g}M" for t in last_tokens if np.isfinite(t)}))
    ax.set_title(f"Key PR per layer at the last probe ({t_txt} tokens)\n({_SITE}; {_seed_note(runs)})")
    ax.legend(loc="best")
    return save(fig, path)


def _fig_decomposition(folder: Path, runs: dict) -> Path:
    path = folder / FIGURES[3]
    title = "Causal decomposition of the final key PR per layer"
    have = [c for c in CONDITIONS if runs.get(c)]
    diffs = []
    if "QK" in have and "QK_frozen" in have:
        diffs.append(("QK", "QK_frozen", "gain effect A\u2212B (learned \u2212 frozen gain)", "#6a3d9a"))
    if "QK_frozen" in have and "NoQK" in have:
        diffs.append(("QK_frozen", "NoQK", "normalization effect B\u2212C (frozen gain \u2212 no QK-norm)", "#b15928"))
    if not diffs and "QK" in have and "NoQK" in have:
        diffs.append(("QK", "NoQK", "total QK-norm effect A\u2212C (no frozen-gain run to split it)", "#555555"))
    if not diffs:
        return _message_figure(path, title, "needs at least two of the conditions QK, QK_frozen, NoQK; "
                                            f"found: {', '.join(have) or 'none'}")
    layers = _layers([r for c in have for r in _runs(runs, c)])
    if not layers:
        return _message_figure(path, title, "no per-layer PR (layer_pr) in these runs")
    mats = {c: _layer_matrix(_runs(runs, c), layers, -1)[0] for c in have}
    xs = np.arange(len(layers))
    fig, ax = plt.subplots(figsize=(12, 5.5))
    width = 0.8 / len(diffs)
    totals = []
    for k, (a, b, text, col) in enumerate(diffs):
        d = np.array([diff_ci95(mats[a][:, i], mats[b][:, i]) for i in range(len(layers))])
        mean, half = d[:, 0], d[:, 1]
        totals.append(mean)
        err = half if np.isfinite(half).any() else None
        ax.bar(xs + (k - (len(diffs) - 1) / 2) * width, mean, width, color=col, alpha=0.85,
               yerr=err, capsize=2 if err is not None else 0, error_kw={"lw": 0.8},
               label=f"{text}; mean over layers {np.nanmean(mean):+.1f}")
    if len(diffs) == 2:
        total = totals[0] + totals[1]
        ax.plot(xs, total, "D", color="black", ms=4, label=f"total A\u2212C (sum); mean {np.nanmean(total):+.1f}")
    ax.axhline(0, color="black", lw=0.8)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + 0.22 * (hi - lo))  # headroom so the legend covers no bar
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i].startswith("total"))
    ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="best")
    ax.set_xticks(xs if len(xs) <= 16 else xs[::2])
    ax.set_xticklabels([layers[i] for i in (xs if len(xs) <= 16 else xs[::2])])
    ax.set_xlim(-0.7, len(xs) - 0.3)
    ax.set_xlabel("layer index (0 = first)")
    ax.set_ylabel("difference in key PR at the last probe\n(effective dimensions)")
    bars = "bars: one run per condition" if all(m.shape[0] == 1 for m in mats.values()) else \
        "bars: difference of seed means, error bars: 95% CI (Welch)"
    ax.set_title(f"{title}: above 0 = the first condition has the higher rank\n({bars})")
    return save(fig, path)


def _fig_gamma_cv(folder: Path, runs: dict) -> Path:
    path = folder / FIGURES[4]
    title = "Spread of the k_norm gain over its dimensions (coefficient of variation)"
    conds = [c for c in _conditions(runs) if any(r.get("gamma_cv") for r in _runs(runs, c))]
    if not conds:
        return _message_figure(path, title, "No QK-norm gain in these runs:\nno condition recorded gamma_cv "
                                            "(only QK-norm conditions have a k_norm gain).")
    layers = _layers([r for c in conds for r in _runs(runs, c)], "gamma_cv")
    picks = sorted({layers[0], layers[len(layers) // 2], layers[-1]}, key=layers.index)
    names = {layers[0]: "first", layers[len(layers) // 2]: "middle", layers[-1]: "last"}
    fig, axes = plt.subplots(1, len(picks), figsize=(4.3 * len(picks) + 0.5, 4.8), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, layer in zip(axes, picks):
        for c in conds:
            run_list = [r for r in _runs(runs, c) if layer in (r.get("gamma_cv") or {})]
            if not run_list:
                continue
            x, y = _aligned(run_list, lambda r, layer=layer: r["gamma_cv"][layer])
            x = tokens_axis(ax, x)
            _plot_series(ax, x, y, c, lw=2.0, with_label=False)
        ax.set_title(f"layer {layer} ({names[layer]})")
    axes[0].set_ylabel("CV of the k_norm gain (std / |mean| over D)")
    handles = []
    for c in conds:
        zero = all(abs(v) < _FROZEN_ZERO for r in _runs(runs, c) for vals in r["gamma_cv"].values()
                   for v in vals if v is not None)
        handles.append(plt.Line2D([], [], color=color(c), lw=2.0,
                                  label=_name(c) + (": CV = 0 throughout (gain fixed at 1)" if zero else "")))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 2), frameon=False)
    fig.suptitle(f"{title}\n({_seed_note(runs)})")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def render(folder, runs: dict) -> list[Path]:
    """Write the study's five figures into `folder`; returns their paths in order.

    runs: condition -> list of results dicts (one per seed). Conditions may be missing."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return [_fig_loss(folder, runs), _fig_mean_pr(folder, runs), _fig_per_layer(folder, runs),
            _fig_decomposition(folder, runs), _fig_gamma_cv(folder, runs)]


# ---------------------------------------------------------------------------------------------------------
# Numbers: summary, comparisons, verdict, claims


def summary(runs: dict) -> dict:
    """condition -> final PR / train loss / val loss: mean over seeds, 95% CI half width, per-seed values.

    Keys per condition: n, seeds, tokens (final tokens per seed), and for each of final_pr, final_loss,
    final_val_loss: the mean, `<name>_ci95` (half width; None with one seed) and `<name>_per_seed`.
    Undefined values are None so the dict can go straight into combined.json."""
    def j(v):
        return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v

    out = {}
    for c in _conditions(runs):
        rl = _runs(runs, c)
        entry = {"tag": c, "label": label(c), "n": len(rl), "seeds": [_seed(r) for r in rl],
                 "tokens": [r["tokens"][-1] if r["tokens"] else None for r in rl]}
        for name, field in (("final_pr", "mean_pr"), ("final_loss", "loss"), ("final_val_loss", "val_loss")):
            values = _finals(runs, c, field)
            mean, half = mean_ci95(values)
            entry[name] = j(mean)
            entry[f"{name}_ci95"] = j(half)
            entry[f"{name}_per_seed"] = [j(v) for v in values]
        out[c] = entry
    return out


def _seed(res: dict):
    if res.get("seed") is not None:
        return res["seed"]
    return ((res.get("config") or {}).get("train") or {}).get("seed")


def compare(a_values, b_values, rel_tol: float, alpha: float = ALPHA) -> dict:
    """Apply the equality rule to two conditions' per-seed values.

    equal = |mean_a - mean_b| < rel_tol * mean of |means| (research.stats.roughly_equal), AND, when both
    sides have >= 2 values, Welch's p >= alpha."""
    ma, ha = mean_ci95(a_values)
    mb, hb = mean_ci95(b_values)
    na = int(np.isfinite(np.array([_num(v) for v in a_values], dtype=float)).sum())
    nb = int(np.isfinite(np.array([_num(v) for v in b_values], dtype=float)).sum())
    close = roughly_equal(ma, mb, rel_tol)
    scale = (abs(ma) + abs(mb)) / 2
    rel = abs(ma - mb) / scale if scale > 0 else 0.0
    tested = na >= 2 and nb >= 2
    t, dof, p = welch_t_test(a_values, b_values) if tested else (math.nan, math.nan, math.nan)
    diff, diff_half = diff_ci95(a_values, b_values)
    equal = close and (not tested or p >= alpha)
    return {"mean_a": ma, "mean_b": mb, "diff": diff, "diff_ci95": diff_half, "rel": rel, "close": close,
            "tested": tested, "t": t, "dof": dof, "p": p, "equal": equal, "n_a": na, "n_b": nb,
            "rel_tol": rel_tol}


def _rule_text(rel_tol: float, quantity: str) -> str:
    return (f"two conditions are called equal in {quantity} when the difference of their means is below "
            f"{rel_tol:.1%} of the mean of the two AND, when both have at least 2 seeds, Welch's t-test does "
            f"not reject equality (p \u2265 {ALPHA})")


def triangulate(runs: dict, rel_tol: float = PR_REL_TOL) -> dict:
    """The triangulation verdict on the final mean key PR.

    A != B ~ C: the gain drives rank; A ~ B != C: the normalization does; all differ: both.
    Returns {"verdict", "key" (gain / normalization / both / neither / qknorm / none / unclear), "tentative"
    (a "different" call rests on a difference that Welch's test does not find significant), "pairs"
    {(x, y): compare(...)}, "rule", "rule_short", "rule_applied"}."""
    pairs = {}
    for x, y in (("QK", "QK_frozen"), ("QK_frozen", "NoQK"), ("QK", "NoQK")):
        if runs.get(x) and runs.get(y) and np.isfinite(_finals(runs, x, "mean_pr")).any() \
                and np.isfinite(_finals(runs, y, "mean_pr")).any():
            pairs[(x, y)] = compare(_finals(runs, x, "mean_pr"), _finals(runs, y, "mean_pr"), rel_tol)
    ab, bc, ac = pairs.get(("QK", "QK_frozen")), pairs.get(("QK_frozen", "NoQK")), pairs.get(("QK", "NoQK"))
    if ab and bc:
        if not ab["equal"] and bc["equal"]:
            key, verdict = "gain", "gain drives rank (A\u2260B\u2248C)"
        elif ab["equal"] and not bc["equal"]:
            key, verdict = "normalization", "normalization drives rank (A\u2248B\u2260C)"
        elif not ab["equal"] and not bc["equal"]:
            key, verdict = "both", "both gain and normalization drive rank (all differ: A\u2260B, B\u2260C)"
            if ac and ac["equal"]:
                verdict += "; their effects cancel (A\u2248C)"
        elif ac and not ac["equal"]:
            key, verdict = "unclear", ("unclear: A\u2248B and B\u2248C but A\u2260C (small effects of both, "
                                       "each below the threshold)")
        else:
            key, verdict = "neither", "neither: A\u2248B\u2248C, QK-norm does not change key rank here"
    elif ac:
        key = "qknorm"
        verdict = ("QK-norm " + ("does not change" if ac["equal"] else "changes") + " key rank (A"
                   + ("\u2248" if ac["equal"] else "\u2260") + "C); without the frozen-gain run (B) gain and "
                   "normalization cannot be separated")
    else:
        key, verdict = "none", "no verdict: needs at least two of QK, QK_frozen, NoQK"
    weak = [f"{LETTERS[x]} vs {LETTERS[y]} (p = {c['p']:.2g})" for (x, y), c in pairs.items()
            if c["tested"] and not c["equal"] and c["p"] >= ALPHA]
    if weak and key not in ("none",):
        verdict += ("; tentative: the difference " + ", ".join(weak) + " is above the threshold but not "
                    "significant, more seeds would be needed")
    tested = [p["tested"] for p in pairs.values()]
    if tested and all(tested):
        applied = "threshold and Welch test (every condition has at least 2 seeds)"
    elif any(tested):
        applied = "threshold and Welch test where both conditions have at least 2 seeds, threshold only elsewhere"
    else:
        applied = "threshold only (one run per condition, so no test is possible)"
    short = (f"equal when |difference| < {rel_tol:.0%} of the mean"
             + (f" and Welch p \u2265 {ALPHA}" if any(tested) else " (one run each: no test)"))
    return {"verdict": verdict, "key": key, "tentative": bool(weak), "pairs": pairs,
            "rule": _rule_text(rel_tol, "final PR"), "rule_short": short, "rule_applied": applied}


def u_shape(y) -> dict:
    """Is a trajectory U-shaped? min strictly inside, start and end above it by >= U_MARGIN of the min."""
    y = np.array([_num(v) for v in y], dtype=float)
    ok = np.isfinite(y)
    if ok.sum() < 3:
        return {"u": False, "reason": "fewer than 3 probes", "start": math.nan, "min": math.nan,
                "end": math.nan, "i_min": -1, "n": len(y)}
    idx = np.flatnonzero(ok)
    vals = y[idx]
    i = int(np.argmin(vals))
    start, low, end = float(vals[0]), float(vals[i]), float(vals[-1])
    margin = U_MARGIN * abs(low)
    inside = 0 < i < len(vals) - 1
    falls, rises = start - low >= margin, end - low >= margin
    if not inside:
        reason = "minimum at the " + ("start" if i == 0 else "end")
    elif not falls:
        reason = f"falls by only {start - low:.2f} (< margin {margin:.2f})"
    elif not rises:
        reason = f"recovers by only {end - low:.2f} (< margin {margin:.2f})"
    else:
        reason = ""
    return {"u": inside and falls and rises, "reason": reason, "start": start, "min": low, "end": end,
            "i_min": int(idx[i]), "n": len(y)}


def _mean_traj(runs: dict, cond: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = _aligned(_runs(runs, cond), lambda r: r["mean_pr"])
    return x, (np.nanmean(y, axis=0) if y.size else np.zeros(0))


def claims(runs: dict) -> dict:
    """The write-ups' four claims checked on these runs: name -> {"status", "text"}.

    status is "holds", "does not hold", "partly" or "cannot be tested"."""
    tri = triangulate(runs)
    out = {}
    conds = [c for c in CONDITIONS if runs.get(c)]
    fin = {c: {f: mean_ci95(_finals(runs, c, f))[0] for f in ("mean_pr", "loss", "val_loss")} for c in conds}

    # (a) gain drives PR
    ab, bc = tri["pairs"].get(("QK", "QK_frozen")), tri["pairs"].get(("QK_frozen", "NoQK"))
    if ab and bc:
        status = "holds" if tri["key"] == "gain" else "does not hold"
        if tri["tentative"]:
            status += " (tentative)"
        text = (f"A\u2212B = {ab['diff']:+.1f} ({ab['rel']:.1%} of the mean, "
                f"{'equal' if ab['equal'] else 'different'}), B\u2212C = {bc['diff']:+.1f} ({bc['rel']:.1%}, "
                f"{'equal' if bc['equal'] else 'different'}); verdict: {tri['verdict']}.")
    else:
        status, text = "cannot be tested", "needs QK, QK_frozen and NoQK."
    out["a"] = {"claim": "the learned gain drives key PR (A\u2260B and B\u2248C)", "status": status, "text": text}

    # (b) PR does not predict loss
    if len(conds) >= 2:
        lines, n_conc, n_other = [], 0, 0
        for i, x in enumerate(conds):
            for y in conds[i + 1:]:
                pr = compare(_finals(runs, x, "mean_pr"), _finals(runs, y, "mean_pr"), PR_REL_TOL)
                lo = compare(_finals(runs, x, "loss"), _finals(runs, y, "loss"), LOSS_REL_TOL)
                lx, ly = LETTERS[x], LETTERS[y]
                if not all(map(math.isfinite, (pr["mean_a"], pr["mean_b"], lo["mean_a"], lo["mean_b"]))):
                    lines.append(f"{lx} vs {ly}: no final PR or train loss to compare")
                    continue
                if pr["equal"] and lo["equal"]:
                    kind = "neither PR nor loss differs"
                elif pr["equal"]:
                    kind, n_other = "loss differs but PR does not", n_other + 1
                elif lo["equal"]:
                    kind, n_other = "PR differs but loss does not", n_other + 1
                elif (pr["diff"] > 0) == (lo["diff"] < 0):
                    kind, n_conc = "concordant: the higher-PR condition has the lower loss", n_conc + 1
                else:
                    kind, n_other = "discordant: the higher-PR condition has the higher loss", n_other + 1
                lines.append(f"{lx} vs {ly}: PR {pr['diff']:+.1f} ({pr['rel']:.1%}), train loss "
                             f"{lo['diff']:+.3f} ({lo['rel']:.2%}) \u2192 {kind}")
        by_pr = sorted(conds, key=lambda c: -fin[c]["mean_pr"])
        by_loss = sorted(conds, key=lambda c: fin[c]["loss"])
        rho = spearman_rho([fin[c]["mean_pr"] for c in conds], [fin[c]["loss"] for c in conds])
        if n_other:
            status = "holds"
        elif n_conc:
            status = "does not hold"
        else:
            status = "cannot be tested"
        text = (f"order by final PR (highest first): {' > '.join(LETTERS[c] for c in by_pr)}; by final train "
                f"loss (lowest first): {' < '.join(LETTERS[c] for c in by_loss)}; Spearman \u03c1(PR, loss) = "
                f"{rho:+.2f} over {len(conds)} conditions (\u22121 would mean higher PR always goes with lower "
                f"loss). Pairs (PR rule {PR_REL_TOL:.0%}, loss rule {LOSS_REL_TOL:.1%}): " + "; ".join(lines) + ".")
    else:
        status, text = "cannot be tested", "needs at least two conditions."
    out["b"] = {"claim": "key PR does not predict loss", "status": status, "text": text}

    # (c) U-shaped PR trajectory
    if conds:
        parts, n_u = [], 0
        for c in conds:
            x, traj = _mean_traj(runs, c)
            u = u_shape(traj)
            n_u += u["u"]
            per_seed = [u_shape(r["mean_pr"])["u"] for r in _runs(runs, c)]
            seeds = f" (U-shaped in {sum(per_seed)} of {len(per_seed)} seeds)" if len(per_seed) > 1 else ""
            parts.append(f"{LETTERS[c]}: {u['start']:.1f} \u2192 min {u['min']:.1f} "
                         + (f"(at {x[u['i_min']] / 1e6:.3g}M tokens) " if u["i_min"] >= 0 else "")
                         + f"\u2192 {u['end']:.1f}, " + ("U-shaped" if u["u"] else f"not U-shaped ({u['reason']})")
                         + seeds)
        testable = sum(len(_mean_traj(runs, c)[1]) >= 3 for c in conds)
        status = "holds" if n_u == len(conds) else ("does not hold" if n_u == 0 else "partly")
        if not testable:
            status = "cannot be tested"
        text = (f"rule: the minimum of mean PR lies strictly inside the run and both the start and the end are "
                f"above it by at least {U_MARGIN:.0%} of the minimum. " + "; ".join(parts) + ".")
    else:
        status, text = "cannot be tested", "no runs."
    out["c"] = {"claim": "the PR trajectory is U-shaped (falls, then recovers)", "status": status, "text": text}

    # (d) frozen gain worse than no QK-norm
    if "QK_frozen" in conds and "NoQK" in conds:
        lo = compare(_finals(runs, "QK_frozen", "loss"), _finals(runs, "NoQK", "loss"), LOSS_REL_TOL)
        va = compare(_finals(runs, "QK_frozen", "val_loss"), _finals(runs, "NoQK", "val_loss"), LOSS_REL_TOL)
        pr = compare(_finals(runs, "QK_frozen", "mean_pr"), _finals(runs, "NoQK", "mean_pr"), PR_REL_TOL)
        if not (math.isfinite(lo["mean_a"]) and math.isfinite(lo["mean_b"])):
            status, how = "cannot be tested", "a final train loss is missing"
        elif lo["equal"]:
            status, how = "does not hold", "no difference by the rule"
        elif lo["diff"] > 0:
            status, how = "holds", "B's loss is higher"
        else:
            status, how = "does not hold", "B's loss is lower: the frozen gain trains better"
        text = (f"final train loss B {lo['mean_a']:.3f} vs C {lo['mean_b']:.3f} (B\u2212C {lo['diff']:+.3f}, "
                f"{lo['rel']:.2%}" + (f", Welch p = {lo['p']:.3g}" if lo["tested"] else "") + f"): {how}. "
                f"Validation loss B\u2212C {va['diff']:+.3f}" + (f" (p = {va['p']:.3g})" if va["tested"] else "")
                + f". In key PR, B\u2212C = {pr['diff']:+.1f} ("
                + ("no difference by the rule" if pr["equal"] else
                   f"{'lower' if pr['diff'] < 0 else 'higher'} rank with the frozen gain") + ").")
    else:
        status, text = "cannot be tested", "needs QK_frozen and NoQK."
    out["d"] = {"claim": "a frozen gain is worse than no QK-norm (final train loss B > C)", "status": status,
                "text": text}
    return out


# ---------------------------------------------------------------------------------------------------------
# Report


def _fmt(values, decimals: int) -> str:
    mean, half = mean_ci95(values)
    if not math.isfinite(mean):
        return "n/a"
    if math.isfinite(half):
        return f"{mean:.{decimals}f} \u00b1 {half:.{decimals}f}"
    return f"{mean:.{decimals}f}"


def _fmt_p(p: float) -> str:
    if not math.isfinite(p):
        return "n/a"
    return f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}"


def _provenance(runs: dict, cond: str) -> str:
    rl = _runs(runs, cond)
    if not any(r.get("preset") or _seed(r) is not None or r.get("provenance") or r.get("config") for r in rl):
        return "write-up results (no provenance recorded)"
    presets = sorted({str(r.get("preset") or (r.get("config") or {}).get("preset")) for r in rl} - {"None"})
    seeds = [_seed(r) for r in rl]
    tokens = sorted({r["tokens"][-1] for r in rl if r["tokens"]})
    commits = sorted({str((r.get("provenance") or {}).get("git_commit"))[:10] for r in rl
                      if (r.get("provenance") or {}).get("git_commit")})
    parts = []
    if presets:
        parts.append("preset " + ", ".join(presets))
    if any(s is not None for s in seeds):
        parts.append(("seed " if len(seeds) == 1 else "seeds ") + ", ".join(str(s) for s in seeds))
    if tokens:
        parts.append("tokens " + ", ".join(f"{t:,}" for t in tokens))
    parts.append("git " + ", ".join(commits) if commits else "git commit not recorded")
    return "; ".join(parts)


def write_report(folder, runs: dict) -> Path:
    """Write folder/report.md: final values, triangulation verdict with its rule, tests, claims, provenance."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    conds = _conditions(runs)
    ns = {c: len(_runs(runs, c)) for c in conds}
    several = any(n >= 2 for n in ns.values())
    tri = triangulate(runs)
    L = ["# QK-norm study: does the gain or the normalization drive key rank?", ""]
    seed_sets = {c: [_seed(r) for r in _runs(runs, c)] for c in conds}
    known = [v for v in seed_sets.values() if all(s is not None for s in v)]
    if conds and len(known) == len(conds) and all(sorted(map(str, v)) == sorted(map(str, known[0])) for v in known):
        seeds_txt = f"Every condition ran seed(s) {', '.join(map(str, known[0]))}. "
    elif known:
        seeds_txt = "Seeds differ between conditions (see Provenance). "
    else:
        seeds_txt = "Seeds not recorded. "
    L.append("Conditions: " + "; ".join(_name(c) for c in conds) + ". " + seeds_txt +
             "PR is the participation ratio (sum s)\u00b2 / sum s\u00b2 of the singular values of the keys "
             f"({_SITE}), averaged over KV heads and layers; 'final' = the last probe.")
    L.append("")
    if several:
        L.append("Values are mean \u00b1 95% confidence half width over seeds (Student t, n\u22121 degrees of "
                 "freedom); n is the number of seeds.")
    else:
        L.append("One run per condition: the values and the claims below are single-run observations, with no "
                 "confidence interval or test; seed-to-seed differences could be as large as the effects.")
    L += ["", "## Final values", "", "| condition | final PR | final train loss | final val loss | n |",
          "|---|---|---|---|---|"]
    for c in conds:
        L.append(f"| {_name(c)} | {_fmt(_finals(runs, c, 'mean_pr'), 1)} | {_fmt(_finals(runs, c, 'loss'), 3)} "
                 f"| {_fmt(_finals(runs, c, 'val_loss'), 3)} | {ns[c]} |")
    L += ["", "## Triangulation verdict", "", f"**{tri['verdict'][0].upper()}{tri['verdict'][1:]}.**", "",
          "Reading: A\u2260B\u2248C \u2192 the gain drives rank; A\u2248B\u2260C \u2192 the normalization does; "
          "all differ \u2192 both.", "",
          f"Rule: {tri['rule']}. Applied here: {tri['rule_applied']}.", ""]
    for (x, y), cmp_ in tri["pairs"].items():
        extra = ""
        if cmp_["tested"]:
            extra = f", Welch p = {_fmt_p(cmp_['p'])}"
            if not cmp_["close"] and cmp_["p"] >= ALPHA:
                extra += " (above the threshold but not significant: treat as inconclusive)"
        L.append(f"- {LETTERS[x]} vs {LETTERS[y]}: final PR {cmp_['mean_a']:.1f} vs {cmp_['mean_b']:.1f}, "
                 f"difference {cmp_['diff']:+.1f} = {cmp_['rel']:.1%} of the mean{extra} \u2192 "
                 f"**{'equal' if cmp_['equal'] else 'different'}**")
    if several:
        L += ["", "## Pairwise differences (Welch t-test)", "",
              "Difference = first minus second condition, with its 95% CI (Welch); p is two-sided.", "",
              "| pair | \u0394 final PR | p | \u0394 final train loss | p | \u0394 final val loss | p |",
              "|---|---|---|---|---|---|---|"]
        for i, x in enumerate(conds):
            for y in conds[i + 1:]:
                cells = []
                for field, dec in (("mean_pr", 1), ("loss", 3), ("val_loss", 3)):
                    a, b = _finals(runs, x, field), _finals(runs, y, field)
                    d, h = diff_ci95(a, b)
                    _, _, p = welch_t_test(a, b)
                    cells += [f"{d:+.{dec}f}" + (f" \u00b1 {h:.{dec}f}" if math.isfinite(h) else ""), _fmt_p(p)]
                lx, ly = LETTERS.get(x, x), LETTERS.get(y, y)
                L.append(f"| {lx} \u2212 {ly} | " + " | ".join(cells) + " |")
    L += ["", "## The write-ups' claims at this scale", ""]
    if not several:
        L += ["(Single-run observations: one seed per condition.)", ""]
    for k, cl in claims(runs).items():
        L.append(f"- ({k}) {cl['claim']}: **{cl['status']}**. {cl['text']}")
    L += ["", "## Figures", "",
          "1_loss.png (train solid, validation dashed), 2_key_pr_causal.png (mean PR over tokens), "
          "3_per_layer.png (PR per layer at the last probe), 4_causal_decomposition.png (A\u2212B gain effect, "
          "B\u2212C normalization effect per layer), 5_gamma_cv.png (gain CV over training).", "",
          "## Provenance", ""]
    for c in conds:
        L.append(f"- {c}: {_provenance(runs, c)}")
    path = folder / "report.md"
    path.write_text("\n".join(L) + "\n")
    return path
