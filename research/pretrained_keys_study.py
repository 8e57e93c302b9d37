"""Keys of real pretrained models: what a trained model can answer of the write-ups' claims.

    python research/pretrained_keys_study.py                      # SmolLM2-135M and Gemma 3 270M, offline
    python research/pretrained_keys_study.py --models smollm2-135m --batches 4
    python research/pretrained_keys_study.py --render_only        # redraw figures and report from the JSON

For each model (a packaged name, a GGUF file, a Hugging Face folder or a hub id; GGUF files are
converted once into --cache_dir), --batches batches of --batch windows of --seq_len tokens of real text
(--text: english-v1 by default, one window per document) go through the model; on each batch the
probe's key metrics (per layer and KV head at k_proj, k_norm where the model has one, and after
RoPE), its attention metrics (per query head) and its loss are recorded, and the same keys of an
untrained model of the same architecture (seeded initialization) on the same batch. Then
research/analysis/pretrained.py decides, per model, with text batches as the unit of uncertainty:

1. key norms against sqrt(d_head) by depth (early, middle, final layers);
2. sinks and gatherers among the KV heads of a layer (by attention, as the head-specialization study
   decides them) and whether sinks have longer keys within a layer;
3. the spread of the k_norm gain (CV, golden dimensions), exact, for models that have k_norm;
4. low key rank: pr_sv against the untrained architecture's on the same text.

Writes into --out the results file (every per-batch number), one figure per question and report.md;
--help lists the files.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

import torch

from research.inspection.gguf import PACKAGED
from research.inspection.loading import is_own_run, load_model
from research.inspection.options import add_measure_options, check_measure_options
from research.inspection.text import text_documents, text_windows
from research.results import save_results
from research.results.layout import refuse_others_results
from research.results.pretrained import FILE, SCHEMA, VERSION, load_pretrained_keys
from utils.cli import ArgumentParser, command
from utils.errors import Interrupted
from utils.lock import FolderLock

DEFAULT_MODELS = tuple(PACKAGED)
DEFAULT_OUT = "research_results/pretrained_keys_study"
REPORT_FILE = "report.md"


def build_parser() -> ArgumentParser:
    from research.plots.pretrained import FIGURES  # matplotlib: only for the parser
    outputs = textwrap.fill(f"Writes into --out: {', '.join((FILE, *FIGURES, REPORT_FILE))}.", 100,
                            break_on_hyphens=False)
    p = ArgumentParser(description=f"{__doc__.rstrip()}\n\n{outputs}")
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), metavar="MODEL",
                   help=f"Models to measure: packaged names ({', '.join(PACKAGED)}), GGUF files, Hugging Face "
                        f"folders or hub ids. Default: {' '.join(DEFAULT_MODELS)}")
    add_measure_options(p, default_out=DEFAULT_OUT, results_file=FILE, report_file=REPORT_FILE,
                        seed_help="Seed of the windows' choice and of the untrained reference's weights",
                        margin_reads="about equal")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = build_parser()
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
    rec = measure_keys(adapter, windows, args.batch, init, desc=name, show_progress=not args.no_progress)
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


def render(out: Path, res: dict, margin: float) -> Path:
    from research.plots import pretrained as figures
    from research.plots.common import save_figures
    from utils.io import atomic_write_text
    save_figures(out, figures.figures(res, margin))
    report = out / REPORT_FILE
    atomic_write_text(report, figures.report(res, margin))
    return report


@command(fix_also="pass --out DIR")
def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    saved = None  # the results file, once written: an interrupt keeps it
    try:
        if args.render_only:
            res = load_pretrained_keys(out / FILE)
            print(f"wrote {render(out, res, args.margin)} and the figures")
            return 0
        refuse_others_results(out, "pretrained_keys_study.py")
        out.mkdir(parents=True, exist_ok=True)
        with FolderLock(out, hint="pass another --out"):
            from utils.runtime import provenance
            t0 = time.perf_counter()
            docs = text_documents(args.text)
            models = {name: measure(name, docs, args) for name in args.models}
            res = {"schema": SCHEMA, "version": VERSION, "models": models, "margin": args.margin,
                   "command": "python research/pretrained_keys_study.py " + " ".join(argv or sys.argv[1:]),
                   "provenance": provenance(torch.device("cpu")), "wall_s": time.perf_counter() - t0}
            save_results(out / FILE, res)
            saved = out / FILE
            report = render(out, load_pretrained_keys(out / FILE), args.margin)
    except KeyboardInterrupt:
        kept = f"kept {saved}; draw the figures and report with --render_only" if saved else "nothing was written"
        raise Interrupted(f"interrupted; {kept}") from None
    print(f"wrote {out / FILE}, {report} and the figures in {res['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
