"""The checkpoint-keys study (research/checkpoint_keys_study.py): measure one model's saved checkpoints on the same
text batches, then decide and draw through the registry of study kinds (kind 'checkpoint_keys').

    main(argv, description)   # what the script runs: parse, order the checkpoints by step, measure each, write
                              # checkpoint_keys.json, then research.studies.render draws its figures and report.md

Several seeds' checkpoints (research/studies/checkpoint_seeds.py) are measured the same way, each entry with its seed
and recorded token count, every checkpoint against the first one's architecture, tokenizer and text windows.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

import torch

from research.access import InspectError
from research.access.checkpoints import RECORDED, read_step, weights_sha256
from research.access.loading import is_own_run, load_model, local_kind, looks_like_hub_id
from research.analysis.heads import SINK_MASS
from research.analysis.trajectory_seeds import missing_lines
from research.inspection.options import add_measure_options, check_measure_options
from research.inspection.text import starts_with_bos, text_documents, text_windows
from research.results.trajectory import FILE, SCHEMA, VERSION
from research.results.vocabulary import REPORT as REPORT_FILE
from research.studies.checkpoint_seeds import across_seeds, check_seed_options, read_tokens, seed_entries
from research.studies.kinds import KINDS
from research.studies.measured import run_measured
from utils.cli import ArgumentParser
from utils.errors import shown

DEFAULT_OUT = "research_results/checkpoint_keys_study"


def build_parser(description: str = "") -> ArgumentParser:
    outputs = textwrap.fill(f"Writes into --out: {', '.join((FILE, *KINDS['checkpoint_keys'].outputs([])))}.", 100,
                            break_on_hyphens=False)
    p = ArgumentParser(description=f"{description.rstrip()}\n\n{outputs}")
    p.add_argument("--checkpoints", nargs="+", metavar="CHECKPOINT",
                   help="Checkpoints of one model: Hugging Face folders (export_hf.py exports, Trainer checkpoint-N "
                        "folders), GGUF files, or one hub id with --revisions; or of several seeds of one recipe "
                        "(--seeds, or several hub ids with --revisions). Required unless --render_only")
    p.add_argument("--revisions", nargs="+", metavar="REVISION",
                   help="Hub revisions (branches, tags or commits) of the one hub id in --checkpoints, e.g. a "
                        "model's intermediate training checkpoints, or of each of several hub ids, one seed each "
                        "(a study across seeds); needs a network. Default: none")
    p.add_argument("--seeds", nargs="+", type=int, metavar="SEED",
                   help="A study across seeds: the training seed of each checkpoint (with one hub id and --revisions, "
                        "of each revision), in the order given; revisions are paired within a seed and their change "
                        "decided across seeds. Default: one model; with several hub ids and --revisions, each id's "
                        "seed<N>")
    p.add_argument("--sink_threshold", type=float, default=SINK_MASS,
                   help="Across seeds: a head is a sink at a revision when its first-token attention (queries "
                        "1..T-1, mean over the text) is above this; its onset is the first such revision. "
                        "Default: %(default)s (Gu et al. 2024, as the heads study)")
    p.add_argument("--steps", nargs="+", type=int, metavar="STEP",
                   help="Training step of each checkpoint (or revision; with several hub ids, of each revision, "
                        "the same for every seed), in the order given, for checkpoints that "
                        "record none; a step recorded in export.json or trainer_state.json must agree. Default: read "
                        "from each checkpoint")
    add_measure_options(p, default_out=DEFAULT_OUT, results_file=FILE, report_file=REPORT_FILE,
                        seed_help="Seed of the windows' choice", margin_reads="unchanged")
    return p


def parse_args(argv=None, description: str = "") -> argparse.Namespace:
    p = build_parser(description)
    args = p.parse_args(argv)
    check_measure_options(p, args)
    if args.render_only:
        return args
    if not args.checkpoints:
        p.error("--checkpoints: give the checkpoints to measure (or --render_only to redraw)")
    if not 0 < args.sink_threshold < 1:
        p.error(f"--sink_threshold {args.sink_threshold}: give a share of attention between 0 and 1")
    if args.revisions is not None and len(args.checkpoints) == 1:
        local = local_kind(args.checkpoints[0])
        if local:
            p.error(f"--revisions applies to hub ids, and {args.checkpoints[0]} is a local {local}: pass each local "
                    f"checkpoint as its own entry of --checkpoints, without --revisions")
    if across_seeds(args):
        check_seed_options(p, args)
    n = len(args.revisions) if args.revisions is not None else len(args.checkpoints)
    if n < 2:
        p.error("give 2 or more checkpoints (or revisions): a trajectory needs more than one point")
    if args.steps is not None:  # several hub ids: one per revision, checked with the seeds
        if len(args.steps) != n:
            p.error(f"--steps gives {len(args.steps)} steps for {n} checkpoints: give one per checkpoint, in order")
        if min(args.steps) < 0:
            p.error(f"--steps {' '.join(map(str, args.steps))}: steps are 0 or more")
    for name in args.checkpoints:
        path = Path(name).expanduser()
        if path.is_dir() and is_own_run(path):
            p.error(f"--checkpoints {name}: a training folder of this project; export the steps to follow first "
                    f"(python research/export_hf.py {name} OUT_N --step N, once per step) and pass the OUT_N")
    return args


def _labels(names: list[str]) -> list[str]:
    """Short unique labels: a folder's or file's name, the full spelling where two names collide, #k after."""
    short = [Path(n).name or n for n in names]
    labels = [s if short.count(s) == 1 else n for s, n in zip(short, names)]
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if labels.count(lab) == 1 else f"{lab} #{seen[lab]}")
    return out


