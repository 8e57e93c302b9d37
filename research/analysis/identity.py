"""Identity before statistics: which runs of a study are compared, and at what budget (docs/decisions.md).

Every study kind of trained runs goes through `compare(runs)` before it is decided (research.studies.kinds):
runs are paired by seed, never by position; a run that diverged is set aside unless its kind takes divergence as
a result; runs of another recipe (preset, corpus, tokenizer, precision, host kind: utils.hosts) are set aside,
the value most runs share kept; every run is cut at the last token count all of them reached and probed. What is
set aside, cut or refused (ResultsError) is named in the report's "What was compared".
The rules in full, with worked examples: docs/decisions.md, "Which runs are compared: identity before statistics".
"""
from __future__ import annotations

import contextlib
import contextvars
from collections import Counter
from dataclasses import dataclass
from typing import Iterator

from research.analysis.series import left_out, shared_tokens
from research.results.read import pair_key
from research.results.schema import ResultsError, cut_at_tokens
from utils.hosts import host_kind, same_paths
from utils.threads import cpu_threads

HOST = "host kind"
# (what it is, how a run records it): the attributes every compared run must share
RECIPE = (
    ("preset", lambda r: r.get("preset") or (r.get("config") or {}).get("preset")),
    ("corpus", lambda r: _hash((r.get("data") or {}), "corpus", "source_hash")),
    ("tokenizer", lambda r: _hash((r.get("data") or {}), "tokenizer", "tokenizer_hash")),
    ("training precision", lambda r: (r.get("provenance") or {}).get("train_precision")),
    (HOST, lambda r: host_kind(r.get("provenance"))),
)
FIX = ("train the runs of a study with one preset, corpus, tokenizer and precision, on one host kind and to one "
       "token budget (the study scripts do), or move the odd runs out of the folder")
# why a host kind of its own is set aside, and how a study compares several
HOST_WHY = ("bf16 numerics differ between host kinds; the study's command run again with --mix_hosts combines them: "
            "it records that in study.json and trains nothing it has")
HOST_FIX = f"train the runs of a study on one host kind, or move one group's runs out of the folder; or, as {HOST_WHY}"
_MIX_HOSTS: contextvars.ContextVar[bool] = contextvars.ContextVar("mix_hosts", default=False)


@contextlib.contextmanager
def hosts_mixed(allowed: bool) -> Iterator[None]:
    """Within the block `compare` combines runs of several host kinds (a study made with --mix_hosts: study.json's
    `mix_hosts`), and says so, where it would set the other kinds aside."""
    token = _MIX_HOSTS.set(bool(allowed))
    try:
        yield
    finally:
        _MIX_HOSTS.reset(token)


def _hash(data: dict, name: str, field: str) -> str | None:
    """'english-v1 (d05e51db6254)' for a recorded hash, None when the run does not record one."""
    h = data.get(field)
    return f"{data.get(name) or name} ({str(h)[:12]})" if h else None


def _tokens(t: float) -> str:
    return f"{t:,.0f} tokens"


def _seeds(runs: list[dict]) -> str:
    keys = [pair_key(r) for r in runs]
    known = [k for k in keys if k is not None]
    text = ("seed" + ("s " if len(known) > 1 else " ") + ", ".join(map(str, known))) if known else ""
    missing = len(keys) - len(known)
    return ", ".join(x for x in (text, f"{missing} run{'s' * (missing > 1)} without a seed" if missing else "") if x)


@dataclass(frozen=True)
class Comparison:
    """The runs a study decides, and in words what was compared and what was set aside."""

    runs: dict  # condition -> [results dict per seed]: the runs kept, each cut at the budget
    budget: float | None  # training tokens every final value is taken at (None: no run recorded a probe)
    compared: str  # one sentence: which runs, paired how, at what budget, of what recipe
    set_aside: tuple[str, ...] = ()  # one sentence per thing left out or unpaired, with the reason

    def section(self) -> str:
        """The report's 'What was compared' section (markdown)."""
        lines = ["## What was compared", "", self.compared]
        if self.set_aside:
            lines += ["", "Set aside or unpaired:", "", *(f"- {s}" for s in self.set_aside)]
        return "\n".join(lines) + "\n"


