"""A study a researcher writes: a YAML or JSON file of conditions (EXAMPLE), read into a catalog Study of kind
'conditions'.

Every key is checked here, with the file, the condition and the field named; whether each condition's config can
be built (and fits this machine) is checked by the runner for every run before the first trains
(research.studies.runner). The config fields are train_llm.py's (`python train_llm.py --help`), written flat or in
their sections as in a --config file (configs/files.py).
"""
from __future__ import annotations

import collections
import dataclasses
import re
from pathlib import Path

from configs.config import SEED_LIMIT, ConfigError, DataConfig, ProbeConfig
from configs.files import field_values, parse_file, read_text
from configs.presets import PRESETS
from research.analysis.conditions import check_primary
from research.results.checks import check_absolute_margin, check_margin
from research.studies.catalog import Study
from utils.errors import shown
from utils.io import not_a_file
from utils.owners import reserved_names

EXAMPLE = """\
    name: softcap_vs_qknorm      # the study: its folder research_results/<name> (the default --out)
    seeds: [0, 1, 2, 3]          # every condition trains once per seed; the runs of one seed are paired
    baseline: QK                 # optional: every other condition is compared with it (without it: every pair)
    primary: [logit_max, val_loss]  # optional: the quantities read as one family, the report's findings
    margin: 0.03                 # optional: the equivalence margin of key metrics, a share of the mean
    loss_margin: 0.005           # optional: the same for losses
    logit_margin: 0.25           # optional: the largest attention logit's, in logits
    kv_loss_margin: 0.001        # optional: a loss change's with quantized keys (a share of the loss)
    preset: tiny                 # any other top-level key is a config field every run shares
    tokens: 300000
    conditions:                  # condition name -> the config fields it sets (over the shared ones)
      QK: {qk_norm: learned}
      NoQK: {qk_norm: none}
      NoQK_softcap: {qk_norm: none, attn_softcap: 30}
      QK_gated: {qk_norm: learned, attn_gate: headwise}
"""
KIND = "conditions"  # research.studies.kinds: each condition against the baseline, or every pair
STUDY_KEYS = ("name", "seeds", "conditions", "baseline", "primary", "margin", "loss_margin", "logit_margin",
              "kv_loss_margin", "preset")
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")  # a folder name on every system, never a file the study writes
NAME_RULE = "a letter, then letters, digits, '_' or '-' (at most 64)"
PER_STUDY = {"seed": "the study's seeds are its `seeds` list"}  # nowhere in the file
# The keys one condition may not set: every condition trains to one budget and is measured one way, or its values
# are not comparable (docs/study_files.md, "What a condition may set"). The data and probe sections whole, and the
# fields of the others that set the budget, the measurement or the runtime the study settles once. The rest (the
# model, the optimizer and its rates, the schedule, the variants, grad_accum) is what conditions are for.
SHARED_ONLY = {
    **dict.fromkeys((f.name for f in dataclasses.fields(DataConfig)),
                    "the text every condition is measured on (corpus, tokenizer, sequence length, validation split) "
                    "is the study's"),
    **dict.fromkeys((f.name for f in dataclasses.fields(ProbeConfig)), "the probe measures every condition one way"),
    "preset": "one preset for the whole study",
    "tokens": "it is the budget: a run trained longer would be compared at the shorter runs' budget, mid-schedule",
    "batch_size": ("it also sizes the validation set (eval_batches x batch_size sequences); a condition of another "
                   "batch per optimizer step sets grad_accum"),
    "eval_every": "the validation measurement is the study's",
    "eval_batches": "the validation measurement is the study's",
    "precision": "every value is computed in it, and the study settles one precision for all its runs",
    "device": "the study settles one device for all its runs",
    "vocab_size": "with tokenizer bpe it sets the tokenizer's vocabulary, so the tokens the loss is a mean over",
}


def _name(value, what: str, where: str, fix: str) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise ConfigError(f"{where}: {what} {shown(value)} is not a usable name: {NAME_RULE}, since it names a folder. "
                          f"Fix: {fix}")
    return value


def _not_an_owners_file(name: str, where: str) -> None:
    """A condition's folder sits in the study's: named as a file or folder that marks an owner's folder (a run's
    checkpoints/, utils.owners), it would make the study's folder that owner's, refused by its own drawing after
    every run trained. Compared in lower case, as the folders of two conditions are (one name on macOS, Windows)."""
    owner = reserved_names().get(name.lower())
    if owner is not None:
        taken = ", ".join(n for n in reserved_names() if NAME.match(n))
        raise ConfigError(f"{where}: condition {name!r} is named as a file or folder of {owner.tool}, which would "
                          f"make the study's folder read as that owner's. Fix: rename the condition (none of "
                          f"{taken})")


