"""Key metrics over the saved checkpoints of several seeds of one recipe (research/checkpoint_keys_study.py with
--seeds, or several hub ids with --revisions). No torch.

Input: checkpoint_keys.json whose checkpoints carry a `seed` (research.results.trajectory.across_seeds). SEEDS
are the unit of uncertainty: within a seed a metric at a revision is its mean over the text batches, and the change
from the first revision to the last is one number per seed, decided by research.analysis.rules as the training
studies decide conditions. Sinks (first-token attention above the file's sink_threshold) are followed per head
within a seed and per layer and model across seeds, described, never tested.
The study across seeds: docs/inspection.md, "Across seeds: public checkpoint suites"; the pairing:
docs/decisions.md, "Several seeds of a public suite: paired by seed".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from research.analysis.keys import layer_groups
from research.analysis.pretrained import attn_per_batch, site_of
from research.analysis.rules import DIFFERENCE, LOSS_MARGIN, MARGIN, Paired, decide
from research.analysis.wording import Reading, both_text, reading_with
from research.analysis.trajectory import GAIN_CV, LOSS, Change, gain_cv, metrics_of, per_batch_group, verdict

SINK_FIELD = "sink_mass_excl_q0"


@dataclass(frozen=True)
class SeedTrajectory:
    seeds: list[int]              # the seeds with a measured checkpoint
    steps: list[int]              # the revisions measured in any seed, ascending
    tokens: dict                  # step -> the tokens a checkpoint of that step records (None: none does)
    labels: dict                  # seed -> step -> label of its measured checkpoint
    paired: list[int]             # seeds measured at both the first and the last revision
    missing: dict                 # seed -> the study's steps it has no measurement of
    duplicates: list[dict]        # {label, seed, step, duplicate_of, duplicate_step, source}
    site: str
    groups: dict
    metrics: list                 # research.analysis.trajectory.Metric
    values: dict                  # metric key -> group -> seed -> [S] per-seed value at each step (NaN: not measured)
    changes: list[Change]         # first -> last, decided across seeds: the key and attention family, then the loss
    sink_threshold: float
    sink_mass: dict               # seed -> [S, L, Hq] first-token attention per head (NaN: not measured)
    onsets: dict                  # seed -> [L, Hq] index into steps of the head's onset, -1: never a sink
    n_batches: int
    margin: float
    loss_margin: float
    file: dict

    @property
    def first(self) -> int:
        return self.steps[0]

    @property
    def last(self) -> int:
        return self.steps[-1]

    def layer_share(self, seed: int) -> np.ndarray:
        """[S, L]: the share of the layer's query heads that are sinks at each step (NaN: not measured)."""
        m = self.sink_mass[seed]
        return np.where(np.isnan(m).all(2), np.nan, (m > self.sink_threshold).mean(2))

    def model_onset(self, seed: int) -> int | None:
        """The step of the seed's first sink head, None where it has none at any revision."""
        o = self.onsets[seed]
        return self.steps[int(o[o >= 0].min())] if (o >= 0).any() else None


def measured_by_seed(res: dict) -> dict:
    """{seed: {step: measured record}}, seeds ascending."""
    out: dict = {}
    for c in res["checkpoints"]:
        if c.get("duplicate_of") is None:
            out.setdefault(c["seed"], {})[c["step"]] = c
    return dict(sorted(out.items()))


def _missing(res: dict) -> tuple[list[int], dict]:
    """(the measured steps ascending, {seed: the steps among them it lacks})."""
    runs = measured_by_seed(res)
    seeds = sorted({c["seed"] for c in res["checkpoints"]})
    steps = sorted({s for r in runs.values() for s in r})
    return steps, {seed: [s for s in steps if s not in runs.get(seed, {})] for seed in seeds}


def missing_lines(res: dict) -> list[str]:
    """One line per seed left out of the first -> last pairs, naming the revision it lacks and why."""
    steps, missing = _missing(res)
    dup = {(c["seed"], c["step"]): c for c in res["checkpoints"] if c.get("duplicate_of") is not None}
    out = []
    for seed, lacks in missing.items():
        ends = [s for s in lacks if s in (steps[0], steps[-1])]
        if not ends:
            continue
        why = [f"step {s} (its checkpoint {d['label']} has the weights of {d['duplicate_of']})"
               if (d := dup.get((seed, s))) else f"step {s} (no checkpoint)" for s in ends]
        out.append(f"seed {seed} lacks {' and '.join(why)}: left out of the first -> last pairs")
    return out


def _value(rec: dict, m, layers: list[int]) -> float:
    """A seed's value at one checkpoint: the gain CV (exact), else the mean over text batches."""
    return gain_cv(rec, layers) if m.kind == "gain" else float(per_batch_group(rec, m, layers).mean())


