"""The one comparison of what a finished (or started) run recorded with what is asked of it now: a study keeps a
run only when its recorded config, model and data equal what is asked (training.resume for this project's runs,
research.studies.finetune for the fine-tuning study's). Ground floor: plain dicts in, the differing fields out."""
from __future__ import annotations


def flatten(d: dict, prefix: str = "") -> dict:
    """{"train.lr": 1e-4, ...}: nested dicts as dotted field paths."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def differences(recorded: dict, asked: dict, ignore=frozenset(), only_asked: bool = False) -> list[str]:
    """'<field>: <recorded> -> <asked>' for each field whose values differ, by dotted path, sorted; fields whose
    last part is in `ignore` may differ. `only_asked`: compare the fields `asked` names only (a record may hold
    more, e.g. what the run measured)."""
    a, b = flatten(recorded), flatten(asked)
    fields = sorted(b if only_asked else set(a) | set(b))
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in fields
            if a.get(k) != b.get(k) and k.split(".")[-1] not in ignore]