def _seeds(value, where: str) -> tuple[int, ...]:
    ok = isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool) and
                                                   0 <= s < SEED_LIMIT for s in value)
    if not ok:
        raise ConfigError(f"{where}: seeds: expected a non-empty list of whole numbers >= 0, found {shown(value)}. "
                          f"Fix: e.g. seeds: [0, 1, 2, 3]")
    twice = sorted(s for s, n in collections.Counter(value).items() if n > 1)  # linear: a study may list many
    if twice:
        raise ConfigError(f"{where}: seeds: {', '.join(map(str, twice))} given more than once. Fix: give each seed "
                          f"once")
    return tuple(value)


def _fields(body, where: str, others: tuple[str, ...] = ()) -> dict:
    """The config fields of a mapping (a condition, or the study's shared keys: `others` are the study's own keys),
    typed; the keys a run may not set named with the reason."""
    for key, why in PER_STUDY.items():
        if key in body:
            raise ConfigError(f"{where}: {key} cannot be set here: {why}")
    return field_values(body, where, skip=(), others=others)


def _conditions(value, where: str) -> dict[str, dict]:
    if not isinstance(value, dict) or not value:
        raise ConfigError(f"{where}: conditions: expected a mapping of at least one condition name to its config "
                          f"fields, found {shown(value)}. Fix: e.g. conditions: {{QK: {{qk_norm: learned}}, NoQK: "
                          f"{{qk_norm: none}}}}")
    out = {}
    for name, body in value.items():
        _name(name, "condition", f"{where}: conditions", "rename the condition")
        _not_an_owners_file(name, where)
        same = [c for c in out if c.lower() == name.lower()]
        if same:  # one folder on a case-insensitive filesystem (macOS, Windows)
            raise ConfigError(f"{where}: conditions {same[0]!r} and {name!r} differ only in case: their folders would "
                              f"be one on a case-insensitive filesystem. Fix: rename one of them")
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise ConfigError(f"{where}: condition {name}: expected a mapping of config fields (e.g. {{qk_norm: "
                              f"none}}; {{}} for the shared config alone), found {shown(body)}")
        fields = _fields({k: v for k, v in body.items() if k != "preset"}, f"{where}: condition {name}")
        refused = [k for k in (["preset"] if "preset" in body else []) + list(fields) if k in SHARED_ONLY]
        if refused:
            raise ConfigError(f"{where}: condition {name}: {refused[0]} cannot be set per condition: "
                              f"{SHARED_ONLY[refused[0]]}. Fix: set it at the top level, so every condition shares it")
        out[name] = fields
    return out


def read_study_file(path: str | Path) -> Study:
    """The Study a file describes; ConfigError names the file, the condition and the field, with the fix."""
    path = Path(path)
    kind = not_a_file(path)
    if kind:  # a named pipe would block the read until something writes to it, maybe forever
        raise ConfigError(f"{path}: {kind}, not a file: a study file is read whole before anything trains, and again "
                          f"when the same command continues the study. Fix: give the path of a YAML or JSON file")
    data = parse_file(path, read_text(path, f"{path}: no such study file. Fix: give the path of a YAML or JSON study "
                                            f"file (python research/study.py --help shows the format)"))
    where = str(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping with name, seeds and conditions (python research/study.py "
                          f"--help shows the format), found {type(data).__name__}")
    missing = [k for k in ("name", "seeds", "conditions") if k not in data]
    if missing:
        raise ConfigError(f"{where}: no {', '.join(missing)}: a study file names the study, its seeds and its "
                          f"conditions (python research/study.py --help shows the format)")
    name = _name(data["name"], "name", where, "name the study as its folder will be named")
    seeds = _seeds(data["seeds"], where)
    conditions = _conditions(data["conditions"], where)
    baseline = data.get("baseline")
    if baseline is not None and (not isinstance(baseline, str) or baseline not in conditions):
        raise ConfigError(f"{where}: baseline {shown(baseline)} is not one of the conditions "
                          f"({', '.join(conditions)}). Fix: name one of them, or leave baseline out to compare every "
                          f"pair")
    settings = {}
    checks = {"primary": check_primary, "margin": lambda v: check_margin("margin", v),
              "loss_margin": lambda v: check_margin("loss_margin", v),
              "logit_margin": lambda v: check_absolute_margin("logit_margin", v, "logits"),
              "kv_loss_margin": lambda v: check_margin("kv_loss_margin", v)}
    for key, check in checks.items():
        if data.get(key) is not None:
            try:
                settings[key] = check(data[key])
            except ConfigError as e:
                raise ConfigError(f"{where}: {e}") from None
    preset = data.get("preset")
    if preset is not None and (not isinstance(preset, str) or preset not in PRESETS):
        raise ConfigError(f"{where}: preset {shown(preset)} is not a named preset: choose one of {', '.join(PRESETS)}")
    shared = _fields({k: v for k, v in data.items() if k not in STUDY_KEYS}, where, STUDY_KEYS)
    return Study(name, KIND, conditions=conditions, default_seeds=seeds, preset=preset, shared=shared,
                 baseline=baseline, source=str(path), **settings)