def _series(runs: dict, steps: list[int], get) -> dict:
    """{seed: [S] get(record) at each step, NaN where the seed has no measurement}."""
    return {seed: np.array([get(r[s]) if s in r else math.nan for s in steps], float) for seed, r in runs.items()}


def _sinks(runs: dict, steps: list[int], threshold: float) -> tuple[dict, dict]:
    mass, onsets = {}, {}
    for seed, r in runs.items():
        shape = attn_per_batch(next(iter(r.values())), SINK_FIELD).shape[1:]
        m = np.stack([attn_per_batch(r[s], SINK_FIELD).mean(0) if s in r else np.full(shape, np.nan) for s in steps])
        above = m > threshold                                                    # NaN compares False
        mass[seed] = m
        onsets[seed] = np.where(above.any(0), above.argmax(0), -1)
    return mass, onsets


# A public suite's seeds are all the seeds there are: nothing can be planned or continued, only replicated
SUITE = Reading(settle=f"a replication on other seeds (another suite, or runs of one's own) decided on its own; "
                       f"{both_text()}")


def _changes(values: dict, titles: dict, first: int, last: int, margin: float, loss_margin: float,
             on: dict | None = None) -> list[Change]:
    """The first-to-last decisions and their verdicts, worded as SUITE says."""
    with reading_with(SUITE):
        return _decided_changes(values, titles, first, last, margin, loss_margin, on)


def _decided_changes(values: dict, titles: dict, first: int, last: int, margin: float,
                     loss_margin: float, on: dict | None = None) -> list[Change]:
    """Per-seed change first -> last of every metric and group, decided across seeds (rules.decide): by log ratios
    where `on` (metric key -> rules.compared_on) says RATIO, else by differences."""
    on = on or {}
    def pair(by_seed: dict, on: str = DIFFERENCE, what: str = "") -> Paired:
        return Paired.of({s: v[-1] for s, v in by_seed.items()}, {s: v[0] for s, v in by_seed.items()}, on,
                         (f"{what} at step {last}", f"at step {first}"))
    a, b = f"step {first}", f"step {last}"
    fam = decide({(k, g): pair(v, on.get(k, DIFFERENCE), f"{k} of the {g} layers")
                  for k, groups in values.items() if k != LOSS for g, v in groups.items()}, margin)
    out = [Change(k, g, d, verdict(titles[k], g, a, b, d, margin, unit="seed")) for (k, g), d in fam.items()]
    d = decide({LOSS: pair(values[LOSS]["model"])}, loss_margin)[LOSS]
    return out + [Change(LOSS, "model", d, verdict("loss (nats/token)", "whole model", a, b, d, loss_margin,
                                                   unit="seed"))]


def analyze(res: dict, margin: float | None = None, loss_margin: float = LOSS_MARGIN) -> SeedTrajectory:
    margin = res.get("margin", MARGIN) if margin is None else margin
    runs = measured_by_seed(res)
    steps, missing = _missing(res)
    measured = [c for r in runs.values() for c in r.values()]
    step_of = {c["label"]: c["step"] for c in res["checkpoints"]}
    dups = [{"label": c["label"], "seed": c["seed"], "step": c["step"], "duplicate_of": c["duplicate_of"],
             "duplicate_step": step_of[c["duplicate_of"]], "source": c["source"]}
            for c in res["checkpoints"] if c.get("duplicate_of") is not None]
    groups = layer_groups(res["model"]["n_layers"])
    metrics = metrics_of(site_of(measured[0]), all((c.get("gains") or {}).get("k_norm") for c in measured))
    values = {m.key: {g: _series(runs, steps, lambda c, m=m, ix=ix: _value(c, m, ix)) for g, ix in groups.items()}
              for m in metrics}
    values[LOSS] = {"model": _series(runs, steps, lambda c: float(np.mean([b["loss"] for b in c["batches"]])))}
    threshold = res["sink_threshold"]
    mass, onsets = _sinks(runs, steps, threshold)
    tokens = {s: next((c.get("tokens") for c in measured if c["step"] == s and c.get("tokens") is not None), None)
              for s in steps}
    changes = (_changes(values, {m.key: m.title for m in metrics}, steps[0], steps[-1], margin, loss_margin,
                        {m.key: m.on for m in metrics}) if len(steps) >= 2 else [])
    paired = [s for s in runs if steps[0] in runs[s] and steps[-1] in runs[s]]
    return SeedTrajectory(list(runs), steps, tokens, {s: {st: c["label"] for st, c in r.items()}
                                                         for s, r in runs.items()},
                          paired, missing, dups, site_of(measured[0]), groups, metrics, values, changes, threshold,
                          mass, onsets, len(measured[0]["batches"]), margin, loss_margin, res)


def has_gain(t: SeedTrajectory) -> bool:
    return GAIN_CV in t.values
