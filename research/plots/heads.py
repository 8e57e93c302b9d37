"""Head specialization: attention sinks vs gatherers.

Per KV head over training, from the probe records: key norm (k_norm.norm_mean), max_abs,
pr_vec, attention entropy, sink mass and q/k norm ratio, plus the layer's k_norm gains.
Attention metrics are measured per query head; a KV head gets the MEAN over the query
heads that share it (query head h belongs to KV head h // (n_heads // n_kv_heads)).

Figures (one set per condition; with several conditions the names get the condition as
a suffix, e.g. norm_divergence_QK.png). Per-head figures use one run (the first seed):
heads are not matched across seeds, so averaging them would mix unrelated heads.

    norm_divergence.png      key norm and entropy of every KV head of one layer over training
                             (default layer: the one whose KV-head norms spread most at the last probe)
    entropy_norm_scatter.png every (layer, KV head) at every probe as a dot, key norm vs entropy,
                             coloured by training tokens, with the taxonomy thresholds
    effective_rank.png       erank of the keys (layer mean over KV heads) per layer over training
    gamma_heatmap.png        k_norm gain per dimension over training for the same layer

Taxonomy at the last probe, relative to the medians over all (layer, KV head) of the run
(margin m = 0.1):
    sink      key norm > median_norm * (1 + m)  and  entropy < median_entropy * (1 - m)
    gatherer  key norm < median_norm * (1 - m)  and  entropy > median_entropy * (1 + m)
    neither   otherwise

Imports numpy, matplotlib and research.plots only (never torch).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.colors import Normalize

from research.plots.common import (fmt_num, fmt_tokens, label, mean_over_seeds, message_figure, plt, save,
                                   tokens_axis)
from research.plots.keys import d_head_of, figure_name, layer_series, probe_tokens

MARGIN = 0.1
SITE = "k_norm"
HEAD_METRICS = ("norm_mean", "max_abs", "pr_vec")          # per KV head, from probes[*].layers[*].k_norm
ATTN_METRICS = ("entropy", "sink_mass", "qk_ratio")        # per query head, grouped onto KV heads


# ----------------------------------------------------------------------------- data

def _nan_list(values, n):
    if not values:
        return [math.nan] * n
    return [math.nan if v is None else float(v) for v in values]


def head_arrays(res: dict) -> dict | None:
    """Per-head series of one run: {metric: [n_probes, n_layers, n_kv_heads]}, tokens, gains, shapes.

    None if the run has no probe records.
    """
    probes = res.get("probes") or []
    if not probes:
        return None
    L = len(probes[0]["layers"])
    first = probes[0]["layers"][0]
    n_kv = len(first[SITE]["norm_mean"])
    model = ((res.get("config") or {}).get("model") or {})
    n_q = model.get("n_heads") or len((first.get("attn") or {}).get("entropy") or []) or n_kv
    group = max(1, int(n_q) // n_kv)
    P = len(probes)
    out = {m: np.full((P, L, n_kv), np.nan) for m in (*HEAD_METRICS, *ATTN_METRICS)}
    gains: list[list[np.ndarray | None]] = [[None] * L for _ in range(P)]
    for p, probe in enumerate(probes):
        for rec in probe["layers"]:
            i = rec["layer"]
            for m in HEAD_METRICS:
                out[m][p, i] = _nan_list(rec[SITE].get(m), n_kv)
            attn = rec.get("attn") or {}
            for m in ATTN_METRICS:
                q = np.array(_nan_list(attn.get(m), n_kv * group), dtype=float)
                if q.size == n_kv * group:
                    out[m][p, i] = q.reshape(n_kv, group).mean(axis=1)
            g = rec.get("gamma_k")
            if g and g.get("values"):
                gains[p][i] = np.asarray(g["values"], dtype=float)
    qk_mode = model.get("qk_norm")
    return {"series": out, "tokens": probe_tokens(res), "n_layers": L, "n_kv": n_kv, "group": group, "gains": gains,
            "qk_norm": qk_mode, "d_head": d_head_of(res)[0], "seed": res.get("seed")}


def choose_layer(h: dict) -> tuple[int, str]:
    """The layer whose KV-head key norms spread most (max - min) at the last probe, and why."""
    last = h["series"]["norm_mean"][-1]
    if h["n_kv"] > 1:
        spread = np.nan_to_num(np.nanmax(last, axis=1) - np.nanmin(last, axis=1), nan=-1.0)
        i = int(np.argmax(spread))
        return i, f"largest spread of KV-head norms at the last probe ({spread[i]:.2f})"
    change = np.nan_to_num(np.abs(last[:, 0] - h["series"]["norm_mean"][0][:, 0]), nan=-1.0)
    i = int(np.argmax(change))
    return i, f"one KV head per layer: largest norm change over training ({change[i]:.2f})"


def _nanmedian(a) -> float:
    a = np.asarray(a, float)
    a = a[np.isfinite(a)]
    return float(np.median(a)) if a.size else math.nan


def classify(norms, entropies, margin: float = MARGIN) -> dict:
    """Sink / gatherer / neither for every head, relative to the medians of the given heads.

    norms, entropies: arrays of the same shape (e.g. [n_layers, n_kv_heads] at the last probe).
    Returns {"classes": array of str, "median_norm", "median_entropy", "margin", thresholds}.
    """
    norms, entropies = np.asarray(norms, float), np.asarray(entropies, float)
    med_n, med_e = _nanmedian(norms), _nanmedian(entropies)
    hi_n, lo_n = med_n * (1 + margin), med_n * (1 - margin)
    hi_e, lo_e = med_e * (1 + margin), med_e * (1 - margin)
    classes = np.full(norms.shape, "neither", dtype=object)
    classes[(norms > hi_n) & (entropies < lo_e)] = "sink"
    classes[(norms < lo_n) & (entropies > hi_e)] = "gatherer"
    classes[~np.isfinite(norms) | ~np.isfinite(entropies)] = "n/a"
    return {"classes": classes, "median_norm": med_n, "median_entropy": med_e, "margin": margin,
            "sink_norm": hi_n, "sink_entropy": lo_e, "gatherer_norm": lo_n, "gatherer_entropy": hi_e}


# ----------------------------------------------------------------------------- figures

def _head_label(h: dict, k: int) -> str:
    g = h["group"]
    q = f"query head {k * g}" if g == 1 else f"query heads {k * g}-{k * g + g - 1}"
    return f"KV head {k} ({q})"


def _divergence_figure(path: Path, cond: str, h: dict, layer: int, why: str, seed_txt: str) -> Path:
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    colors = plt.get_cmap("tab10")
    for ax, metric, ylabel in ((a, "norm_mean", "mean key L2 norm"),
                               (b, "entropy", "attention entropy (nats), mean over its query heads")):
        x = tokens_axis(ax, h["tokens"])
        for k in range(h["n_kv"]):
            ax.plot(x, h["series"][metric][:, layer, k], color=colors(k % 10), lw=2, marker="o", ms=3,
                    label=_head_label(h, k))
        ax.set_ylabel(ylabel)
        ax.legend()
    a.axhline(math.sqrt(h["d_head"]), color="black", ls="--", lw=1)
    a.text(0.01, math.sqrt(h["d_head"]), f" √d_head = {math.sqrt(h['d_head']):.2f}", va="bottom", fontsize=8,
           transform=a.get_yaxis_transform())
    a.set_title("key norm per KV head")
    b.set_title("attention entropy per KV head")
    one = " (one KV head per layer: one line)" if h["n_kv"] == 1 and "one KV head" not in why else ""
    fig.suptitle(f"Per-head divergence in layer {layer}: {label(cond)}, {seed_txt}\n"
                 f"layer {layer} chosen: {why}{one}", fontsize=11)
    return save(fig, path)


def _scatter_figure(path: Path, cond: str, h: dict, cls: dict, seed_txt: str) -> Path:
    s = h["series"]
    P = len(h["tokens"])
    norms, ents = s["norm_mean"].reshape(P, -1), s["entropy"].reshape(P, -1)
    tok = np.repeat(h["tokens"][:, None], norms.shape[1], axis=1) / 1e6
    fig, ax = plt.subplots(figsize=(9.5, 6.5))
    sc = ax.scatter(norms.ravel(), ents.ravel(), c=tok.ravel(), cmap="viridis", s=18, alpha=0.8,
                    norm=Normalize(np.nanmin(tok), max(np.nanmax(tok), np.nanmin(tok) + 1e-9)), lw=0)
    ax.scatter(norms[-1], ents[-1], facecolors="none", edgecolors="black", s=60, lw=1.2,
               label="heads at the last probe (classified)")
    fig.colorbar(sc, ax=ax, label="training tokens (millions)")
    xl, yl = ax.get_xlim(), ax.get_ylim()
    for name, col in (("sink", "#c44e52"), ("gatherer", "#2a9d8f")):
        ax.axvline(cls[f"{name}_norm"], color=col, lw=1, ls="--")
        ax.axhline(cls[f"{name}_entropy"], color=col, lw=1, ls="--")
    x0, x1 = min(xl[0], cls["gatherer_norm"]), max(xl[1], cls["sink_norm"])
    y0, y1 = min(yl[0], cls["sink_entropy"]), max(yl[1], cls["gatherer_entropy"])
    px, py = 0.04 * (x1 - x0), 0.04 * (y1 - y0)  # keep threshold lines off the frame
    x0, x1, y0, y1 = x0 - px, x1 + px, y0 - py, y1 + py
    ax.fill_between([cls["sink_norm"], x1], y0, cls["sink_entropy"], color="#c44e52", alpha=0.12, lw=0,
                    label=f"sinks (high norm, low entropy):\nnorm > {cls['sink_norm']:.2f}, "
                          f"entropy < {cls['sink_entropy']:.2f}")
    ax.fill_between([x0, cls["gatherer_norm"]], cls["gatherer_entropy"], y1, color="#2a9d8f", alpha=0.12, lw=0,
                    label=f"gatherers (low norm, high entropy):\nnorm < {cls['gatherer_norm']:.2f}, "
                          f"entropy > {cls['gatherer_entropy']:.2f}")
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    ax.set_xlabel("mean key L2 norm of the KV head")
    ax.set_ylabel("attention entropy (nats), mean over the KV head's query heads")
    ax.set_title(f"Every head at every probe: {label(cond)}, {seed_txt}\n"
                 f"one dot per (layer, KV head) per probe; thresholds = medians at the last probe × (1 ± {MARGIN:g})")
    ax.legend(loc="best", fontsize=8)
    return save(fig, path)


def _erank_figure(path: Path, cond: str, results: list[dict], d_head: int) -> Path:
    with_probes = [r for r in results if r.get("probes")]
    er = mean_over_seeds([layer_series(r, "erank", SITE) for r in with_probes])
    tokens = probe_tokens(with_probes[0])[:er.shape[0]]
    L = er.shape[1]
    fig, ax = plt.subplots(figsize=(9.5, 5.5))
    x = tokens_axis(ax, tokens)
    cmap = plt.get_cmap("viridis")
    norm = Normalize(0, max(L - 1, 1))
    for i in range(L):
        ax.plot(x, er[:, i], color=cmap(norm(i)), lw=1.8, marker="o", ms=2.5,
                label=f"layer {i}" if L <= 8 else None)
    if L > 8:  # too many layers for a legend: a colour bar of depth instead
        fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="layer (0 = first)")
    ax.axhline(d_head, color="black", ls=":", lw=1, label=f"d_head = {d_head} (largest possible)")
    ax.set_ylabel("effective rank of the keys (exp of singular-value entropy)")
    n = len(with_probes)
    seeds = f"mean over {n} seeds" if n > 1 else (f"seed {with_probes[0].get('seed')}"
                                                  if with_probes[0].get("seed") is not None else "1 run")
    ax.set_title(f"Effective rank of the keys per layer over training: {label(cond)}, {seeds}\n"
                 f"keys at the k_norm output (pre-RoPE), mean over the layer's KV heads")
    ax.legend(fontsize=8, ncol=2 if L > 4 else 1)
    return save(fig, path)


def _gamma_figure(path: Path, cond: str, h: dict, layer: int, why: str, seed_txt: str) -> Path:
    cols = [(p, g[layer]) for p, g in enumerate(h["gains"]) if g[layer] is not None]
    if not cols:
        mode = h.get("qk_norm")
        reason = ("this run has qk_norm = none: keys are not normalized, so there are no k_norm gains"
                  if mode in (None, "none") else "no k_norm gain values were recorded in this run")
        return message_figure(path, f"k_norm gain heatmap, layer {layer}: {label(cond)}",
                              f"Nothing to draw:\n{reason}.")
    probes = [p for p, _ in cols]
    G = np.stack([g for _, g in cols], axis=1)  # [D, n_probes]
    half = float(np.nanmax(np.abs(G - 1.0))) if np.isfinite(G).any() else 0.0
    half = max(half, 1e-3)
    fig, ax = plt.subplots(figsize=(10, 6.5))
    im = ax.imshow(G, aspect="auto", origin="lower", cmap="RdBu_r", vmin=1 - half, vmax=1 + half,
                   interpolation="nearest")
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="k_norm gain γ (1 = initial value)")
    ticks = np.unique(np.linspace(0, len(probes) - 1, min(len(probes), 8)).round().astype(int))
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{h['tokens'][probes[t]] / 1e6:.3g}" for t in ticks])
    ax.set_xlabel("training tokens (millions) at each probe")
    ax.set_ylabel("key dimension (0 .. d_head - 1)")
    frozen = " (gain frozen at 1)" if h.get("qk_norm") == "frozen" else ""
    ax.set_title(f"k_norm gain per dimension over training, layer {layer}{frozen}: {label(cond)}, {seed_txt}\n"
                 f"layer {layer}: {why}; one gain vector shared by the layer's heads")
    return save(fig, path)


def _seed_txt(res: dict, n: int) -> str:
    s = res.get("seed")
    base = f"seed {s}" if s is not None else "first run"
    return base + (f" (first of {n} seeds)" if n > 1 else "")


def render(folder, runs: dict[str, list[dict]], layer: int | None = None) -> list[Path]:
    """Draw the four head-specialization figures per condition; `layer` fixes the layer of the
    divergence and gain figures (default: the layer whose KV-head norms spread most at the last probe)."""
    folder = Path(folder)
    out: list[Path] = []
    for cond, results in runs.items():
        names = {b: folder / figure_name(b, cond, len(runs))
                 for b in ("norm_divergence", "entropy_norm_scatter", "effective_rank", "gamma_heatmap")}
        with_probes = [r for r in results if r.get("probes")]
        h = head_arrays(with_probes[0]) if with_probes else None
        if h is None:
            msg = ("This results file has no per-probe head records ('probes'),\n"
                   "only the write-ups' summary fields; per-head figures cannot be drawn.")
            out += [message_figure(p, f"{b.replace('_', ' ')}: {label(cond)}", msg) for b, p in names.items()]
            continue
        if layer is not None and not 0 <= layer < h["n_layers"]:
            raise ValueError(f"layer {layer} does not exist: the model has layers 0..{h['n_layers'] - 1}")
        chosen, why = (layer, "set by the caller") if layer is not None else choose_layer(h)
        seed_txt = _seed_txt(with_probes[0], len(with_probes))
        cls = classify(h["series"]["norm_mean"][-1], h["series"]["entropy"][-1])
        out += [_divergence_figure(names["norm_divergence"], cond, h, chosen, why, seed_txt),
                _scatter_figure(names["entropy_norm_scatter"], cond, h, cls, seed_txt),
                _erank_figure(names["effective_rank"], cond, results, h["d_head"]),
                _gamma_figure(names["gamma_heatmap"], cond, h, chosen, why, seed_txt)]
    return out


# ----------------------------------------------------------------------------- report

def _heads_text(pairs) -> str:
    return "; ".join(f"layer {i} KV head {k}" for i, k in pairs) if pairs else "none"


def write_report(folder, runs: dict[str, list[dict]]) -> Path:
    folder = Path(folder)
    lines = ["# Head specialization: sinks vs gatherers", "",
             "Per KV head, on the fixed evaluation batch. Key metrics at the k_norm output (pre-RoPE): norm = mean "
             "key L2 norm, max_abs = largest |key component|, pr_vec = dimensions used by one key. Attention "
             "metrics are measured per query head; the entropy (nats), sink mass (attention on position 0) and "
             "q/k norm ratio of a KV head are the MEAN over the query heads that share it "
             "(query head h -> KV head h // (n_heads / n_kv_heads)).", "",
             f"Taxonomy at the last probe, relative to the medians over all (layer, KV head) pairs of the run, "
             f"margin m = {MARGIN:g}:", "",
             f"- **sink**: norm > median norm × {1 + MARGIN:g} and entropy < median entropy × {1 - MARGIN:g}",
             f"- **gatherer**: norm < median norm × {1 - MARGIN:g} and entropy > median entropy × {1 + MARGIN:g}",
             "- **neither**: every other head", ""]
    for cond, results in runs.items():
        lines += [f"## {label(cond)} (`{cond}`)", ""]
        with_probes = [r for r in results if r.get("probes")]
        if not with_probes:
            lines += ["No per-probe head records ('probes') in the results file(s): nothing to classify.", ""]
            continue
        for idx, res in enumerate(with_probes):
            h = head_arrays(res)
            s = h["series"]
            cls = classify(s["norm_mean"][-1], s["entropy"][-1])
            c = cls["classes"]
            sinks = [(i, k) for i in range(h["n_layers"]) for k in range(h["n_kv"]) if c[i, k] == "sink"]
            gath = [(i, k) for i in range(h["n_layers"]) for k in range(h["n_kv"]) if c[i, k] == "gatherer"]
            chosen, why = choose_layer(h)
            seed = res.get("seed")
            lines += [f"### {'seed ' + str(seed) if seed is not None else 'run ' + str(idx + 1)}", "",
                      f"- Last probe at {fmt_tokens(h['tokens'][-1])} training tokens; {h['n_layers']} layers × "
                      f"{h['n_kv']} KV heads ({h['group']} query head(s) per KV head)",
                      f"- Medians over the {h['n_layers'] * h['n_kv']} heads: norm {cls['median_norm']:.3f}, "
                      f"entropy {cls['median_entropy']:.3f} nats",
                      f"- Thresholds: sink if norm > {cls['sink_norm']:.3f} and entropy < {cls['sink_entropy']:.3f}; "
                      f"gatherer if norm < {cls['gatherer_norm']:.3f} and entropy > {cls['gatherer_entropy']:.3f}",
                      f"- Sinks ({len(sinks)}): {_heads_text(sinks)}",
                      f"- Gatherers ({len(gath)}): {_heads_text(gath)}",
                      f"- Neither: {int((c == 'neither').sum())} heads",
                      f"- Layer with the largest head divergence: layer {chosen} ({why})"]
            g_last = h["gains"][-1][chosen]
            if g_last is not None:
                lines.append(f"- k_norm gain of layer {chosen} at the last probe: mean {np.mean(g_last):.3f}, "
                             f"min {np.min(g_last):.3f}, max {np.max(g_last):.3f}, "
                             f"cv {np.std(g_last) / abs(np.mean(g_last)):.4f}")
            if idx == 0:
                lines += ["", "| layer | KV head | norm | max_abs | pr_vec | entropy | sink_mass | qk_ratio | class |",
                          "|---|---|---|---|---|---|---|---|---|"]
                for i in range(h["n_layers"]):
                    for k in range(h["n_kv"]):
                        lines.append(f"| {i} | {k} | {fmt_num(s['norm_mean'][-1, i, k])} | "
                                     f"{fmt_num(s['max_abs'][-1, i, k])} | {fmt_num(s['pr_vec'][-1, i, k], 2)} | "
                                     f"{fmt_num(s['entropy'][-1, i, k])} | {fmt_num(s['sink_mass'][-1, i, k], 4)} | "
                                     f"{fmt_num(s['qk_ratio'][-1, i, k])} | {c[i, k]} |")
            lines.append("")
    path = folder / "report.md"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