def _named(cond: str, runs: list[dict]) -> str:
    return f"{cond} ({_seeds(runs)})"


def _ends(runs: list[dict]) -> str:
    """The token counts the runs' last probes were taken at."""
    return " or ".join(_tokens(t) for t in sorted({r["tokens"][-1] for r in runs if r["tokens"]}))


def _one_run_per_seed(runs: dict) -> None:
    """Refuse a condition with two runs of one seed (research.results.layout refuses it, naming both files, when it
    reads a folder; this catches runs that reach `compare` any other way)."""
    for cond, rl in runs.items():
        keys = [k for r in rl if (k := pair_key(r)) is not None]
        twice = [k for k in dict.fromkeys(keys) if keys.count(k) > 1]
        if twice:
            raise ResultsError(f"{cond} holds {keys.count(twice[0])} runs of seed {twice[0]}: paired by seed, one "
                               f"would stand for the other unsaid; fix: remove all but one of them (and their "
                               f"study.json entries), or give each its own seed")


def _last_probe(r: dict) -> str:
    return f"its last probe at {_tokens(r['tokens'][-1])}" if r["tokens"] else "before its first probe"


def _trained_to_the_end(runs: dict, notes: list[str]) -> dict:
    """The runs that did not diverge; each that did named in `notes`."""
    for cond, rl in runs.items():
        left = any(r.get("diverged") is None for r in rl)
        for r in (r for r in rl if r.get("diverged") is not None):
            step = r["diverged"].get("step")
            notes.append(f"{_named(cond, [r])} diverged{f' at step {step:,}' if step is not None else ''} (its loss "
                         f"became non-finite), {_last_probe(r)}: set aside, since it never reached the budget the "
                         f"other runs are compared at; " + (f"{cond} is compared on its other seeds, and no "
                                                             f"comparison counts that it diverged" if left else
                                                             f"no run of {cond} is left to compare"))
    return {c: kept for c, rl in runs.items() if (kept := [r for r in rl if r.get("diverged") is None])}


def _lost_at_the_end(r: dict) -> list[str]:
    """The values of a run that its earlier probes had but its last has not: NaN or infinity, written as null."""
    def lost(values: list) -> bool:
        return len(values) > 1 and values[-1] is None and any(v is not None for v in values[:-1])
    names = [f for f in ("loss", "val_loss", "mean_pr") if lost(r.get(f) or [])]
    probes = r.get("probes") or []
    layers = {(layer["layer"], name) for p in probes for layer in p["layers"] for name in (layer.get("means") or {})}
    series = {key: [(layer.get("means") or {}).get(key[1]) for p in probes for layer in p["layers"]
                    if layer["layer"] == key[0]] for key in layers}
    return names + sorted({name for (_, name), values in series.items() if lost(values)})


def _host_kinds(runs: dict) -> dict:
    """The runs, an older run's host kind recorded with the bf16 path that newer runs of its CPU model record
    (utils.hosts.same_paths), so that runs of one host are one kind; the files are not touched."""
    flat = [r for rl in runs.values() for r in rl]
    kinds = iter(same_paths([host_kind(r.get("provenance")) for r in flat]))
    def one(r: dict, kind: str | None) -> dict:
        if kind == host_kind(r.get("provenance")):
            return r
        return {**r, "provenance": {**(r.get("provenance") or {}), "host_kind": kind}}
    return {c: [one(r, next(kinds)) for r in rl] for c, rl in runs.items()}


def _mixed_hosts(runs: dict) -> str:
    """'; trained on 2 host kinds (A: QK (seeds 0, 1), ...; B: ...), combined: the study was made with --mix_hosts'
    where the runs kept are of several kinds; '' otherwise."""
    get = dict(RECIPE)[HOST]
    kinds = sorted({k for rl in runs.values() for r in rl if (k := get(r)) is not None})
    if len(kinds) < 2:
        return ""
    groups = "; ".join(f"{k}: " + ", ".join(_named(c, [r for r in rl if get(r) == k]) for c, rl in runs.items()
                                            if any(get(r) == k for r in rl)) for k in kinds)
    return f"; trained on {len(kinds)} host kinds ({groups}), combined: the study was made with --mix_hosts"


