"""report.md of research/pretrained_keys_study.py, from the analysis of pretrained_keys.json alone (no torch).

The report opens with "In short" (in_short, placed by research.studies.render): each model's four answers, their open
outcomes settled, as Kind.settle says, by a replication on new text batches. Then what is measured, said once for
every model (_how_read: the text, a table of the models, what each section's numbers are), and each model's section
with its numbers alone, under its label (research.plots.pretrained.labels). Each figure (one panel per model) is
placed once, after the table or paragraph of the first model it shows."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from research.analysis import pretrained as A
from research.analysis.rules import DESCRIPTIVE, INCONCLUSIVE, UNRESOLVED
from research.analysis.wording import interval_text, needed_text, ratio_text, untested_text
from research.analysis.heads import SINK_MASS, TAXONOMY_MARGIN
from research.plots.common import cell_text, decision_table, figure_line, fmt_code, fmt_num
from research.plots.in_short import MOST, decided_part
from research.plots.pretrained import labels


@dataclass(frozen=True)
class Shown:
    """What the report's model sections share: the models (each figure has a panel per model, and is placed once,
    where first shown), and the model a section is of (named in its tables' headers where there are several)."""

    models: tuple
    gains: tuple = ()  # the models with a k_norm gain: the gain figure's panels
    model: str = ""
    placed: set = field(default_factory=set)  # the figures placed so far (one set for the whole report)

    def named(self, what: str) -> str:
        """A table's first header cell: what it compares, and of which model where there are several."""
        return f"{what} ({self.model})" if len(self.models) > 1 else what


def _ci(d) -> str:
    if not d.tested:
        return "one batch: no interval" if d.outcome == DESCRIPTIVE else f"{untested_text(d, 2, 'batch')}: no interval"
    est, ci = interval_text(d, 2)  # decided on log ratios: the ratio minus 1 and its interval, in %
    return f"{f'ratio {est}, ' if d.ratio else ''}{d.ci_level:.1%} CI {ci}, p (Bonferroni) {d.p_adj:.2g}"


def _against(d, what: str, above: str, below: str, margin: float) -> str:
    """A verdict phrase for a difference d = value - reference, never more than the test showed."""
    if not d.tested:
        return f"{d.diff:+.2f} against {what} ({'one batch: descriptive' if d.outcome == DESCRIPTIVE else _ci(d)})"
    if d.outcome == INCONCLUSIVE:
        return f"inconclusive{needed_text(d, 'batch')} against {what} ({d.diff:+.2f}, {_ci(d)})"
    if d.same:
        return f"equal to {what} within \u00b1{margin:.0%} ({d.diff:+.2f}, {_ci(d)}; {d.outcome})"
    side = above if d.est > 0 else below
    # decided on log ratios, the side is the ratio's: the size is the ratio's too (in _ci), never |mean difference|,
    # whose sign need not be the ratio's
    size = "" if d.ratio else f" by {abs(d.diff):.2f}"
    rel = "" if d.ratio else f"{d.rel:+.0%}; "
    if d.outcome == UNRESOLVED:
        return (f"{side} {what}{size} ({rel}{_ci(d)}), but whether by more than "
                f"\u00b1{margin:.0%} is unresolved{needed_text(d, 'batch')}")
    return f"{side} {what}{size}, beyond \u00b1{margin:.0%} ({rel}{_ci(d)})"


def _text_of(rec: dict, n: int) -> str:
    """The text a model was measured on: '3 batches of 2 windows of 16 tokens of english-v1 (sha256 ..., seed 0), one
    window per document'."""
    t = {k: "?" if v is None else v for k, v in (rec.get("text") or {}).items()}  # a hand-made file may say less
    t = {"batch": "?", "seq_len": "?", "source": "?", "sha256": "?", "seed": "?", **t}
    return (f"{n} batches of {t['batch']} windows of {t['seq_len']} tokens of {t['source']} (sha256 "
            f"{str(t['sha256'])[:12]}, seed {t['seed']}), one window per document")


def _layers_cell(n_layers: int) -> str:
    groups = A.layer_groups(n_layers)
    return f"{n_layers} (" + "; ".join(f"{g} {', '.join(map(str, ix))}" for g, ix in groups.items()) + ")"


def _models_table(analysis: A.PretrainedAnalysis) -> list[str]:
    """One row per model (by its label): what it is, where from, its loss on the text and its time; the layer groups
    the claims read (research.analysis.keys.layer_groups)."""
    rows = ["| model | family (type) | parameters | layers (groups) | query / KV heads | head size | loss (nats/token; "
            "sd over batches) | measured in | from |", "|---|---|---|---|---|---|---|---|---|"]
    label = labels(analysis.models)
    for name, model in analysis.models.items():
        rec = model.record
        r = {"family": "?", "model_type": "?", "source": "?", **{k: v for k, v in rec.items() if v is not None}}
        params = f"{rec['params']:,}" if rec.get("params") is not None else "?"
        wall = f"{rec['wall_s']:.0f} s" if rec.get("wall_s") is not None else "? s"
        loss, loss_sd = model.loss
        rows.append(f"| {cell_text(label[name])} | {cell_text(r['family'])} ({cell_text(r['model_type'])}) | "
                    f"{params} | {_layers_cell(rec['n_layers'])} | {rec['n_heads']} / {rec['n_kv_heads']} | "
                    f"{rec['head_dim']} | {loss:.3f} ({fmt_num(loss_sd)}) | {wall} | {cell_text(r['source'])} |")
    return rows


def _how_read(analysis: A.PretrainedAnalysis, texts: set) -> list[str]:
    """What every model's sections measure, said once: the models, the text where they share it, and each part's
    definitions; the model sections below give their numbers alone."""
    models = list(analysis.models.values())
    several = len(models) > 1
    lines = [f"## {'The models and what their sections' if several else 'The model and what its section'} measure"
             f"{'' if several else 's'}", ""]
    if len(texts) == 1:
        lines += [f"Text{', the same for every model' if several else ''}: {next(iter(texts))}.", ""]
    lines += _models_table(analysis) + [""]
    if any(m.record.get("gguf") for m in models):
        lines += ["A model converted from GGUF (its section names the file) has the keys of its dequantized weights: "
                  "its keys, ranks and bits describe that file's model, not the original's; its gains are exact "
                  "(float32).", ""]
    lines += [
        f"{'Each model' if several else 'The model'}'s section gives, in this order:", "",
        "1. Key norms against sqrt(d_head), by depth: the mean key norm of each layer group (in the table) at k_norm "
        "where the model has one, else at k_proj (RoPE keeps norms), each group against sqrt(d_head), then the "
        "groups against each other, paired by batch.",
        f"2. Sinks and gatherers. Sink rate: the share of query heads with mean first-token attention > {SINK_MASS} "
        "over query positions 1..T-1, and with position 0 (Gu et al. 2024's mean, which counts query 0's forced "
        "weight of 1). Taxonomy (research/analysis/heads.py), on the mean over batches, a KV head taking the mean of "
        f"its query heads: a sink has first-token attention > {SINK_MASS} and entropy below the model's median "
        f"entropy by more than {TAXONOMY_MARGIN:.0%}, a gatherer first-token attention <= {SINK_MASS} and "
        f"entropy above it by more than {TAXONOMY_MARGIN:.0%}. Then the top-sink KV head of each layer (the most "
        "first-token attention) against the layer's other KV heads, key norm, mean over layers; and, in the layers "
        "holding both, the sinks' keys against the gatherers'."
        + (" With one KV head per layer (Gemma 3 270M) the query heads share their keys: no within-layer comparison "
           "exists." if any(m.record["n_kv_heads"] < 2 for m in models) else ""),
        "3. Spread of the k_norm gain, where the model has k_norm: the gain as the model applies it (1 + w for "
        "Gemma), per layer; weights, so exact: described, no test. CV = std / |mean|; golden dimensions: those whose "
        f"gain lies above the layer's median + {A.GOLDEN_K:g} robust SD ({A.MAD_TO_SD} MAD), with their share of the "
        "squared gain.",
        "4. Key rank: pr_sv of the keys at the site of question 1, trained against an untrained model of the same "
        "architecture (seeded initialization) on the same batches, paired by batch; beside it pr_var and erank, "
        "described (means over batches and KV heads)."]
    if any(m.kv is not None for m in models):
        lines.append(
            "5. What a key cache holds, described (docs/probing.md defines every measure), float32, each number a "
            "mean over batches, by layer group (early / middle / final) and over KV heads: the key rank holding 90% "
            "and 99% of the energy (rank90, rank99) before and after RoPE; the share of the keys' and the queries' "
            "energy in rotary pairs slower than the context; the loss with every key quantized per token before RoPE, "
            "its change a mean over batches with a 95% interval (batches as the unit), and the usable key bits, the "
            "fewest whose mean loss lies within the loss margin of the unquantized; the relative logit error with "
            "4-bit keys (on the first batch's windows, mean over layers and query heads) and with the keys projected "
            "on their top r directions (queries whole)."
            + (" A model without RoPE (GPT-2) has its keys quantized and projected as they are, and nothing after "
               "RoPE or of rotary use to show." if any(m.kv is not None and not m.kv["rope"] for m in models) else ""))
    return lines + [""]


def _model_notes(name: str, model: A.ModelKeys, texts: set) -> list[str]:
    """A model section's head: its name, its GGUF file where converted, its text where the models' texts differ."""
    rec = model.record
    lines = [f"## {name}", ""]
    if len(texts) > 1:
        lines += [f"Text: {_text_of(rec, model.n_batches)}.", ""]
    if rec.get("gguf"):
        g = rec["gguf"]
        lines += [f"Weights dequantized from {g['gguf_file']} (sha256 {g['gguf_sha256'][:12]}; "
                  + ", ".join(f"{k} {v / sum(g['tensor_types'].values()):.0%}" for k, v in g["tensor_types"].items())
                  + f" of the parameters); the conversion scored {g['check_loss']:.3f} nats/token on its check "
                  "text.", ""]
    return lines


def _figure(name: str, what: str, shown: Shown, panels: tuple | None = None) -> list[str]:
    """The figure `name` placed once in a report, where it is first shown (else nothing): its panels show every
    model, or those of `panels`, named where there are several."""
    if name in shown.placed:
        return []
    shown.placed.add(name)
    panels = shown.models if panels is None else panels
    return [figure_line(name, what + (f" (one panel per model: {', '.join(panels)})" if len(panels) > 1 else "")), ""]


def _norm_section(model: A.ModelKeys, margin: float, shown: Shown) -> list[str]:
    nm = model.norm
    lines = ["### 1. Key norms against sqrt(d_head), by depth", "",
             f"Site {nm['site']}; sqrt(d_head) = {nm['sqrt_d_head']:.2f}.", ""]
    for g, d in nm["vs_sqrt_d"].items():
        lines.append(f"- {g}: mean key norm {nm['group_mean'][g]:.2f}, "
                     + _against(d, "sqrt(d_head)", "longer than", "shorter than", margin) + ".")
    same = ", ".join(f"{b} and {a}" for a, b in nm.get("same_layers", ()))
    if nm["depth"]:
        lines += ["", f"Depth (paired by batch{f'; {same} are the same layers, not compared' if same else ''}):", ""]
        lines += decision_table(nm["depth"], 2, unit="batch", what=shown.named("key norm by depth"))
    else:
        lines += ["", f"Depth: not compared ({same} are the same layers)."]
    return lines + [""] + _figure("key_norms.png", "key norm per layer and KV head against sqrt(d_head)", shown)


def _sink_section(model: A.ModelKeys, margin: float, shown: Shown) -> list[str]:
    rec, s = model.record, model.sinks
    tax = s["taxonomy"]
    lines = ["### 2. Sinks and gatherers", "",
             f"Sink rate {s['sink_rate']:.3f}, {s['sink_rate_with_q0']:.3f} with position 0. Taxonomy: a sink's "
             f"entropy < {tax.sink_entropy:.3f}, a gatherer's > {tax.gatherer_entropy:.3f} (median "
             f"{tax.median_entropy:.3f}). KV heads: " + ", ".join(f"{c} {k}" for c, k in s["counts"].items())
             + "; query heads: " + ", ".join(f"{c} {k}" for c, k in s["counts_query_heads"].items()) + ".", ""]
    lines += _figure("sinks.png", "each head's first-token attention against its entropy, by class", shown)
    if "top_sink" in s:
        d = s["top_sink"]["top-sink KV head - the others"]
        lines += ["Top-sink KV head against its layer's others: "
                  + _against(d, "the others' keys", "longer than", "shorter than", margin).replace(
                      "equal to the others' keys", "as long as the others' keys") + ".", ""]
    if "within_layer" in s:
        d = s["within_layer"]["sink - gatherer key norm"]
        k = len(s["layers"])
        lines += [f"Sinks' keys against gatherers', layers {s['layers']}: "
                  + _against(d, "gatherers' keys", "longer than", "shorter than", margin).replace(
                      "equal to gatherers' keys", "as long as gatherers' keys") + "."
                  + (f" This rests on {k} of {rec['n_layers']} layers; it describes "
                     f"{'that layer' if k == 1 else 'those layers'}, not the model's layers in general."
                     if k < 3 else ""), ""]
    else:
        lines += [f"Sinks' keys against gatherers' within a layer: not testable; {s['why_not']}.", ""]
    return lines


def _gain_section(model: A.ModelKeys, margin: float, shown: Shown) -> list[str]:
    gc = model.gain
    lines = ["### 3. Spread of the k_norm gain", ""]
    if gc is None:  # its figure says so too, placed here where no model of the study has a gain to draw
        return lines + ["The model has no k_norm: nothing to measure.", "",
                        *([] if shown.gains else _figure("gains.png", "no k_norm gain to draw", shown))]
    cvs = [x["cv"] for x in gc["layers"]]
    n_gold = sum(bool(x["golden"]) for x in gc["layers"])
    lines += [f"CV {min(cvs):.2f} to {max(cvs):.2f} over layers; golden dimensions in {n_gold} of {len(cvs)} "
              "layers.", "", f"| {cell_text(shown.named('layer'))} | mean | mean abs | CV | min | max | negative | "
              "golden dimensions (share of squared gain) |", "|---|---|---|---|---|---|---|---|"]
    for i, x in enumerate(gc["layers"]):
        gold = ", ".join(map(str, x["golden"][:12])) + (" ..." if len(x["golden"]) > 12 else "")
        lines.append(f"| {i} | {x['mean']:.3f} | {x['mean_abs']:.3f} | {x['cv']:.3f} | {x['min']:.3f} | "
                     f"{x['max']:.3f} | {x['negative']} | {gold or '-'}"
                     + (f" ({x['golden_energy']:.0%})" if x["golden"] else "") + " |")
    return lines + ["", *_figure("gains.png", "the k_norm gain per layer and dimension, and its spread", shown,
                                 shown.gains)]


def _rank_section(model: A.ModelKeys, margin: float, shown: Shown) -> list[str]:
    rec, r = model.record, model.rank
    lines = ["### 4. Key rank", ""]
    if r is None:
        return lines + ["No untrained reference was measured.", ""]
    lines += [f"pr_sv at {r['site']} (of d_head = {r['d_head']}):", ""]
    for g, d in r["groups"].items():
        lines.append(f"- {g}: trained {d.mean_a:.1f}, untrained {d.mean_b:.1f}: "
                     + _against(d, "the untrained keys", "more dimensions than", "fewer dimensions than",
                                margin).replace("equal to the untrained keys", "as many as the untrained keys") + ".")
    lines += [""] + decision_table(r["groups"], 2, unit="batch",
                                   what=shown.named("pr_sv, trained against untrained")) + [""]
    lines += _figure("key_rank.png", "pr_sv per layer, trained and untrained", shown)
    groups = A.layer_groups(rec["n_layers"])
    lines += ["; ".join(f"{m}, trained / untrained: " + ", ".join(
        f"{g} {np.mean([r[m]['layer_trained'][i] for i in ix]):.1f} / "
        f"{np.mean([r[m]['layer_init'][i] for i in ix]):.1f}" for g, ix in groups.items())
        for m in ("pr_var", "erank")) + ".", ""]
    return lines


def _by_group(d: dict, digits: int = 1) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in d.values())


