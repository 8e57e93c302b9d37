"""The pretrained-keys study (research/pretrained_keys_study.py): measure real pretrained models' keys on text
batches, then decide and draw through the registry of study kinds (kind 'pretrained_keys').

    main(argv, description)   # what the script runs: parse, measure every model, write pretrained_keys.json,
                              # then research.studies.render draws its figures and report.md
"""
from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

import torch

from research.access.gguf import PACKAGED
from research.access.loading import is_own_run, load_model
from research.inspection.options import add_measure_options, check_measure_options
from research.inspection.text import text_documents, text_windows
from research.results.pretrained import FILE, SCHEMA, VERSION
from research.results.vocabulary import REPORT as REPORT_FILE
from research.studies.kinds import KINDS
from research.studies.measured import run_measured
from utils.cli import ArgumentParser

DEFAULT_MODELS = tuple(PACKAGED)
DEFAULT_OUT = "research_results/pretrained_keys_study"


def build_parser(description: str = "") -> ArgumentParser:
    outputs = textwrap.fill(f"Writes into --out: {', '.join((FILE, *KINDS['pretrained_keys'].outputs([])))}.", 100,
                            break_on_hyphens=False)
    p = ArgumentParser(description=f"{description.rstrip()}\n\n{outputs}")
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), metavar="MODEL",
                   help=f"Models to measure: packaged names ({', '.join(PACKAGED)}), GGUF files, Hugging Face "
                        f"folders or hub ids. Default: {' '.join(DEFAULT_MODELS)}")
    add_measure_options(p, default_out=DEFAULT_OUT, results_file=FILE, report_file=REPORT_FILE,
                        seed_help="Seed of the windows' choice and of the untrained reference's weights",
                        margin_reads="about equal")
    p.add_argument("--no_kv_cache", action="store_true",
                   help="Skip what a key cache would cost (each layer's attention errors with its keys quantized or "
                        "projected, on the first batch; the loss with every key quantized at 16, 8, 4, 3, 2 bits, on "
                        "every batch): 5 forwards of each batch fewer, and on the first one more and 30 approximate "
                        "attentions per layer")
    p.add_argument("--kv_layer_bits", action="store_true",
                   help="Also each layer's usable key bits, on the first batch: the loss with only that layer's keys "
                        "quantized at 8, 4, 3, 2 bits, 4 forwards of the batch per layer")
    return p


def parse_args(argv=None, description: str = "") -> argparse.Namespace:
    p = build_parser(description)
    args = p.parse_args(argv)
    check_measure_options(p, args)
    for name in args.models:
        if Path(name).expanduser().is_dir() and is_own_run(Path(name).expanduser()):
            p.error(f"--models {name}: a training folder of this project, which this study does not read; export "
                    f"it first (python research/export_hf.py {name} OUT) and pass OUT")
    return args


def untrained_like(model, seed: int):
    """A model of the same architecture with its own initialization (seeded): the reference of "low rank"."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(model.config, dtype=torch.float32).eval()


def measure(name: str, docs, args, log=print) -> dict:
    """One model's record on windows of `docs` (research.inspection.text.Documents, read once per run)."""
    from research.inspection.key_study import measure_keys
    t0 = time.perf_counter()
    model, tokenizer, adapter = load_model(name, "float32", args.cache_dir, log, progress=not args.no_progress)
    windows = text_windows(tokenizer, docs, args.batches * args.batch, args.seq_len, args.seed)
    init = type(adapter)(untrained_like(model, args.seed))
    log(f"{name}: {args.batches} batches of {args.batch} x {windows.shape[1]} tokens of {docs.name}")
    rec = measure_keys(adapter, windows, args.batch, init, desc=name, show_progress=not args.no_progress,
                       kv_cache=not args.no_kv_cache, kv_layer_bits=args.kv_layer_bits)
    rec.update({"model": name, "source": adapter.source, "family": adapter.family, "model_type": adapter.model_type,
                "n_layers": adapter.n_layers, "n_heads": adapter.n_heads, "n_kv_heads": adapter.n_kv_heads,
                "head_dim": adapter.head_dim, "d_model": adapter.d_model, "params": adapter.model_param_count(),
                "gguf": adapter.gguf, "sliding_window": getattr(model.config, "sliding_window", None),
                "layer_types": getattr(model.config, "layer_types", None),
                "text": {"source": docs.name, "sha256": docs.sha256, "description": docs.description,
                         "documents": docs.picked, "batches": args.batches, "batch": args.batch,
                         "seq_len": int(windows.shape[1]), "seed": args.seed},
                "wall_s": time.perf_counter() - t0})
    log(f"{name}: loss {sum(b['loss'] for b in rec['batches']) / len(rec['batches']):.3f} nats/token on the text; "
        f"{rec['wall_s']:.0f} s")
    return rec


def main(argv=None, description: str = "") -> int:
    args = parse_args(argv, description)

    def measure_models() -> dict:
        from utils.runtime import provenance
        docs = text_documents(args.text)
        models = {name: measure(name, docs, args) for name in args.models}
        return {"schema": SCHEMA, "version": VERSION, "models": models, "margin": args.margin,
                "command": "python research/pretrained_keys_study.py " + " ".join(argv or sys.argv[1:]),
                "provenance": provenance(torch.device("cpu"))}
    run_measured(Path(args.out), "pretrained_keys", tool="pretrained_keys_study.py", margin=args.margin,
                 render_only=args.render_only, measure=measure_models)
    return 0