def _entries(args) -> list[dict]:
    """{label, name, revision} per checkpoint to load, in the order given; across seeds with its seed and the index of
    its step in --steps."""
    if across_seeds(args):
        return seed_entries(args, _labels)
    if args.revisions is not None:
        return [{"label": lab, "name": args.checkpoints[0], "revision": r}
                for lab, r in zip(_labels(args.revisions), args.revisions)]
    return [{"label": lab, "name": n, "revision": None} for lab, n in zip(_labels(args.checkpoints), args.checkpoints)]


def plan(args) -> list[dict]:
    """The checkpoints in step order: {label, name, revision, step, step_from}, across seeds with seed and tokens (what
    the checkpoint records, else None); InspectError where a step is unknown."""
    entries = _entries(args)
    missing = [e["name"] for e in entries if e["revision"] is None and local_kind(e["name"]) is None
               and not looks_like_hub_id(e["name"])]
    if missing:  # before any step is read: "pass --steps" would be no fix
        raise InspectError(f"checkpoint {shown(missing[0])} not found: no such folder or file. Fix: check the path")
    contradicted = []
    for i, e in enumerate(entries):
        i = e.pop("index", i)
        if "seed" in e:
            e["tokens"] = read_tokens(e["name"], e["revision"])
        found = read_step(e["name"], e["revision"])
        if args.steps is not None:
            e["step"], e["step_from"] = args.steps[i], "--steps"
            if found is not None and found[1] in RECORDED and found[0] != args.steps[i]:
                contradicted.append(f"{e['label']}: --steps gives {args.steps[i]}, its {found[1]} records "
                                    f"{found[0]}")
            continue
        if found is None and e["revision"] is None and local_kind(e["name"]) is None:  # a path that is not here
            raise InspectError(f"no training step found for {e['label']}: {shown(e['name'])} is no folder or file "
                               f"here, and a hub id at its main revision names no step. Fix: check the path, or for a "
                               f"hub model give --revisions (e.g. step1000) or --steps")
        if found is None:
            raise InspectError(f"no training step found for {e['label']} (no export.json, trainer_state.json, "
                               f"checkpoint-N folder name or number in a revision's name): pass --steps, one per "
                               f"checkpoint in the order given")
        e["step"], e["step_from"] = found
    if contradicted:  # a given step against the checkpoint's own record would reorder the trajectory silently
        raise InspectError(f"--steps contradicts the steps the checkpoints record ({'; '.join(contradicted)}): leave "
                           f"out --steps to take the recorded steps, or correct the file that is wrong")
    twice = sorted({f"seed {e['seed']} at step {e['step']}" for e in entries if "seed" in e
                    and sum(o.get("seed") == e["seed"] and o["step"] == e["step"] for o in entries) > 1})
    if twice:  # revisions are paired within a seed by their step
        raise InspectError(f"two checkpoints of {', '.join(twice)}: a seed has one checkpoint per step; correct "
                           f"--seeds or --steps")
    return sorted(entries, key=lambda e: e["step"])  # stable: checkpoints of one step keep the order given


def _shape(adapter) -> dict:
    return {"model_type": adapter.model_type, "family": adapter.family, "n_layers": adapter.n_layers,
            "n_heads": adapter.n_heads, "n_kv_heads": adapter.n_kv_heads, "head_dim": adapter.head_dim,
            "d_model": adapter.d_model}