NO_ROPE = "No RoPE: the measures after RoPE and of rotary use do not apply"  # a model without it (GPT-2)


def _kv_section(model: A.ModelKeys, shown: Shown | None = None) -> list[str]:
    """What a key cache holds: descriptive, each number a mean over batches (and layers and heads where said)."""
    kv = model.kv
    if kv is None:
        return []
    shown = shown or Shown(())
    rope = kv["rope"]
    lines = ["### 5. What a key cache holds (descriptive)", "",
             f"On {kv['sequences']} windows of {kv['seq_len']} tokens" + ("." if rope else f". {NO_ROPE}."), ""]
    ranks = kv["ranks"]
    for site, where in ((kv["site"], " before RoPE" if rope else ""), ("k_rope", " after RoPE")):
        parts = []
        for metric in ("rank90", "rank99"):
            if (site, metric, "keys") in ranks:
                init = ranks.get((site, metric, "init_keys"))
                parts.append(f"{metric} {_by_group(ranks[(site, metric, 'keys')])}"
                             + (f" (untrained: {_by_group(init)})" if init else ""))
        if parts:
            lines.append(f"- Key rank{where} ({site}, of d_head = {kv['d_head']}): " + "; ".join(parts) + ".")
    if kv["low_freq_share"]:
        lines.append("- Energy in rotary pairs slower than the context: " + "; ".join(
            f"{name} {_by_group(d, 3)}" for name, d in kv["low_freq_share"].items()) + ".")
    lines += _kv_loss_lines(kv["loss"], shown, rope)
    if kv["layer_bits"] is not None:
        lines += ["Usable key bits of each layer's keys quantized alone (the first batch; layer 0 first; - where 8 "
                  "bits are outside the margin): " + ", ".join("-" if b is None else str(b) for b in kv["layer_bits"])
                  + ".", ""]
    return lines + _kv_error_lines(kv, shown, rope)


