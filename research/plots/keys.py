"""Key dynamics: what happens with the attention keys as the LLM trains.

Per layer, over training, at the k_norm hook (pre-RoPE keys, mean over the layer's KV
heads): norm_mean, max_abs ("outlier magnitude"), peak_frac, cos_mean ("redundancy")
and std, read from `probes[*].layers[*].means["k_norm.<metric>"]`.

Figures (one set per condition; with several conditions the file names get the
condition as a suffix, e.g. key_analysis_report_QK.png):

    key_analysis_report.png  four panels: smoothed norm of the early / middle / final
                             layer groups; max_abs of the first, middle and last layer;
                             cos_mean by group; final norm per layer with the sqrt(d_head) line
    key_norm_evolution.png   norm of the three groups (and of each of their layers) over training

Groups: the first two layers, the middle two (L//2 - 1 and L//2) and the last two.
With several seeds the per-layer series are averaged over seeds (probe by probe).

Imports numpy, matplotlib and research.plots.common only (never torch). The helpers
here (probe series, seed means, d_head, message figures) are also used by heads.py.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from research.plots.common import (GROUP_COLORS, fmt_num, fmt_tokens, label, mean_over_seeds, message_figure,
                                   nanmean, plt, save, smooth, tokens_axis)

SITE = "k_norm"
METRICS = ("norm_mean", "max_abs", "peak_frac", "cos_mean", "std")
DEFAULT_D_HEAD = 64
AT_TOLERANCE = 0.01  # a final norm within +-1% of sqrt(d_head) counts as "at" sqrt(d_head)
GROUP_NAMES = {"early": "early layers", "middle": "middle layers", "final": "final layers"}


# ----------------------------------------------------------------------------- shared helpers

def _f(v) -> float:
    return math.nan if v is None else float(v)


def probe_tokens(res: dict) -> np.ndarray:
    """Training tokens at each probe record (falls back to the top-level `tokens`)."""
    probes = res.get("probes") or []
    if probes:
        return np.array([_f(p.get("tokens")) for p in probes], dtype=float)
    return np.array([_f(t) for t in res.get("tokens", [])], dtype=float)


def n_layers_of(res: dict) -> int:
    probes = res.get("probes") or []
    if probes:
        return len(probes[0]["layers"])
    return len(res.get("layer_pr") or {})


def layer_series(res: dict, metric: str, site: str = SITE) -> np.ndarray:
    """[n_probes, n_layers] layer means of `site.metric` (NaN where missing)."""
    probes = res.get("probes") or []
    if not probes:
        return np.zeros((0, 0))
    out = np.full((len(probes), len(probes[0]["layers"])), np.nan)
    for p, probe in enumerate(probes):
        for rec in probe["layers"]:
            v = (rec.get("means") or {}).get(f"{site}.{metric}")
            if rec["layer"] < out.shape[1]:
                out[p, rec["layer"]] = _f(v)
    return out


def d_head_of(res: dict) -> tuple[int, str]:
    """(d_head, where it came from): config d_model // n_heads, else the gain length, else 64."""
    model = ((res.get("config") or {}).get("model") or {})
    if model.get("d_head"):
        return int(model["d_head"]), "config d_head"
    if model.get("d_model") and model.get("n_heads"):
        return int(model["d_model"]) // int(model["n_heads"]), "config d_model / n_heads"
    for probe in res.get("probes") or []:
        for rec in probe["layers"]:
            g = rec.get("gamma_k")
            if g and g.get("values"):
                return len(g["values"]), "length of the k_norm gain vector (no model config in the file)"
    for values in (res.get("gamma_final") or {}).values():
        if values:
            return len(values), "length of gamma_final (no model config in the file)"
    return DEFAULT_D_HEAD, f"not recorded in the file; assumed {DEFAULT_D_HEAD}"


