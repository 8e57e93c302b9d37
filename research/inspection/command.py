"""The inspect_pretrained command (research/inspect_pretrained.py): parse its options, load the model, take the
tour on text windows or a prompt (research.inspection.tour), write inspect.json, the figures and report.md.

    main(argv, description)   # what the script runs
"""
from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

from research.access.gguf import PACKAGED
from research.access.loading import CACHE_HELP, DEFAULT_CACHE
from research.inspection.text import ENGLISH, text_batch
from research.access import load_model
from research.inspection import DEFAULT_WORDS, DICT_SAMPLE, inspect_model
from research.inspection.tour import check_arguments
from research.plots import inspection as figures
from research.plots.common import with_figures, write_outputs
from research.results import save_results
from research.results.vocabulary import INSPECT_FILE, REPORT as REPORT_FILE, REPORT_PAGE
from utils.cli import ArgumentParser
from utils.errors import Interrupted
from utils.owners import refuse_foreign


def build_parser(description: str = "") -> ArgumentParser:
    outputs = ", ".join((INSPECT_FILE, *figures.FIGURES, REPORT_FILE, REPORT_PAGE))
    p = ArgumentParser(description=f"{description.rstrip()}\n\n"
                                   + textwrap.fill(f"Writes into --out: {outputs}.", 100, break_on_hyphens=False))
    p.add_argument("--model", required=True,
                   help="The model to inspect: a Hugging Face folder, a hub id, a train_llm.py output folder, a GGUF "
                        f"file (or a folder holding one), or a packaged model: {', '.join(PACKAGED)}. Required")
    p.add_argument("--cache_dir", default=DEFAULT_CACHE, help=CACHE_HELP)
    p.add_argument("--text", default=ENGLISH,
                   help="Real text to run through the model: 'english' (the pinned corpus english-v1, "
                        "requirements-data.txt) or a UTF-8 text file; --batch windows of --seq_len tokens, one "
                        "per document where the text has enough (research/inspection/text.py). Default: %(default)s")
    p.add_argument("--batch", type=int, default=4, help="Text windows run through the model. Default: %(default)s")
    p.add_argument("--seq_len", type=int, default=256,
                   help="Tokens per text window (cut to the model's context, with a note). Default: %(default)s")
    p.add_argument("--seed", type=int, default=0, help="Seed of the windows' choice in the text. Default: %(default)s")
    p.add_argument("--prompt", default=None,
                   help="Run this one prompt instead of --text windows (e.g. a sentence for the logit lens). "
                        "Default: none, the --text windows")
    p.add_argument("--out", default=None, help="Folder to write inspect.json, the figures and report.md into. "
                                              "Default: research_results/inspect/<model name>")
    p.add_argument("--positions", type=int, nargs="+", default=None, metavar="POSITION",
                   help="Token positions the logit lens reads, negative from the end. Default: the last (-1)")
    p.add_argument("--top_k", type=int, default=5,
                   help="Tokens listed per layer in the logit and input lenses, and per head in the head words. "
                        "Default: %(default)s")
    p.add_argument("--layer", type=int, default=None,
                   help="Layer of the heads x positions attention heatmap. Default: the middle one (layers // 2)")
    p.add_argument("--max_tokens", type=int, default=512,
                   help="Cut the prompt, or each text window, to this many tokens (and to the model's context); at "
                        "least 2. Default: %(default)s")
    p.add_argument("--words", default=",".join(DEFAULT_WORDS),
                   help="Comma-separated words for the word-similarity heatmap (words that are not one token "
                        f"are listed as skipped). Default: {', '.join(DEFAULT_WORDS)}")
    p.add_argument("--dict_sample", type=int, default=DICT_SAMPLE,
                   help="Tokens whose pairs give the dictionaries' positive share and input/output correlation: "
                        "all tokens (exact) when the vocabulary has no more, else a seeded sample. "
                        "Default: %(default)s")
    p.add_argument("--head_layer", type=int, default=0,
                   help="Layer whose heads' query and key weights are read on the input dictionary. "
                        "Default: %(default)s")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="Dtype the weights are loaded in (statistics are computed in float32 either way; "
                        "bfloat16 halves the memory of large models). Default: %(default)s")
    return p


def parse_args(argv=None, description: str = "") -> argparse.Namespace:
    p = build_parser(description)
    args = p.parse_args(argv)
    # (option, least value, the range to give); the upper bounds (vocabulary, layers, context) are checked once
    # the model is known (research.inspection.tour.check_arguments)
    for name, least, give in (("batch", 1, "1 or more windows"), ("seq_len", 2, "2 or more tokens per window"),
                              ("max_tokens", 2, "2 or more: the tour compares tokens with each other"),
                              ("top_k", 1, "1..the model's vocabulary size"),
                              ("dict_sample", 3, "3 or more tokens"), ("head_layer", 0, "0..layers - 1"),
                              ("seed", 0, "0 or more (numpy takes no negative seed)")):
        if getattr(args, name) < least:
            p.error(f"--{name} {getattr(args, name)}: give {give}")
    if args.layer is not None and args.layer < 0:
        p.error(f"--layer {args.layer}: give 0..layers - 1")
    return args


def _inspect(args, out: Path, written: list[Path]) -> int:
    refuse_foreign(out, "inspect", "inspect_pretrained.py")
    model, tokenizer, adapter = load_model(args.model, args.dtype, args.cache_dir)
    check_arguments(adapter, args.top_k, args.layer, args.head_layer, args.dict_sample)
    ids, text = None, None
    if args.prompt is None:
        seq_len = args.seq_len
        if adapter.context is not None and seq_len > adapter.context:
            seq_len = adapter.context
            print(f"note: --seq_len {args.seq_len} is more than the model's context ({adapter.context_name} = "
                  f"{adapter.context}): windows of {seq_len} tokens are used", file=sys.stderr)
        ids, text = text_batch(tokenizer, args.text, args.batch, seq_len, args.seed)
    result = inspect_model(adapter, tokenizer, args.prompt, ids=ids, text=text,
                           positions=args.positions, top_k=args.top_k,
                           heatmap_layer=args.layer, max_tokens=args.max_tokens,
                           words=[w.strip() for w in args.words.split(",") if w.strip()],
                           dict_sample=args.dict_sample, head_layer=args.head_layer)
    report = out / REPORT_FILE
    out.mkdir(parents=True, exist_ok=True)
    save_results(out / INSPECT_FILE, result)  # atomic; NaN (e.g. a 2-token prompt) written as null
    written.append(out / INSPECT_FILE)
    drawn = figures.figures(result)  # the figures, report.md placing them, and report.html beside it (one write)
    write_outputs(out, {**drawn, REPORT_FILE: with_figures(figures.report(result), drawn)})
    print(f"sink rate {result['attention']['sink_rate']:.3f}; params {result['params']['total']:,}; "
          f"wrote {out / INSPECT_FILE}, {report} and figures in {result['time_s']:.1f} s")
    return 0


def main(argv=None, description: str = "") -> int:
    args = parse_args(argv, description)
    out = Path(args.out) if args.out else Path("research_results/inspect") / re.sub(r"[^\w.-]+", "_",
                                                                                     args.model.strip("/"))
    written: list[Path] = []
    try:
        return _inspect(args, out, written)
    except KeyboardInterrupt:
        kept = (f"kept {written[0]}; the figures and report.md may be missing: run again" if written
                else "nothing was written")
        raise Interrupted(f"interrupted; {kept}") from None
