"""The checkpoint-keys study across seeds: which checkpoint is which seed's, and the tokens a checkpoint records.

    across_seeds(args)            # several hub ids with --revisions (each id one seed), or --seeds given
    check_seed_options(p, args)   # p.error for seeds that cannot be read or counted
    seed_entries(args, labels)    # one entry per (seed, revision): {label, name, revision, seed, index}
    read_tokens(name, revision)   # the tokens a checkpoint records, or None

A seed is --seeds', else the last `seed<N>` of a hub id; local checkpoints of several seeds need --seeds
(docs/inspection.md, "Across seeds: public checkpoint suites").
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from research.access.checkpoints import RECORDED
from research.access.loading import local_kind

SEED_IN_NAME = re.compile(r"seed[-_]?(\d+)", re.IGNORECASE)
TOKENS_IN_REVISION = re.compile(r"tokens(\d+)([KMBT]?)(?![a-z])", re.IGNORECASE)  # OLMo: stage1-step1000-tokens5B
_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def across_seeds(args) -> bool:
    return args.seeds is not None or (args.revisions is not None and len(args.checkpoints) > 1)


def seed_from_name(name: str) -> int | None:
    """The number of the last `seed<N>` in a hub id: pythia-160m-seed3 -> 3, pythia-160m-data-seed1 -> 1."""
    found = SEED_IN_NAME.findall(name)
    return int(found[-1]) if found else None


def _given_per(args) -> tuple[int, str]:
    """How many entries --seeds (and --steps) gives one value each, and what they are."""
    if args.revisions is not None and len(args.checkpoints) == 1:
        return len(args.revisions), "revision"
    return len(args.checkpoints), "checkpoint"


def check_seed_options(p, args) -> None:
    """p.error (one line) where the seeds cannot be read, are miscounted, or are fewer than two."""
    n, what = _given_per(args)
    if args.seeds is not None:
        if len(args.seeds) != n:
            p.error(f"--seeds gives {len(args.seeds)} seeds for {n} {what}s: give one per {what}, in order")
        if min(args.seeds) < 0:
            p.error(f"--seeds {' '.join(map(str, args.seeds))}: seeds are 0 or more")
    if args.revisions is not None and len(args.checkpoints) > 1:
        for name in args.checkpoints:
            if local_kind(name):
                p.error(f"--revisions with several --checkpoints reads each hub id as one seed, and {name} is a local "
                        f"{local_kind(name)}: pass every local checkpoint in --checkpoints with --seeds, one each")
        if args.seeds is None:
            unread = [c for c in args.checkpoints if seed_from_name(c) is None]
            if unread:
                p.error(f"--revisions takes one hub id, or several hub ids of one suite's seeds: no seed in the name "
                        f"of {', '.join(unread)} (no 'seed<N>'): give --seeds, one per checkpoint")
        if args.steps is not None and len(args.steps) != len(args.revisions):
            p.error(f"--steps gives {len(args.steps)} steps for {len(args.revisions)} revisions: with several hub "
                    f"ids, give one per revision (the same for every seed)")
    seeds = args.seeds if args.seeds is not None else [seed_from_name(c) for c in args.checkpoints]
    if len(set(seeds)) < 2:
        p.error(f"seeds {' '.join(map(str, seeds))}: a study across seeds needs 2 or more seeds (for one model's "
                f"checkpoints leave out --seeds)")


def seed_entries(args, labels) -> list[dict]:
    """One entry per checkpoint to load, with its seed; `index` is its place in --steps."""
    if args.revisions is not None and len(args.checkpoints) > 1:
        seeds = args.seeds or [seed_from_name(c) for c in args.checkpoints]
        return [{"label": f"{repo}@{r}", "name": name, "revision": r, "seed": s, "index": j}
                for repo, name, s in zip(labels(args.checkpoints), args.checkpoints, seeds)
                for j, r in enumerate(args.revisions)]
    if args.revisions is not None:
        return [{"label": lab, "name": args.checkpoints[0], "revision": r, "seed": s, "index": i}
                for i, (lab, r, s) in enumerate(zip(labels(args.revisions), args.revisions, args.seeds))]
    named = [f"seed{s}/{Path(n).name or n}" for n, s in zip(args.checkpoints, args.seeds)]
    named = named if len(set(named)) == len(named) else labels(args.checkpoints)
    return [{"label": lab, "name": n, "revision": None, "seed": s, "index": i}
            for i, (lab, n, s) in enumerate(zip(named, args.checkpoints, args.seeds))]


def _json_field(path: Path, field: str) -> int | None:
    try:
        value = json.loads(path.read_text()).get(field)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def read_tokens(name: str, revision: str | None) -> int | None:
    """Tokens trained on as the checkpoint records it: a revision's `tokens<N>[KMBT]` (OLMo's branches), export.json's
    tokens, trainer_state.json's num_input_tokens_seen; None where none says (Pythia's branches name steps only)."""
    if revision is not None:
        found = TOKENS_IN_REVISION.findall(revision)
        return int(found[-1][0]) * _SCALE[found[-1][1].upper()] if found else None
    path = Path(name).expanduser()
    if not path.is_dir():
        return None
    for file, field in zip(RECORDED, ("tokens", "num_input_tokens_seen")):  # export.json, trainer_state.json
        if (path / file).is_file():
            value = _json_field(path / file, field)
            if value is not None:
                return value
    return None