def layer_groups(n_layers: int) -> dict[str, list[int]]:
    """early: first two layers, middle: L//2 - 1 and L//2, final: last two (clipped to the model)."""
    def clip(ix):
        return sorted({min(max(i, 0), n_layers - 1) for i in ix})
    L = n_layers
    return {"early": clip([0, 1]), "middle": clip([L // 2 - 1, L // 2]), "final": clip([L - 2, L - 1])}


def group_of(layer: int, groups: dict[str, list[int]]) -> str:
    names = [g for g, ix in groups.items() if layer in ix]
    return "/".join(names) if names else "-"


def smoothing_window(n_probes: int) -> int:
    return 1 if n_probes < 8 else max(3, n_probes // 8)


def figure_name(base: str, condition: str, n_conditions: int) -> str:
    return f"{base}.png" if n_conditions == 1 else f"{base}_{condition}.png"


def seeds_text(runs_of_condition: list[dict]) -> str:
    n = len(runs_of_condition)
    if n == 1:
        seed = runs_of_condition[0].get("seed")
        return f"seed {seed}" if seed is not None else "1 run"
    return f"mean over {n} seeds"


# ----------------------------------------------------------------------------- data of one condition

def condition_data(results: list[dict]) -> dict | None:
    """Seed-averaged per-layer series of one condition, or None if no run has probe records."""
    with_probes = [r for r in results if r.get("probes")]
    if not with_probes:
        return None
    series = {m: mean_over_seeds([layer_series(r, m) for r in with_probes]) for m in METRICS}
    n = series["norm_mean"].shape[0]
    d_head, d_source = d_head_of(with_probes[0])
    return {"tokens": probe_tokens(with_probes[0])[:n], "series": series, "n_layers": series["norm_mean"].shape[1],
            "d_head": d_head, "d_source": d_source, "n_seeds": len(with_probes), "seeds": seeds_text(with_probes)}


def _group_mean(values: np.ndarray, layers: list[int]) -> np.ndarray:
    return nanmean(values[:, layers], axis=1)


# ----------------------------------------------------------------------------- figures

def _sqrt_line(ax, d_head: int) -> None:
    ax.axhline(math.sqrt(d_head), color="black", ls="--", lw=1,
               label=f"√d_head = {math.sqrt(d_head):.2f} (d_head = {d_head})")


def _analysis_figure(path: Path, cond: str, data: dict) -> Path:
    s, L = data["series"], data["n_layers"]
    groups = layer_groups(L)
    w = smoothing_window(len(data["tokens"]))
    smooth_txt = (f"moving average over {w} probes; faint: raw" if w > 1
                  else f"not smoothed: only {len(data['tokens'])} probes")
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (a, b), (c, d) = axes

    x = tokens_axis(a, data["tokens"])
    for g, layers in groups.items():
        y = _group_mean(s["norm_mean"], layers)
        if w > 1:
            a.plot(x, y, color=GROUP_COLORS[g], alpha=0.25, lw=1)
        a.plot(x, smooth(y, w), color=GROUP_COLORS[g], lw=2,
               label=f"{GROUP_NAMES[g]} ({', '.join(map(str, layers))})")
    _sqrt_line(a, data["d_head"])
    a.set_ylabel("mean key L2 norm")
    a.set_title(f"(a) key norm by layer group ({smooth_txt})")
    a.legend()

    x = tokens_axis(b, data["tokens"])
    picks = [("first", 0, "early"), ("middle", L // 2, "middle"), ("last", L - 1, "final")]
    seen = set()
    for name, layer, g in picks:
        if layer in seen:
            continue
        seen.add(layer)
        b.plot(x, s["max_abs"][:, layer], color=GROUP_COLORS[g], lw=2, marker="o", ms=3,
               label=f"layer {layer} ({name})")
    b.set_ylabel("largest |key component| (outlier magnitude)")
    b.set_title("(b) outlier magnitude: max |k_j| over all keys, mean over KV heads")
    b.legend()

    x = tokens_axis(c, data["tokens"])
    for g, layers in groups.items():
        c.plot(x, _group_mean(s["cos_mean"], layers), color=GROUP_COLORS[g], lw=2,
               label=f"{GROUP_NAMES[g]} ({', '.join(map(str, layers))})")
    c.axhline(0, color="grey", lw=0.8)
    c.set_ylabel("mean cosine similarity between keys")
    c.set_title("(c) redundancy: mean pairwise key cosine within a sequence")
    c.legend()

    final = s["norm_mean"][-1]
    colors = [GROUP_COLORS[group_of(i, groups).split("/")[-1]] if group_of(i, groups) != "-" else "#9a9a9a"
              for i in range(L)]
    d.bar(np.arange(L), final, color=colors, edgecolor="black", lw=0.5)
    _sqrt_line(d, data["d_head"])
    ref = math.sqrt(data["d_head"])
    d.axhspan(ref * (1 - AT_TOLERANCE), ref * (1 + AT_TOLERANCE), color="grey", alpha=0.2, lw=0,
              label=f"±{AT_TOLERANCE:.0%}: counted as at √d_head in the report")
    finite = final[np.isfinite(final)]
    if finite.size:
        lo = min(finite.min(), math.sqrt(data["d_head"]))
        hi = max(finite.max(), math.sqrt(data["d_head"]))
        pad = 0.15 * (hi - lo) + 0.05 * hi
        d.set_ylim(max(0.0, lo - pad), hi + pad)
    d.set_xlabel("layer")
    d.set_ylabel("final mean key L2 norm")
    d.set_xticks(np.arange(L))
    d.set_title(f"(d) final key norm per layer (at {fmt_tokens(data['tokens'][-1])} tokens; y axis not from 0)")
    from matplotlib.patches import Patch
    handles = [Patch(color=GROUP_COLORS[g], label=GROUP_NAMES[g]) for g in groups]
    if any(c == "#9a9a9a" for c in colors):
        handles.append(Patch(color="#9a9a9a", label="other layers"))
    d.legend(handles=[*handles, *d.get_legend_handles_labels()[0]], fontsize=8)

    fig.suptitle(f"Key dynamics: {label(cond)} ({data['seeds']}); keys at the k_norm output (pre-RoPE), "
                 f"layer = mean over KV heads", fontsize=12)
    return save(fig, path)


def _evolution_figure(path: Path, cond: str, data: dict) -> Path:
    s = data["series"]["norm_mean"]
    groups = layer_groups(data["n_layers"])
    fig, ax = plt.subplots(figsize=(9, 5.5))
    x = tokens_axis(ax, data["tokens"])
    for g, layers in groups.items():
        for i in layers:
            ax.plot(x, s[:, i], color=GROUP_COLORS[g], lw=0.8, alpha=0.35)
        ax.plot(x, _group_mean(s, layers), color=GROUP_COLORS[g], lw=2.2, marker="o", ms=3,
                label=f"{GROUP_NAMES[g]} (layers {', '.join(map(str, layers))}): group mean")
    _sqrt_line(ax, data["d_head"])
    ax.set_ylabel("mean key L2 norm")
    ax.set_title(f"Key norm over training: {label(cond)} ({data['seeds']})\n"
                 f"thick: group mean, thin: each layer of the group; keys at the k_norm output (pre-RoPE)")
    ax.legend()
    return save(fig, path)


def render(folder, runs: dict[str, list[dict]]) -> list[Path]:
    folder = Path(folder)
    out: list[Path] = []
    for cond, results in runs.items():
        a_path = folder / figure_name("key_analysis_report", cond, len(runs))
        e_path = folder / figure_name("key_norm_evolution", cond, len(runs))
        data = condition_data(results)
        if data is None or data["n_layers"] == 0 or len(data["tokens"]) == 0:
            msg = ("This results file has no per-probe key records ('probes'),\n"
                   "only the write-ups' summary fields; key norms cannot be drawn.")
            out += [message_figure(a_path, f"Key dynamics: {label(cond)}", msg),
                    message_figure(e_path, f"Key norm over training: {label(cond)}", msg)]
            continue
        out += [_analysis_figure(a_path, cond, data), _evolution_figure(e_path, cond, data)]
    return out


# ----------------------------------------------------------------------------- report

def classify_layers(final_norms, d_head: int, tol: float = AT_TOLERANCE) -> dict[str, list[int]]:
    """Layers whose final norm ends above / below / within tol of sqrt(d_head)."""
    ref = math.sqrt(d_head)
    out = {"above": [], "below": [], "at": []}
    for i, v in enumerate(final_norms):
        if not np.isfinite(v):
            continue
        out["above" if v > ref * (1 + tol) else "below" if v < ref * (1 - tol) else "at"].append(i)
    return out


def _layers_text(layers: list[int]) -> str:
    if not layers:
        return "none"
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(map(str, layers))


def write_report(folder, runs: dict[str, list[dict]]) -> Path:
    folder = Path(folder)
    lines = ["# Key dynamics: what happens with attention keys as the LLM trains", "",
             "Keys measured at the k_norm output (pre-RoPE) on the fixed evaluation batch; every per-layer "
             "number is the mean over the layer's KV heads. norm = mean L2 norm of a key; max_abs = largest "
             "absolute key component (outlier magnitude); cos_mean = mean pairwise cosine similarity of keys "
             "within a sequence (redundancy); peak_frac = share of a key's energy in its top dimension.", ""]
    for cond, results in runs.items():
        lines += [f"## {label(cond)} (`{cond}`)", ""]
        data = condition_data(results)
        if data is None or data["n_layers"] == 0 or len(data["tokens"]) == 0:
            lines += ["No per-probe key records ('probes') in the results file(s): only the write-ups' summary "
                      "fields, so there is nothing to report on keys.", ""]
            continue
        s, L, d_head = data["series"], data["n_layers"], data["d_head"]
        ref = math.sqrt(d_head)
        groups = layer_groups(L)
        t = data["tokens"]
        final = s["norm_mean"][-1]
        cls = classify_layers(final, d_head)
        lines += [f"- Runs: {data['seeds']}" + (" (every number below is the mean over seeds, probe by probe)"
                                                if data["n_seeds"] > 1 else ""),
                  f"- Probes: {len(t)}, from {fmt_tokens(t[0])} to {fmt_tokens(t[-1])} training tokens",
                  f"- d_head = {d_head} ({data['d_source']}), so sqrt(d_head) = {ref:.2f}; a final norm within "
                  f"±{AT_TOLERANCE:.0%} of it ({ref * (1 - AT_TOLERANCE):.2f} to {ref * (1 + AT_TOLERANCE):.2f}) "
                  f"counts as at sqrt(d_head)",
                  f"- Ended above sqrt(d_head): {_layers_text(cls['above'])}",
                  f"- Ended below sqrt(d_head): {_layers_text(cls['below'])}",
                  f"- Ended at sqrt(d_head) (within ±{AT_TOLERANCE:.0%}): {_layers_text(cls['at'])}", "",
                  "### Per layer (initial = first probe, final = last probe)", "",
                  "| layer | group | initial norm | final norm | change | vs sqrt(d_head) | initial max_abs | "
                  "final max_abs | initial cos_mean | final cos_mean | final peak_frac |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for i in range(L):
            where = "above" if i in cls["above"] else "below" if i in cls["below"] else \
                "at" if i in cls["at"] else "n/a"
            n0, n1 = s["norm_mean"][0, i], s["norm_mean"][-1, i]
            lines.append(f"| {i} | {group_of(i, groups)} | {fmt_num(n0)} | {fmt_num(n1)} | {fmt_num(n1 - n0, 3)} | {where} | "
                         f"{fmt_num(s['max_abs'][0, i])} | {fmt_num(s['max_abs'][-1, i])} | "
                         f"{fmt_num(s['cos_mean'][0, i], 4)} | {fmt_num(s['cos_mean'][-1, i], 4)} | "
                         f"{fmt_num(s['peak_frac'][-1, i], 4)} |")
        lines += ["", "### Layer groups (mean over the group's layers)", "",
                  "| group | layers | initial norm | final norm | initial max_abs | final max_abs | "
                  "initial cos_mean | final cos_mean |", "|---|---|---|---|---|---|---|---|"]
        for g, layers in groups.items():
            def gm(m, p):
                return float(_group_mean(s[m][[p]], layers)[0])
            lines.append(f"| {g} | {', '.join(map(str, layers))} | {fmt_num(gm('norm_mean', 0))} | "
                         f"{fmt_num(gm('norm_mean', -1))} | {fmt_num(gm('max_abs', 0))} | {fmt_num(gm('max_abs', -1))} | "
                         f"{fmt_num(gm('cos_mean', 0), 4)} | {fmt_num(gm('cos_mean', -1), 4)} |")
        if data["n_seeds"] > 1:
            per_seed = np.array([layer_series(r, "norm_mean")[-1] for r in results if r.get("probes")])
            lines += ["", "Final norm per layer, spread over seeds (std): "
                      + ", ".join(f"layer {i}: {np.nanstd(per_seed[:, i]):.3f}" for i in range(L))]
        lines.append("")
    path = folder / "report.md"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