def _mixed_threads(runs: dict) -> str:
    """'; trained on CPU threads 1 (QK (seed 0)) and 2 (QK (seed 1), NoQK (seed 0, 1)), compared together: ...'
    where the runs kept trained on CPU with several thread counts; '' otherwise."""
    def get(r: dict) -> int | None:
        return cpu_threads(r.get("provenance") or {})
    counts = sorted({n for rl in runs.values() for r in rl if (n := get(r)) is not None})
    if len(counts) < 2:
        return ""
    groups = " and ".join(f"{n} (" + ", ".join(_named(c, [r for r in rl if get(r) == n]) for c, rl in runs.items()
                                               if any(get(r) == n for r in rl)) + ")" for n in counts)
    return (f"; trained on CPU threads {groups}, compared together: bf16 values move with the thread count in the "
            f"last bits (about 7e-5 relative)")


def _one_recipe(runs: dict, notes: list[str]) -> dict:
    """The runs that share each RECIPE attribute's most common value (the host kind's only where hosts are not
    mixed: hosts_mixed); the others named in `notes`."""
    for what, get in RECIPE:
        if what == HOST and _MIX_HOSTS.get():
            continue
        counts = Counter(v for rl in runs.values() for r in rl if (v := get(r)) is not None)
        if len(counts) < 2:
            continue
        (top, n), (second, m) = counts.most_common(2)
        if n == m:
            groups = "; ".join(f"{v}: " + ", ".join(_named(c, [r for r in rl if get(r) == v]) for c, rl in
                                                      runs.items() if any(get(r) == v for r in rl))
                               for v in counts)
            fix = HOST_FIX if what == HOST else FIX
            raise ResultsError(f"the runs of this study differ in {what}, as many runs one way as the other ({groups})"
                               f": they cannot be compared, and no rule says which are the study; fix: {fix}")
        odd = {c: [r for r in rl if get(r) not in (None, top)] for c, rl in runs.items()}
        odd = {c: rl for c, rl in odd.items() if rl}
        which = "; ".join(f"{_named(c, rl)}: {', '.join(sorted({str(get(r)) for r in rl}))}" for c, rl in odd.items())
        notes.append(f"{which} \u2014 a different {what} from the other runs ({top}): not compared"
                     + (f" ({HOST_WHY})" if what == HOST else ""))
        runs = {c: kept for c, rl in runs.items() if (kept := [r for r in rl if get(r) in (None, top)])}
    return runs


def _budget(runs: dict, notes: list[str]) -> tuple[dict, float | None]:
    """The runs cut at the last token count all of them probed, and that count."""
    timed = {id(r): r for rl in runs.values() for r in rl if r["tokens"] and not r.get("diverged")}
    grids = [{t for t in r["tokens"] if t is not None} for r in timed.values()]
    if not grids:
        return runs, None
    common = set.intersection(*grids)
    if not common or (max(common) == min(min(g) for g in grids) and any(len(g) > 1 for g in grids)):
        ends = "; ".join(f"{_named(c, rl)} last probed at {_ends(rl)}" for c, rl in runs.items())
        raise ResultsError(f"the runs of this study share no probe after their first ({ends}): there is no budget "
                           f"at which all of them can be compared; fix: {FIX}")
    budget = max(common)
    longer = {c: [r for r in rl if id(r) in timed and r["tokens"][-1] > budget] for c, rl in runs.items()}
    longer = {c: rl for c, rl in longer.items() if rl}
    if longer:
        went = "; ".join(f"{_named(c, rl)} trained to {_ends(rl)}" for c, rl in longer.items())
        notes.append(f"{went}: every final value is taken at {_tokens(budget)}, the last probe all runs reached; "
                     f"their later probes are not compared")
        runs = {c: [cut_at_tokens(r, budget) if id(r) in timed else r for r in rl] for c, rl in runs.items()}
    uneven = _uneven_grids(runs)
    notes += uneven
    if not longer and not uneven and len({frozenset(g) for g in grids}) > 1:
        notes.append("the runs were probed at different token counts: trajectories are compared only where they "
                     "share probes")
    return runs, budget


