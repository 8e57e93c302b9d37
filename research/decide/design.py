"""Sequential looks for runs made elsewhere (qk-decide --until_decided MAX --round N --design FILE): the design file
records, at the first call, the first look's seeds, MAX, the round, the spending and the family (comparisons,
metrics, primary, margins), so that a later call with more seeds is a planned look, decided at the design's
calibrated levels (research.analysis.sequential, as the studies' --until_decided); more seeds at a count the design
does not plan is a look nobody planned, decided at the full alpha and said so. docs/decide.md, "Planning looks".

    design, looks, said = look_at(path, seeds, family, until_decided=8, round_=2)   # writes the file
"""
from __future__ import annotations

import json
from pathlib import Path

from research.analysis.rules import ALPHA
from research.analysis.sequential import FIRST_SHARE, RHO, Design, Look, plan
from research.analysis.runs import DecideError
from utils.errors import shown
from utils.formats import FormatError, check
from utils.io import atomic_write_text
from utils.owners import refuse_foreign

TOOL = "qk-decide"


def _key(seed) -> str:
    return json.dumps(seed)  # a seed 3 and a seed "3" are two seeds, as the files wrote them


def _seed_list(seeds) -> list:
    return sorted(seeds, key=lambda s: (isinstance(s, str), s if not isinstance(s, str) else 0, str(s)))


def read_design(path: Path) -> dict | None:
    """The design file at `path` (None where there is none); DecideError, one line, for a file that is not one."""
    from research.results.file_formats import DECIDE_DESIGN_FORMAT
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        check(DECIDE_DESIGN_FORMAT, record)
    except (OSError, ValueError, FormatError) as e:  # ValueError: not JSON or not UTF-8
        raise DecideError(f"--design {path} is not a {TOOL} design ({shown(str(e), 80)}). Fix: name a new file, or "
                          f"restore this one") from None
    return record


def design_of(record: dict) -> Design:
    try:
        return plan(len(record["first_seeds"]), record["max_seeds"], record["round"], record["alpha"], record["rho"],
                    record["first"], True)
    except ValueError:
        raise DecideError(f"--design: a design of {len(record['first_seeds'])} first seeds up to "
                          f"{record['max_seeds']} by {record['round']} plans no looks: the file was edited. Fix: "
                          f"restore it, or name a new file") from None


def look_at(path: str | Path, seeds, family: dict, until_decided: int | None, round_: int | None
            ) -> tuple[Design, list[Look], str]:
    """The design at `path` and its looks with this call's (seeds: the seeds every compared condition has), the
    file written where the call adds a look; a sentence saying which look this is. The first call (no file) plans
    the design from `seeds` and records it; a later call must give the family the design fixed (DecideError naming
    what changed) and keep every earlier look's seeds."""
    path = Path(path)
    refuse_foreign(path.parent if str(path.parent) else Path("."), "decide", TOOL, fix="name a --design file in "
                   "another folder")
    record = read_design(path)
    seeds = _seed_list(set(seeds))
    if record is None:
        if until_decided is None:
            raise DecideError(f"--design {path} does not exist: a design is planned with --until_decided MAX (and "
                              f"--round N) at the first look. Fix: add --until_decided")
        if len(seeds) < 2 or until_decided < len(seeds):
            raise DecideError(f"--until_decided {until_decided} over {len(seeds)} seeds shared by the conditions: "
                              f"a design starts from 2 or more seeds and plans up to at least those. Fix: a MAX of "
                              f"{max(len(seeds), 2)} or more, and runs of 2 or more seeds")
        design = plan(len(seeds), until_decided, round_ or 1, ALPHA, RHO, FIRST_SHARE, True)
        record = {"tool": TOOL, "first_seeds": seeds, "max_seeds": until_decided, "round": round_ or 1,
                  "alpha": ALPHA, "rho": RHO, "first": FIRST_SHARE, "family": family,
                  "looks": [{"seeds": seeds, "alpha": design.level(0), "planned": True}]}
        atomic_write_text(path, json.dumps(record, indent=1) + "\n")
        return design, _looks(record), f"look 1 of a new design (seeds {len(seeds)}, planned looks at " \
                                        f"{', '.join(map(str, design.looks))} seeds), recorded in {path}"
    design = design_of(record)
    for key in ("until_decided", "round"):
        given = until_decided if key == "until_decided" else round_
        fixed = record["max_seeds"] if key == "until_decided" else record["round"]
        if given is not None and given != fixed:
            raise DecideError(f"--{key} {given}, but the design in {path} fixed {fixed} at its first look. Fix: "
                              f"leave it out, or start a new design in another file")
    changed = [k for k in family if record["family"].get(k) != family[k]]
    if changed:
        k = changed[0]
        raise DecideError(f"{k} is {shown(family[k], 60)}, not the {shown(record['family'].get(k), 60)} the design "
                          f"in {path} fixed at its first look: a family chosen after seeing data is not the one "
                          f"planned. Fix: give the design's, or start a new design in another file")
    looks = record["looks"]
    last = looks[-1]["seeds"]
    lost = [s for s in last if _key(s) not in {_key(x) for x in seeds}]
    if lost:
        raise DecideError(f"seed(s) {', '.join(map(str, lost[:5]))} of the last look are not in the runs now: a look "
                          f"adds seeds, never drops them. Fix: pass the runs of every earlier seed")
    if len(seeds) == len(last):
        return design, _looks(record), f"look {len(looks)} again (the same {len(seeds)} seeds: no new look)"
    j = len(looks)
    planned = j < len(design.looks) and len(seeds) == design.looks[j] and all(x["planned"] for x in looks)
    alpha = design.level(j) if planned else ALPHA
    looks.append({"seeds": seeds, "alpha": alpha, "planned": planned})
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")
    if planned:
        return design, _looks(record), f"look {j + 1} of the design, planned at {len(seeds)} seeds"
    want = f"the next planned look is at {design.looks[j]} seeds" if j < len(design.looks) and \
        all(x["planned"] for x in looks[:-1]) else "the design planned no more looks"
    return design, _looks(record), (f"look {j + 1} at {len(seeds)} seeds is a look nobody planned ({want}): "
                                    f"decided at the full {ALPHA:g}, and the error bound adds it")


def _looks(record: dict) -> list[Look]:
    return [Look(tuple(x["seeds"]), float(x["alpha"]), bool(x["planned"])) for x in record["looks"]]


def done(design: Design, looks: list[Look]) -> bool:
    """Whether the design's last look is taken."""
    return bool(looks) and len(looks[-1].seeds) >= design.looks[-1]