def _kv_loss_lines(loss: dict, shown: Shown, rope: bool = True) -> list[str]:
    lines = ["", f"Loss with every key quantized{' before RoPE' if rope else ''} (unquantized {loss['base']:.4f} "
                 "nats/token):", "",
             f"| {cell_text(shown.named('bits'))} | loss change (nats) | share of the loss |", "|---|---|---|"]
    for b, (m, h) in loss["change"].items():
        lines.append(f"| {b} | {m:+.4f} [{m - h:+.4f}, {m + h:+.4f}] | {loss['share'][b][0]:+.2%} |")
    usable = loss["usable_k_bits"]
    return lines + ["", f"Usable key bits (within \u00b1{loss['margin']:.1%} of the unquantized): "
                        f"{usable if usable is not None else 'none of those measured'}.", ""]


def _kv_error_lines(kv: dict, shown: Shown, rope: bool = True) -> list[str]:
    errs, proj = kv["logit_error_4bit"], kv["projected"]
    if not errs:
        return ["The layers' attention errors were not measured.", ""]
    sites = (("pre_rope", "before RoPE"), ("post_rope", "after RoPE")) if rope else \
        (("pre_rope", "logit error"),)
    lines = [f"Relative logit error with 4-bit keys ({kv['error_sequences']} windows):", "",
             f"| {cell_text(shown.named('scheme'))} | " + " | ".join(w for _, w in sites) + " |",
             "|---" * (len(sites) + 1) + "|"]
    for scheme in kv["schemes"]:
        lines.append(f"| {scheme} | " + " | ".join(f"{errs.get((s, scheme), float('nan')):.4f}" for s, _ in sites)
                     + " |")
    per_r = [f"r = {r}: " + (f"{proj[('pre_rope', r)]:.3f} before RoPE, {proj[('post_rope', r)]:.3f} after" if rope
                             else f"{proj[('pre_rope', r)]:.3f}") for r in kv["ranks_measured"]]
    return lines + ["", "With the keys projected: " + "; ".join(per_r) + ".", ""]


