"""The pilot study: QK-norm vs no QK-norm (conditions "qk_norm" and "no_qk_norm").

Reads only the write-ups' top-level fields (tokens, loss, val_loss, mean_pr, layer_pr,
gamma_cv), so everything can be redrawn from combined_results.json alone:

    combined_results.json        {condition: {tokens, train_loss, val_loss, mean_pr, layer_pr, gamma_cv, ...}}
    panel_a_loss.png             train (solid) and validation (dashed) loss vs tokens
    panel_b_pr_trajectory.png    mean key PR over layers vs tokens
    panel_c_per_layer.png        final key PR per layer
    panel_d_delta.png            per-layer difference of final PR, QK-norm minus no QK-norm
    layer_pr_heatmap_500k.png    key PR per layer (y) and probe (x), one panel per condition

With several seeds every per-probe value is the mean over seeds (probe by probe).
The conditions "QK"/"NoQK" of the other studies are accepted as the pair too; with
other names the first two conditions are compared (first minus second).

Imports numpy, matplotlib, research.plots.common and research.results only (never torch).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from matplotlib.patches import Patch

from research.plots.common import as_array, color, fmt_num, label, mean_over_seeds, plt, save, tokens_axis
from research.results import save_results

COMBINED_NAME = "combined_results.json"
FIGURES = ("panel_a_loss.png", "panel_b_pr_trajectory.png", "panel_c_per_layer.png", "panel_d_delta.png",
           "layer_pr_heatmap_500k.png")
_QK_NAMES = ("qk_norm", "QK")
_NOQK_NAMES = ("no_qk_norm", "NoQK")


# ----------------------------------------------------------------------------- data

def _jsonable(a: np.ndarray) -> list:
    return [None if not np.isfinite(v) else float(v) for v in a]


def _layers(res: dict) -> list[str]:
    return sorted((res.get("layer_pr") or {}).keys(), key=int)


def combined_from_runs(runs: dict[str, list[dict]]) -> dict:
    """{condition: {tag, n_seeds, seeds, tokens, train_loss, val_loss, mean_pr, layer_pr, gamma_cv}}.

    train_loss is the results' `loss`. With several seeds, values are means over seeds.
    """
    out = {}
    for cond, results in runs.items():
        if not results:
            continue
        n = min(len(r["tokens"]) for r in results)
        if len(results) == 1 and "n_seeds" in results[0]:  # came from a combined file: keep its seed count
            n_seeds, seeds = results[0]["n_seeds"], results[0].get("seeds", [None])
        else:
            n_seeds, seeds = len(results), [r.get("seed") for r in results]
        entry = {"tag": cond, "n_seeds": n_seeds, "seeds": seeds,
                 "tokens": [int(t) if t is not None else None for t in results[0]["tokens"][:n]]}
        for key, src in (("train_loss", "loss"), ("val_loss", "val_loss"), ("mean_pr", "mean_pr")):
            entry[key] = _jsonable(mean_over_seeds([r.get(src) for r in results])[:n])
        for key in ("layer_pr", "gamma_cv"):
            layers = sorted(set().union(*[(r.get(key) or {}).keys() for r in results]), key=int)
            entry[key] = {layer: _jsonable(mean_over_seeds([r[key][layer] for r in results
                                                       if layer in (r.get(key) or {})])[:n])
                          for layer in layers}
        out[cond] = entry
    return out


def runs_from_combined(d: dict | str | Path) -> dict[str, list[dict]]:
    """Results-like dicts (one 'seed' per condition) from a combined dict or a combined_results.json path."""
    if isinstance(d, (str, Path)):
        d = json.loads(Path(d).read_text())
    runs = {}
    for cond, e in d.items():
        if not isinstance(e, dict) or "tokens" not in e:
            continue  # metadata, not a condition
        n = len(e["tokens"])
        runs[cond] = [{"tag": e.get("tag", cond), "tokens": list(e["tokens"]),
                       "loss": list(e.get("train_loss", e.get("loss")) or [None] * n),
                       "val_loss": list(e.get("val_loss") or [None] * n),
                       "mean_pr": list(e.get("mean_pr") or [None] * n),
                       "layer_pr": dict(e.get("layer_pr") or {}), "gamma_cv": dict(e.get("gamma_cv") or {}),
                       "gamma_final": {}, "seed": None, "n_seeds": e.get("n_seeds", 1),
                       "seeds": e.get("seeds", [None])}]
    return runs


def write_combined(folder, runs: dict[str, list[dict]]) -> Path:
    """folder/combined_results.json (atomic write)."""
    path = Path(folder) / COMBINED_NAME
    save_results(path, combined_from_runs(runs))
    return path


def pair(runs) -> tuple[str | None, str | None]:
    """(QK-norm condition, no-QK-norm condition) of the runs; delta = first - second."""
    names = list(runs)
    qk = next((n for n in _QK_NAMES if n in runs), None)
    noqk = next((n for n in _NOQK_NAMES if n in runs), None)
    if qk and noqk:
        return qk, noqk
    rest = [n for n in names if n not in (qk, noqk)]
    a = qk or (rest.pop(0) if rest else None)
    b = noqk or (rest.pop(0) if rest else None)
    return a, b


def _final(values) -> float:
    """Last finite value of a per-probe list (NaN if none)."""
    a = as_array(values)
    a = a[np.isfinite(a)]
    return float(a[-1]) if a.size else math.nan


def _summary(runs) -> dict:
    comb = combined_from_runs(runs)
    out = {}
    for cond, e in comb.items():
        layers = sorted(e["layer_pr"], key=int)
        out[cond] = {"e": e, "layers": layers, "final_layer": {int(l): _final(e["layer_pr"][l]) for l in layers},
                     "final_pr": _final(e["mean_pr"]), "final_loss": _final(e["train_loss"]),
                     "final_val": _final(e["val_loss"]), "tokens": _final(e["tokens"])}
    return out


def _seeds_txt(e: dict) -> str:
    n = e.get("n_seeds", 1)
    return f", mean over {n} seeds" if n > 1 else ""


# ----------------------------------------------------------------------------- figures

def _panel_a(path, summ) -> Path:
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    for cond, s in summ.items():
        e = s["e"]
        x = tokens_axis(ax, e["tokens"])
        ax.plot(x, as_array(e["train_loss"]), color=color(cond), lw=2, label=f"{label(cond)}: train{_seeds_txt(e)}")
        ax.plot(x, as_array(e["val_loss"]), color=color(cond), lw=2, ls="--", label=f"{label(cond)}: validation")
    ax.set_ylabel("loss (cross-entropy, nats per token)")
    ax.set_title("(a) Loss: train (solid, mean of the last probe_every steps) and validation (dashed)")
    ax.legend()
    return save(fig, path)


def _panel_b(path, summ) -> Path:
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    for cond, s in summ.items():
        e = s["e"]
        x = tokens_axis(ax, e["tokens"])
        ax.plot(x, as_array(e["mean_pr"]), color=color(cond), lw=2, marker="o", ms=3,
                label=f"{label(cond)}{_seeds_txt(e)}")
    ax.set_ylabel("mean key PR over layers (pr_sv, dimensions)")
    ax.set_title("(b) Key participation ratio over training (keys at k_norm, pre-RoPE)")
    ax.legend()
    return save(fig, path)


def _panel_c(path, summ) -> Path:
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    n_layers = 0
    for cond, s in summ.items():
        layers = sorted(s["final_layer"])
        n_layers = max(n_layers, len(layers))
        ax.plot(layers, [s["final_layer"][i] for i in layers], color=color(cond), lw=2, marker="o",
                label=f"{label(cond)} (at {s['tokens'] / 1e6:.3g}M tokens{_seeds_txt(s['e'])})")
    ax.set_xlabel("layer")
    ax.set_ylabel("final key PR (pr_sv, dimensions)")
    if n_layers <= 24:
        ax.set_xticks(range(n_layers))
    ax.set_title("(c) Final key participation ratio per layer")
    ax.legend()
    return save(fig, path)


def _panel_d(path, summ, a, b) -> Path:
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    if a is None or b is None:
        ax.axis("off")
        ax.text(0.5, 0.5, "The per-layer difference needs two conditions\n(QK-norm and no QK-norm); "
                f"only {', '.join(map(label, summ)) or 'none'} found.", ha="center", va="center",
                transform=ax.transAxes, fontsize=11)
        ax.set_title("(d) Per-layer difference of final key PR")
        return save(fig, path)
    layers = sorted(set(summ[a]["final_layer"]) & set(summ[b]["final_layer"]))
    delta = np.array([summ[a]["final_layer"][i] - summ[b]["final_layer"][i] for i in layers])
    colors = [color(a) if v >= 0 else color(b) for v in delta]
    ax.bar(layers, delta, color=colors, edgecolor="black", lw=0.5)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("layer")
    ax.set_ylabel("Δ final key PR (dimensions)")
    if len(layers) <= 24:
        ax.set_xticks(layers)
    ax.set_title(f"(d) Per-layer Δ final key PR = {label(a)} − {label(b)}")
    ax.legend(handles=[Patch(color=color(a), label=f"{label(a)} higher"),
                       Patch(color=color(b), label=f"{label(b)} higher")])
    return save(fig, path)


def _heatmap(path, summ) -> Path:
    conds = list(summ)
    mats = {}
    for cond in conds:
        e = summ[cond]["e"]
        layers = sorted(e["layer_pr"], key=int)
        mats[cond] = np.array([as_array(e["layer_pr"][l]) for l in layers]) if layers else np.zeros((0, 0))
    finite = np.concatenate([m[np.isfinite(m)] for m in mats.values()]) if mats else np.zeros(0)
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    fig, axes = plt.subplots(1, max(1, len(conds)), figsize=(5.5 * max(1, len(conds)) + 1.2, 5.2), squeeze=False,
                             layout="constrained")
    im = None
    for ax, cond in zip(axes[0], conds):
        m, tokens = mats[cond], summ[cond]["e"]["tokens"]
        ax.grid(False)
        if m.size == 0:
            ax.axis("off")
            ax.text(0.5, 0.5, "no layer_pr in this run", ha="center", va="center", transform=ax.transAxes)
            continue
        im = ax.imshow(m, aspect="auto", origin="lower", cmap="viridis", vmin=vmin, vmax=vmax,
                       interpolation="nearest")
        n_p, L = m.shape[1], m.shape[0]
        ticks = np.unique(np.linspace(0, n_p - 1, min(n_p, 7)).round().astype(int))
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{tokens[t] / 1e6:.3g}" if tokens[t] is not None else "?" for t in ticks])
        ax.set_yticks(range(L) if L <= 24 else np.linspace(0, L - 1, 12).round().astype(int))
        ax.set_xlabel("training tokens (millions) at each probe")
        ax.set_ylabel("layer")
        ax.set_title(f"{label(cond)}{_seeds_txt(summ[cond]['e'])}")
    if im is not None:
        fig.colorbar(im, ax=list(axes[0]), label="key PR (pr_sv, dimensions)", fraction=0.04, pad=0.01)
    fig.suptitle("Key participation ratio per layer and probe (same colour scale in every panel)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)  # common.save would switch to tight_layout, which mishandles a shared colour bar
    plt.close(fig)
    return path


def render(folder, runs: dict[str, list[dict]]) -> list[Path]:
    folder = Path(folder)
    summ = _summary(runs)
    a, b = pair(summ)
    return [_panel_a(folder / FIGURES[0], summ), _panel_b(folder / FIGURES[1], summ),
            _panel_c(folder / FIGURES[2], summ), _panel_d(folder / FIGURES[3], summ, a, b),
            _heatmap(folder / FIGURES[4], summ)]


# ----------------------------------------------------------------------------- report

def _signed(v, nd=3) -> str:
    return "n/a" if v is None or not np.isfinite(v) else f"{v:+.{nd}f}"


def write_report(folder, runs: dict[str, list[dict]], top: int = 3) -> Path:
    folder = Path(folder)
    summ = _summary(runs)
    a, b = pair(summ)
    lines = ["# Pilot: QK-norm vs no QK-norm", "",
             "PR = participation ratio of the keys at the k_norm output (pre-RoPE), pr_sv = (Σs)² / Σs² of the "
             "singular values; mean PR = mean over layers. Final = last probe. Train loss = mean training loss "
             "of the last probe_every steps before the probe.", "",
             "| condition | seeds | tokens | final mean PR | final train loss | final val loss |",
             "|---|---|---|---|---|---|"]
    for cond, s in summ.items():
        lines.append(f"| {label(cond)} (`{cond}`) | {s['e'].get('n_seeds', 1)} | {s['tokens']:,.0f} | "
                     f"{fmt_num(s['final_pr'], 2)} | {fmt_num(s['final_loss'])} | {fmt_num(s['final_val'])} |")
    lines.append("")
    if a is None or b is None:
        lines += ["Only one condition: the QK-norm minus no-QK-norm difference needs both.", ""]
    else:
        sa, sb = summ[a], summ[b]
        dpr = sa["final_pr"] - sb["final_pr"]
        rel = dpr / sb["final_pr"] if sb["final_pr"] else math.nan
        lines += [f"## Difference: {label(a)} − {label(b)}", "",
                  f"- Final mean PR: {_signed(dpr, 2)} ({_signed(100 * rel, 1)}% of {label(b)})",
                  f"- Final train loss: {_signed(sa['final_loss'] - sb['final_loss'])}",
                  f"- Final val loss: {_signed(sa['final_val'] - sb['final_val'])}"]
        layers = sorted(set(sa["final_layer"]) & set(sb["final_layer"]))
        delta = {i: sa["final_layer"][i] - sb["final_layer"][i] for i in layers}
        ranked = sorted((i for i in layers if np.isfinite(delta[i])), key=lambda i: -abs(delta[i]))
        lines += ["- Layers that differ most (largest |Δ final PR|): "
                  + (", ".join(f"layer {i} ({_signed(delta[i], 2)})" for i in ranked[:top]) or "none"),
                  f"- {label(a)} higher in {sum(delta[i] > 0 for i in ranked)} of {len(ranked)} layers, "
                  f"lower in {sum(delta[i] < 0 for i in ranked)}", "",
                  f"| layer | {label(a)} final PR | {label(b)} final PR | Δ |", "|---|---|---|---|"]
        lines += [f"| {i} | {fmt_num(sa['final_layer'][i], 2)} | {fmt_num(sb['final_layer'][i], 2)} | "
                  f"{_signed(delta[i], 2)} |" for i in layers]
        lines.append("")
    path = folder / "report.md"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
