"""A study adds runs only in the precision and on the host kind of the runs its folder already holds (utils.hosts: a
CPU model and its native bf16 path, or a GPU; bf16 numerics differ between them, and findings moved with them),
unless it is made with --mix_hosts, which study.json then records and the analysis reads (its host kinds combined and
counted in the report, research.analysis.identity). Both study runners ask before anything trains:

    add_hosts_args(p)                                        --mix_hosts
    check_hosts(out, here, precision, mix_hosts) -> mixed    ConfigError in one line naming both and the fix; else
                                                             whether the folder mixes host kinds (study.json's)

`here` is the host kind of the process that trains (utils.runtime.this_host_kind); runs handed to a Ray cluster's
other nodes record their own, and the analysis sets aside those of another kind.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from configs.config import ConfigError
from research.results.layout import read_study_index
from research.results.vocabulary import RESULTS_FILE
from utils.hosts import host_kind, same_paths

WHERE = "docs/decisions.md#which-runs-are-compared-identity-before-statistics"


def add_hosts_args(p: argparse.ArgumentParser) -> None:
    """--mix_hosts (checked by check_hosts)."""
    p.add_argument("--mix_hosts", action="store_true",
                   help="Let the study's folder hold runs trained on several host kinds (a CPU model and its native "
                        "bf16 path, AMX, AVX512-BF16 or none, or a GPU: bf16 numerics differ between them), compared "
                        "together, the report saying on how many; recorded in study.json. Default: runs are added "
                        "only on the host kind of those the folder holds (refused before anything trains), and the "
                        "analysis sets aside runs of another kind. Runs of another precision are refused either way")


def recorded(out: Path) -> list[tuple[Path, dict]]:
    """(results file, its provenance) of every run the folder holds, in any state; a file that cannot be read is left
    to the trainer and the analysis, which say what is wrong with it."""
    out_ = []
    for path in sorted(Path(out).rglob(RESULTS_FILE)) if Path(out).is_dir() else []:
        try:
            prov = json.loads(path.read_text(encoding="utf-8")).get("provenance")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(prov, dict):
            out_.append((path, prov))
    return out_


def _held(counts: Counter, first: dict) -> str:
    """'bf16 (6 runs, e.g. QK/seed_0/results.json)', each value with its count and first file."""
    return ", ".join(f"{v} ({n} run{'s' * (n > 1)}, e.g. {first[v]})" for v, n in counts.most_common())


def mixes_hosts(out: Path, asked: bool) -> bool:
    """Whether the study in `out` mixes host kinds: asked now (--mix_hosts), or made so before (study.json's
    `mix_hosts`): once made so, a folder stays so."""
    return bool(asked or read_study_index(out).get("mix_hosts", False))


def check_hosts(out: Path, here: str | None, precision: str, mix_hosts: bool) -> bool:
    """Before anything trains: ConfigError naming both and the fix where the runs in `out` were trained in another
    precision than `precision` (always), or on host kinds that do not include `here` (unless the folder mixes host
    kinds: `mix_hosts`, the option, or study.json's, mixes_hosts). Returns whether it does, for study.json."""
    mix_hosts = mixes_hosts(out, mix_hosts)
    runs = recorded(out)
    rel = {path: path.relative_to(out).as_posix() for path, _ in runs}
    precisions: Counter = Counter()
    first: dict = {}
    for path, prov in runs:
        if (p := prov.get("train_precision")):
            precisions[p] += 1
            first.setdefault(p, rel[path])
    if precisions and precision not in precisions:
        top = precisions.most_common(1)[0][0]
        raise ConfigError(f"{out} holds runs trained in {_held(precisions, first)}, and this command trains in "
                          f"{precision}: a study compares runs of one precision ({WHERE}). Fix: --precision {top} "
                          f"(as they were trained), or another --out (nothing was trained)")
    kinds = same_paths([host_kind(prov) for _, prov in runs] + [here])
    here = kinds.pop() or here
    held: Counter = Counter()
    first = {}
    for (path, _), kind in zip(runs, kinds):
        if kind:
            held[kind] += 1
            first.setdefault(kind, rel[path])
    if held and here not in held and not mix_hosts:
        top = held.most_common(1)[0][0]
        raise ConfigError(f"{out} holds runs trained on {_held(held, first)}, and this host is {here}: bf16 numerics "
                          f"differ between host kinds, so a study compares the runs of one ({WHERE}). Fix: run it on a "
                          f"{top} host, or another --out, or pass --mix_hosts to combine them (the report then says "
                          f"they were trained on {len(held) + 1} host kinds) (nothing was trained)")
    return mix_hosts
