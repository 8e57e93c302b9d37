"""A study adds runs only in the one precision and host kind its folder already holds, unless made with --mix_hosts.

    add_hosts_args(p)                                        --mix_hosts
    check_hosts(out, here, precision, mix_hosts) -> mixed    ConfigError in one line naming both and the fix
    study_threads(out, here, asked) -> (threads, line)       the --threads every run of this command gets

`here` is the host kind of the training process (utils.runtime.this_host_kind); runs on a Ray cluster's other nodes
record their own, and the analysis sets aside those of another kind (research.analysis.identity). Why: bf16 numerics
differ between host kinds and findings moved with them (docs/studies.md, "The first command on each host kind").
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from configs.config import ConfigError
from research.results.layout import read_study_index
from research.results.vocabulary import RESULTS_FILE
from utils.hosts import host_kind, path_unknown, same_paths
from utils.threads import ThreadChoice, cpu_threads

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


def _counted(runs: list[tuple[str, str | None]]) -> tuple[Counter, dict]:
    """(how many runs have each value, the first file of each) of (file, value) pairs; a value of None (not recorded)
    is not counted."""
    counts: Counter = Counter()
    first: dict = {}
    for rel, value in runs:
        if value:
            counts[value] += 1
            first.setdefault(value, rel)
    return counts, first


def _held(counts: Counter, first: dict) -> str:
    """'bf16 (6 runs, e.g. QK/seed_0/results.json)', each value with its count and first file."""
    return ", ".join(f"{v} ({n} run{'s' * (n > 1)}, e.g. {first[v]})" for v, n in counts.most_common())


def mixes_hosts(out: Path, asked: bool) -> bool:
    """Whether the study in `out` mixes host kinds: asked now (--mix_hosts), or made so before (study.json's
    `mix_hosts`): once made so, a folder stays so."""
    return bool(asked or read_study_index(out).get("mix_hosts", False))


def check_hosts(out: Path, here: str | None, precision: str, mix_hosts: bool) -> bool:
    """Before anything trains: ConfigError in one line naming what the folder holds, this command's, and the fix,
    where the precisions of the runs in `out` and `precision` are more than one (always: precision is never
    mixed), or where their host kinds and `here` are more than one, unless the folder mixes host kinds (`mix_hosts`,
    the option, or study.json's: mixes_hosts). A folder that holds several already is refused whichever of them this
    command's is: adding to it would leave the analysis to set a group aside. `here` None (a CPU not named) and runs
    that record none are not counted, as the analysis does not. An older run that records only native bf16 takes the
    path that the folder's own newer runs of its CPU model record (utils.hosts.same_paths), never this host's: where
    they do not say, it is 'MODEL (native bf16, path not recorded)', a kind no host is now (every run records its
    path), and a study adds to it only with --mix_hosts (refused naming it otherwise): guessing it the same as this
    host's would let an AMX host's runs be compared with an AVX512-BF16 host's of the same model name. Returns whether
    the folder mixes host kinds, for study.json."""
    mix_hosts = mixes_hosts(out, mix_hosts)
    runs = recorded(out)
    rel = [path.relative_to(out).as_posix() for path, _ in runs]
    precisions, first = _counted([(r, prov.get("train_precision")) for r, (_, prov) in zip(rel, runs)])
    if precisions and set(precisions) != {precision}:
        top = precisions.most_common(1)[0][0]
        fix = (f"--precision {top} (as they were trained)" if len(precisions) == 1 else
               "move the runs of all but one precision out of the folder (and give --precision as the rest were "
               "trained)")
        raise ConfigError(f"{out} holds runs trained in {_held(precisions, first)}, and this command trains in "
                          f"{precision}: a study compares runs of one precision ({WHERE}). Fix: {fix}, or another "
                          f"--out (nothing was trained)")
    # the folder's runs alone say which bf16 path an older run had (utils.hosts.same_paths), never this host
    held, first = _counted(list(zip(rel, same_paths([host_kind(prov) for _, prov in runs]))))
    found = set(held) | ({here} if here else set())
    if len(found) > 1 and not mix_hosts:
        this = f"this host is {here}" if here else "this host's kind is not known (its CPU is not named)"
        mix = f"pass --mix_hosts to combine them (the report then says they were trained on {len(found)} host kinds)"
        top = held.most_common(1)[0][0]
        if len(held) > 1:
            fix = f"{mix}, or move the runs of all but one host kind out of the folder, or another --out"
        elif path_unknown(top):
            fix = (f"{mix}, or another --out: they were recorded before a run's bf16 path (AMX or AVX512-BF16) was, "
                   f"and nothing in the folder says which they had, so no host now is of their kind")
        else:
            fix = f"run it on a {top} host, or another --out, or {mix}"
        raise ConfigError(f"{out} holds runs trained on {_held(held, first)}, and {this}: bf16 numerics differ "
                          f"between host kinds, so a study compares the runs of one ({WHERE}). Fix: {fix} (nothing "
                          f"was trained)")
    return mix_hosts


def study_threads(out: Path, here: ThreadChoice, asked: int) -> tuple[int, str | None]:
    """The --threads of every run this command trains in its own process on CPU, and a line to print where the folder
    says something: bf16 values move with the thread count (utils.threads), so a study continues on the one count its
    folder's runs record where the user asks none (`asked` 0), though `here` (this host's choice now) differs; asked
    otherwise, or where the folder holds several already, its runs mix counts, which the line says, as the report
    does (research.analysis.identity)."""
    runs = recorded(out)
    rel = [path.relative_to(out).as_posix() for path, _ in runs]
    held, first = _counted([(r, cpu_threads(prov)) for r, (_, prov) in zip(rel, runs)])
    if not held or set(held) == {here.threads}:
        return asked, None
    if len(held) == 1 and asked <= 0:
        (count,) = held
        return count, (f"threads: {count}, as the runs in {out} were trained (CPU threads {_held(held, first)}), not "
                       f"the {here.threads} of this host now ({here.why}): one count keeps a study's bf16 values "
                       f"comparable; --threads N chooses")
    return asked, (f"note: {out} holds runs trained on CPU threads {_held(held, first)}, and this command's runs "
                   f"train on {here.threads} ({here.why}): bf16 values move with the count (about 7e-5 relative), "
                   f"and the report says the study mixes them; --threads {held.most_common(1)[0][0]} keeps to one")