def _model_lines(name: str, model: A.ModelKeys, margin: float, shown: Shown, texts: set) -> list[str]:
    """One model's part of report.md, under its label `name` (labels): its numbers alone (what they are is said
    once, in _how_read)."""
    shown = dataclasses.replace(shown, model=name)
    return (_model_notes(name, model, texts) + _norm_section(model, margin, shown)
            + _sink_section(model, margin, shown) + _gain_section(model, margin, shown)
            + _rank_section(model, margin, shown) + _kv_section(model, shown))


def report(analysis: A.PretrainedAnalysis) -> str:
    res, margin = analysis.file, analysis.margin
    prov = res.get("provenance") or {}
    lines = ["# Keys of pretrained models", "",
             "One model is one sample: every interval below is over TEXT BATCHES (the same model on different "
             "text), and says how well the model's property is measured, not how another training run of the "
             "same recipe would come out. Comparisons are paired by batch and decided as in docs/decisions.md "
             f"(one Bonferroni interval per comparison over a claim's comparisons, read against a margin of "
             f"\u00b1{margin:.0%} of the compared values' mean). {ratio_text('key norms, key PR', 'batch')}.", "",
             f"Command: `{res.get('command', '?')}`; {fmt_code(prov)}, "
             f"{prov.get('cpu', '?')}, torch {prov.get('torch', '?')}, transformers {prov.get('transformers', '?')}, "
             f"float32; {fmt_num(res.get('wall_s'), 0)} s.", ""]
    texts = {_text_of(m.record, m.n_batches) for m in analysis.models.values()}
    lines += _how_read(analysis, texts)
    label = labels(analysis.models)
    shown = Shown(tuple(label.values()), tuple(label[n] for n, m in analysis.models.items() if m.gain is not None))
    for name, model in analysis.models.items():
        lines += _model_lines(label[name], model, margin, shown, texts)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- In short