def measure(entries: list[dict], docs, args, log=print) -> tuple[list[dict], dict]:
    """(one record per checkpoint in step order, the reference: the first checkpoint's model shape, windows and
    BOS). A checkpoint with the weights of an earlier one is recorded as its duplicate and not measured."""
    from research.inspection.key_study import measure_keys
    records: list[dict] = []
    ref: dict = {}
    seen: dict[str, str] = {}  # weights' sha256 -> label of the measured checkpoint
    for e in entries:
        t0 = time.perf_counter()
        model, tokenizer, adapter = load_model(e["name"], "float32", args.cache_dir, log,
                                               progress=not args.no_progress, revision=e["revision"])
        digest = weights_sha256(model)
        head = {"label": e["label"], "source": adapter.source, "step": e["step"], "step_from": e["step_from"],
                **{k: e[k] for k in ("seed", "tokens") if k in e}, "sha256": digest}
        if digest in seen:
            log(f"{e['label']} (step {e['step']}): the weights of {seen[digest]}; recorded as its duplicate, not "
                f"measured")
            records.append({**head, "duplicate_of": seen[digest]})
            continue
        windows = text_windows(tokenizer, docs, args.batches * args.batch, args.seq_len, args.seed)
        shape = _shape(adapter)
        if not ref:
            ref = {"label": e["label"], "model": {**shape, "vocab": len(tokenizer)}, "windows": windows,
                   "bos": starts_with_bos(tokenizer)}
        else:
            differs = [k for k in shape if k not in ("model_type", "family") and shape[k] != ref["model"][k]]
            if differs or shape["model_type"] != ref["model"]["model_type"]:
                raise InspectError(f"{e['label']} ({shape['model_type']}, {shape['n_layers']} layers, "
                                   f"{shape['n_heads']} heads of {shape['head_dim']}) is not the architecture of "
                                   f"{ref['label']} ({ref['model']['model_type']}, {ref['model']['n_layers']} layers, "
                                   f"{ref['model']['n_heads']} heads of {ref['model']['head_dim']}). Fix: pass "
                                   f"checkpoints of one training run (across seeds: of one recipe)")
            if len(tokenizer) != ref["model"]["vocab"] or not torch.equal(windows, ref["windows"]):
                raise InspectError(f"{e['label']}'s tokenizer is not {ref['label']}'s ({len(tokenizer):,} tokens "
                                   f"against {ref['model']['vocab']:,}, or other token ids for the same text): every "
                                   f"checkpoint must read the same tokens")
        log(f"{e['label']} (step {e['step']}): {args.batches} batches of {args.batch} x {windows.shape[1]} tokens "
            f"of {docs.name}")
        rec = measure_keys(adapter, windows, args.batch, None, desc=e["label"], show_progress=not args.no_progress)
        rec.update({**head, "duplicate_of": None, **shape, "params": adapter.model_param_count(), "gguf": adapter.gguf,
                    "wall_s": time.perf_counter() - t0})
        seen[digest] = e["label"]
        records.append(rec)
        del model, adapter
    return records, ref


def main(argv=None, description: str = "") -> int:
    args = parse_args(argv, description)
    entries = [] if args.render_only else plan(args)  # a step that cannot be read stops before anything is written

    def measure_checkpoints() -> dict:
        from utils.runtime import provenance
        docs = text_documents(args.text)
        records, ref = measure(entries, docs, args)
        text = {"source": docs.name, "sha256": docs.sha256, "description": docs.description,
                "documents": docs.picked, "batches": args.batches, "batch": args.batch,
                "seq_len": int(ref["windows"].shape[1]), "seed": args.seed, "bos": ref["bos"] is not None}
        seeds = {"sink_threshold": args.sink_threshold} if across_seeds(args) else {}
        return {"schema": SCHEMA, "version": VERSION, "model": ref["model"], "text": text, "checkpoints": records,
                "margin": args.margin, **seeds,
                "command": "python research/checkpoint_keys_study.py " + " ".join(argv or sys.argv[1:]),
                "provenance": provenance(torch.device("cpu"))}
    record = run_measured(Path(args.out), "checkpoint_keys", tool="checkpoint_keys_study.py", margin=args.margin,
                          render_only=args.render_only, measure=measure_checkpoints)
    if record and "sink_threshold" in record:
        for line in missing_lines(record):
            print(line)
    dups = sum(r["duplicate_of"] is not None for r in record["checkpoints"]) if record else 0
    if dups:
        print(f"{dups} checkpoint(s) with weights identical to an earlier one, named in the report")
    return 0
