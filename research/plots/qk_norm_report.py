"""report.md of the QK-norm study: final values, the verdict with its rule, pairwise tests, the
write-ups' claims and provenance, as text from the analysis (research.analysis.qk_norm)."""
from __future__ import annotations

import math

from research.analysis.qk_norm import QkNormAnalysis
from research.analysis.rules import ALPHA, runs_of
from research.plots.qk_norm import SITE_TEXT, name
from research.results.read import seed_of
from research.results.vocabulary import LETTERS


def _fmt(entry: dict, field: str, decimals: int) -> str:
    """A summary value as 'mean \u00b1 95% half width' (the half width only with several seeds)."""
    mean, half = entry[field], entry[f"{field}_ci95"]
    if mean is None:
        return "n/a"
    if half is not None:
        return f"{mean:.{decimals}f} \u00b1 {half:.{decimals}f}"
    return f"{mean:.{decimals}f}"


def _fmt_p(p: float) -> str:
    if not math.isfinite(p):
        return "n/a"
    return f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}"


def _provenance(runs: dict, cond: str) -> str:
    rl = runs_of(runs, cond)
    if not any(r.get("preset") or seed_of(r) is not None or r.get("provenance") or r.get("config") for r in rl):
        return "write-up results (no provenance recorded)"
    presets = sorted({str(r.get("preset") or (r.get("config") or {}).get("preset")) for r in rl} - {"None"})
    seeds = [seed_of(r) for r in rl]
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


def _seeds_sentence(runs: dict, conds: list[str]) -> str:
    seed_sets = {c: [seed_of(r) for r in runs_of(runs, c)] for c in conds}
    known = [v for v in seed_sets.values() if all(s is not None for s in v)]
    if conds and len(known) == len(conds) and all(sorted(map(str, v)) == sorted(map(str, known[0])) for v in known):
        return f"Every condition ran seed(s) {', '.join(map(str, known[0]))}. "
    if known:
        return "Seeds differ between conditions (see Provenance). "
    return "Seeds not recorded. "


def _verdict_lines(analysis: QkNormAnalysis) -> list[str]:
    tri = analysis.verdict
    lines = ["", "## Triangulation verdict", "", f"**{tri.verdict[0].upper()}{tri.verdict[1:]}.**", "",
             "Reading: A\u2260B\u2248C \u2192 the gain drives rank; A\u2248B\u2260C \u2192 the normalization does; "
             "all differ \u2192 both.", "",
             f"Rule: {tri.rule}. Applied here: {tri.rule_applied}.", ""]
    for (x, y), c in tri.pairs.items():
        extra = ""
        if c.tested:
            extra = f", Welch p = {_fmt_p(c.p)}"
            if not c.close and c.p >= ALPHA:
                extra += " (above the threshold but not significant: treat as inconclusive)"
        lines.append(f"- {LETTERS[x]} vs {LETTERS[y]}: final PR {c.mean_a:.1f} vs {c.mean_b:.1f}, "
                     f"difference {c.diff:+.1f} = {c.rel:.1%} of the mean{extra} \u2192 "
                     f"**{'equal' if c.equal else 'different'}**")
    return lines


def _pairwise_lines(analysis: QkNormAnalysis) -> list[str]:
    lines = ["", "## Pairwise differences (Welch t-test)", "",
             "Difference = first minus second condition, with its 95% CI (Welch); p is two-sided.", "",
             "| pair | \u0394 final PR | p | \u0394 final train loss | p | \u0394 final val loss | p |",
             "|---|---|---|---|---|---|---|"]
    decimals = {"mean_pr": 1, "loss": 3, "val_loss": 3}
    rows: dict[tuple[str, str], list[str]] = {}
    for d in analysis.pairwise:
        dec = decimals[d.field]
        rows.setdefault((d.a, d.b), []).extend(
            [f"{d.diff:+.{dec}f}" + (f" \u00b1 {d.ci95:.{dec}f}" if math.isfinite(d.ci95) else ""), _fmt_p(d.p)])
    for (x, y), cells in rows.items():
        lines.append(f"| {LETTERS.get(x, x)} \u2212 {LETTERS.get(y, y)} | " + " | ".join(cells) + " |")
    return lines


def report(runs: dict, analysis: QkNormAnalysis) -> str:
    """The text of report.md."""
    conds = analysis.conditions
    ns = {c: len(runs_of(runs, c)) for c in conds}
    several = any(n >= 2 for n in ns.values())
    L = ["# QK-norm study: does the gain or the normalization drive key rank?", ""]
    L.append("Conditions: " + "; ".join(name(c) for c in conds) + ". " + _seeds_sentence(runs, conds) +
             "PR is the participation ratio (sum s)\u00b2 / sum s\u00b2 of the singular values of the keys "
             f"({SITE_TEXT}), averaged over KV heads and layers; 'final' = the last probe.")
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
        e = analysis.summary[c]
        L.append(f"| {name(c)} | {_fmt(e, 'final_pr', 1)} | {_fmt(e, 'final_loss', 3)} "
                 f"| {_fmt(e, 'final_val_loss', 3)} | {ns[c]} |")
    L += _verdict_lines(analysis)
    if several:
        L += _pairwise_lines(analysis)
    L += ["", "## The write-ups' claims at this scale", ""]
    if not several:
        L += ["(Single-run observations: one seed per condition.)", ""]
    for k, cl in analysis.claims.items():
        L.append(f"- ({k}) {cl.claim}: **{cl.status}**. {cl.text}")
    L += ["", "## Figures", "",
          "1_loss.png (train solid, validation dashed), 2_key_pr_causal.png (mean PR over tokens), "
          "3_per_layer.png (PR per layer at the last probe), 4_causal_decomposition.png (A\u2212B gain effect, "
          "B\u2212C normalization effect per layer), 5_gamma_cv.png (gain CV over training).", "",
          "## Provenance", ""]
    for c in conds:
        L.append(f"- {c}: {_provenance(runs, c)}")
    return "\n".join(L) + "\n"