def _family(decisions: dict, n: int) -> str:
    """'one family of 3, 98.3% each, over 3 text batches' ('' where none has an interval)."""
    tested = [d for d in decisions.values() if d.tested]
    if not tested:
        return f"none tested, {n} text batch(es)"
    family = "its own family" if len(tested) == 1 else f"one family of {len(tested)}"
    return f"{family}, {tested[0].ci_level:.1%}{' each' if len(tested) > 1 else ''}, over {n} text batches"


def _answers(model: A.ModelKeys, first: bool = True) -> list[str]:
    """The four answers of one model, each in one line without its leading '- '; the sink rate defined in the `first`
    model's alone."""
    n, nm = model.n_batches, model.norm
    vs = "; ".join(decided_part(f"{g} {nm['group_mean'][g]:.2f}", d, "batch") for g, d in nm["vs_sqrt_d"].items())
    depth = "; ".join(decided_part(k.replace(" - ", " \u2212 "), d, "batch") for k, d in nm["depth"].items())
    depth = f"{depth} ({_family(nm['depth'], n)})" if depth else "not compared (the groups are the same layers)"
    out = [f"Key norm against sqrt(d_head) = {nm['sqrt_d_head']:.2f} at {nm['site']}: {vs} "
           f"({_family(nm['vs_sqrt_d'], n)}); by depth: {depth}"]
    s = model.sinks
    sinks = (f"Sinks: sink rate {s['sink_rate']:.3f}"
             + (f" (query heads with mean first-token attention > {SINK_MASS})" if first else "") + "; KV heads "
             + ", ".join(f"{c} {k}" for c, k in s["counts"].items()))
    if "top_sink" in s:
        sinks += "; " + decided_part("the top-sink KV head's keys against its layer's others'",
                                     s["top_sink"]["top-sink KV head - the others"], "batch") + \
            f" ({_family(s['top_sink'], n)})"
    if "within_layer" in s:
        sinks += "; " + decided_part("sinks' keys against gatherers'", s["within_layer"]["sink - gatherer key norm"],
                                     "batch") + f" ({_family(s['within_layer'], n)})"
    else:
        sinks += "; sinks against gatherers within a layer: not testable (section 2 says why)"
    out.append(sinks)
    gc = model.gain
    if gc is None:
        out.append("k_norm gain: the model has none")
    else:
        cvs = [x["cv"] for x in gc["layers"]]
        gold = sum(bool(x["golden"]) for x in gc["layers"])
        out.append(f"k_norm gain: CV {min(cvs):.2f} to {max(cvs):.2f} over layers; golden dimensions in {gold} of "
                   f"{len(cvs)} layers (weights, exact: described, not tested)")
    r = model.rank
    if r is None:
        out.append("Key rank: no untrained reference was measured")
    else:
        ranks = "; ".join(decided_part(f"{g} {d.mean_a:.1f} against {d.mean_b:.1f}", d, "batch")
                          for g, d in r["groups"].items())
        out.append(f"Key rank (pr_sv at {r['site']}), trained against untrained: {ranks} "
                   f"({_family(r['groups'], n)})")
    return out


def in_short(analysis: A.PretrainedAnalysis) -> list[str]:
    """The report's "In short" (research.plots.in_short, placed first by research.studies.render): each model's four
    answers, one line each (named by model where there are several); past in_short.MOST lines, one line per answer
    with every model in it. Each comparison with its outcome, its ratio (or share) and interval over text batches, and
    the family it was decided in; an open one marked wording.OPEN (its route: Kind.settle, a replication on new
    batches)."""
    label = labels(analysis.models)
    answers = {label[name]: _answers(model, i == 0) for i, (name, model) in enumerate(analysis.models.items())}
    if len(answers) == 1:
        return [f"- {line}." for line in next(iter(answers.values()))]
    if 4 * len(answers) <= MOST:
        return [f"- {name}: {line[0].lower()}{line[1:]}." for name, lines in answers.items() for line in lines]
    return [f"- {i + 1}. " + " | ".join(f"{name}: {lines[i]}" for name, lines in answers.items()) + "."
            for i in range(4)]