def _counts(ts: list[float], few: int = 4) -> str:
    """'100,000 and 300,000 tokens', or with more than `few`: '12 token counts (100,000, 200,000, 300,000, ...)'."""
    text = [f"{t:,.0f}" for t in ts]
    if len(text) > few:
        return f"{len(text)} token counts ({', '.join(text[:3])}, ...)"
    return (", ".join(text[:-1]) + " and " if len(text) > 1 else "") + text[-1] + " tokens"


def _uneven_grids(runs: dict, named: int = 4) -> list[str]:
    """One note per condition whose runs were probed at different token counts: its curve is the mean over
    seeds at the token counts all of them share (research.analysis.series), and these name the ones left out
    and which runs lack them (a diverged run ends where it diverged, and is not counted)."""
    notes = []
    for cond, rl in runs.items():
        rl = [r for r in rl if r["tokens"] and not r.get("diverged")]
        out = left_out(r["tokens"] for r in rl)
        if not out:
            continue
        lacking = []
        for r in rl:
            have = {float(x) for x in r["tokens"]}
            miss = [t for t in out if t not in have]
            if miss:
                who = f"seed {k}" if (k := pair_key(r)) is not None else "a run without a seed"
                lacking.append(f"{who} has " + ("none of them" if len(miss) == len(out) > 1 else
                                                "no probe there" if len(out) == 1 else f"no probe at {_counts(miss)}"))
        if len(lacking) > named:
            lacking = lacking[:named - 1] + [f"{len(lacking) - named + 1} more runs lack some of them"]
        notes.append(f"{cond}: the probes at {_counts(out)} are not in every run ({'; '.join(lacking)}): its curves "
                     f"average the seeds at the {len(shared_tokens(r['tokens'] for r in rl))} token counts all of "
                     f"them share")
    return notes


def compare(runs: dict, divergence_is_a_result: bool = False) -> Comparison:
    """The runs of a study (condition -> [results dict]) that may be compared, cut at one budget, with the report's
    account of it. ResultsError when no set of them can be compared (see the module docstring).
    `divergence_is_a_result`: a diverged run is kept, ending where it diverged (the learning-rate grid)."""
    _one_run_per_seed(runs)
    notes: list[str] = []
    unpaired = {c: n for c, rl in runs.items() if (n := sum(pair_key(r) is None for r in rl))}
    if unpaired:
        notes.append("runs without a seed (no `seed` in the file, not in a seed_<n> folder): "
                     + ", ".join(f"{c} {n}" for c, n in unpaired.items()) + ". They are shown, but paired with "
                     "nothing: a comparison that needs them reads 'no paired values'")
    kept = {c: list(rl) for c, rl in runs.items()}
    kept = kept if divergence_is_a_result else _trained_to_the_end(kept, notes)
    if runs and not kept:
        raise ResultsError("every run of this study diverged (results.json records `diverged`), so none can be "
                           "compared. Fix: train again with a recipe that does not diverge (a lower learning rate, "
                           "QK-norm, a clip)")
    kept = _one_recipe(_host_kinds(kept), notes)
    kept, budget = _budget(kept, notes)
    for cond, rl in kept.items():
        for r in rl:
            if r.get("diverged") is None and (lost := _lost_at_the_end(r)):
                notes.append(f"{_named(cond, [r])}: {_last_probe(r)} holds no finite {', '.join(lost)} (NaN or "
                             f"infinity, written as null), which its earlier probes had: it has no final value of "
                             f"{'them' if len(lost) > 1 else 'it'} to compare")
    recipe = [f"{what} {v}" for what, get in RECIPE
              if len(vs := {get(r) for rl in kept.values() for r in rl} - {None}) == 1 and (v := vs.pop())]
    paired = any(pair_key(r) is not None for rl in kept.values() for r in rl)
    compared = ("Runs: " + "; ".join(_named(c, rl) for c, rl in kept.items())
                + ("; paired by seed" if paired else "; none has a seed, so none is paired")
                + (f"; final values at {_tokens(budget)}" if budget is not None else "")
                + (f"; {', '.join(recipe)}" if recipe else "") + _mixed_hosts(kept) + _mixed_threads(kept) + ".")
    return Comparison(kept, budget, compared, tuple(notes))
