"""The fine-tuning study (research/finetune_keys_study.py): fine-tune a pretrained QK-norm model with transformers'
Trainer, q/k norm gains trained or frozen, probing its keys; then decide and draw through the registry of study
kinds (kind 'finetune').

    main(argv, description)   # what the script runs: parse, hand every condition x seed to the executor of every
                              # study's runs (research.studies.executors: finished runs kept, in this process or on
                              # Ray), write study.json, then research.studies.render draws its figures and report.md;
                              # with --until_decided, round after round (research.studies.looks)
"""
from __future__ import annotations

import argparse
import functools
import math
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from research.analysis.finetune import CONDITIONS, FROZEN
from research.analysis.rules import LOSS_MARGIN, MARGIN, check_margin
from research.analysis.sequential import family_record
from research.access import InspectError
from research.access.loading import CACHE_HELP, DEFAULT_CACHE, is_own_run, load_model
from research.inspection.text import ENGLISH, Documents, starts_with_bos, text_documents, text_windows
from research.probing.hf import HFKeyProbe, KeyProbeCallback, model_config
from research.results import load_results
from research.results.layout import condition_dir, write_study_index
from research.results.vocabulary import RESULTS_FILE, STUDY_INDEX
from research.studies.kinds import KINDS
from research.studies.render import render_study
from research.studies.study_runs import StudyRun, Train
from research.studies.executors import ExecuteOptions, add_ray_args, check_ray_options, execute
from research.studies.hosts import add_hosts_args, check_hosts
from research.studies.looks import Rounds, add_until_args, check_until, run_looks
from utils.cli import ArgumentParser
from utils.compare import differences
from utils.errors import ConfigError, Interrupted
from utils.lock import FolderLock
from utils.owners import refuse_foreign
from utils.runtime import Runtime, provenance, resolve_runtime, this_host_kind

STUDY = "finetune_keys_study"
DEFAULT_MODEL = "gemma3-270m"
DEFAULT_OUT = f"research_results/{STUDY}"
HELD_OUT = 0.1  # share of the corpus's documents kept out of training: the probe batch comes from them


def build_parser(description: str = "") -> ArgumentParser:
    outputs = textwrap.fill(f"Writes into --out: {STUDY_INDEX}, <condition>/seed_<s>/{RESULTS_FILE}, "
                            f"{', '.join(KINDS['finetune'].outputs(list(CONDITIONS)))}.", 100, break_on_hyphens=False)
    p = ArgumentParser(description=f"{description.rstrip()}\n\n{outputs}")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="The pretrained model: a packaged name, a GGUF file, a Hugging Face folder or a hub id, of a "
                        "family with q/k norms. Default: %(default)s")
    p.add_argument("--tokens", type=int, default=24_576,
                   help="Training tokens per run (rounded down to whole steps). Default: %(default)s (24 steps of 8 x "
                        "128), about 4 minutes per run of Gemma 3 270M on 2 CPU cores in bf16")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                   help="Seeds (data order); every condition runs each, paired by seed. Default: 0 1 2")
    p.add_argument("--probe_every", type=int, default=None,
                   help="Optimizer steps between probes (also at step 0 and the last step). Default: a quarter of the "
                        "steps")
    p.add_argument("--batch_size", type=int, default=8, help="Sequences per optimizer step. Default: %(default)s")
    p.add_argument("--seq_len", type=int, default=128, help="Tokens per sequence. Default: %(default)s")
    p.add_argument("--lr", type=float, default=1e-4,
                   help="Peak AdamW learning rate (linear warmup over 10%% of the steps, then linear decay; no "
                        "weight decay, so a frozen and a trained gain differ only by training). Default: %(default)s")
    p.add_argument("--probe_batch", type=int, default=8,
                   help="Held-out windows in the probe batch (--seq_len tokens each). Default: %(default)s")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda[:N]. Default: auto")
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                   help="Training precision: bf16 autocast or fp32; auto: bf16 on CUDA and on CPUs with native bf16. "
                        "The probe measures in fp32. Default: auto")
    p.add_argument("--margin", type=float, default=MARGIN,
                   help="Equivalence margin of key metrics, a share of the compared values' mean (docs/decisions.md). "
                        "Default: %(default)s")
    p.add_argument("--loss_margin", type=float, default=LOSS_MARGIN,
                   help="Equivalence margin of losses, as --margin is of key metrics. Default: %(default)s")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help="Study folder the runs, figures and report are written into. Default: %(default)s")
    p.add_argument("--cache_dir", default=DEFAULT_CACHE, help=CACHE_HELP)
    p.add_argument("--no_progress", action="store_true", help="Log lines only, no progress bars")
    add_until_args(p)
    add_hosts_args(p)
    add_ray_args(p)
    return p


def parse_args(argv=None, description: str = "") -> argparse.Namespace:
    p = build_parser(description)
    args = p.parse_args(argv)
    for name in ("tokens", "batch_size", "probe_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name} {getattr(args, name)}: give 1 or more")
    if args.seq_len < 8:
        p.error(f"--seq_len {args.seq_len}: give 8 or more tokens")
    if args.probe_every is not None and args.probe_every < 1:
        p.error(f"--probe_every {args.probe_every}: give 1 or more optimizer steps")
    if not math.isfinite(args.lr) or args.lr <= 0:
        p.error(f"--lr {args.lr}: give a positive learning rate")
    if len(set(args.seeds)) < len(args.seeds) or min(args.seeds) < 0:
        p.error(f"--seeds {' '.join(map(str, args.seeds))}: give distinct seeds >= 0")
    for name in ("margin", "loss_margin"):
        try:
            check_margin(f"--{name}", getattr(args, name))
        except ValueError as e:
            p.error(str(e))
    steps = args.tokens // (args.batch_size * args.seq_len)
    if steps < 1:
        p.error(f"--tokens {args.tokens} is less than one step of {args.batch_size} x {args.seq_len} tokens")
    path = Path(args.model).expanduser()
    if path.is_dir() and is_own_run(path):
        p.error(f"--model {args.model}: a training folder of this project; export it first (python "
                f"research/export_hf.py {args.model} OUT) and pass OUT")
    if len(args.seeds) < 2:
        print("note: with one seed nothing is tested: the report is descriptive", file=sys.stderr)
    return args


def split_corpus(docs: Documents, held_out: float = HELD_OUT) -> tuple[Documents, Documents]:
    """(training documents, held-out documents): a fixed shuffle (seed 0) of the documents, its first share held
    out, so every run and every seed probes the same text and never trains on it."""
    order = np.random.default_rng(0).permutation(len(docs.texts))
    n = max(1, int(len(order) * held_out))
    pick = lambda ix, what: Documents([docs.texts[i] for i in ix], f"{docs.name} ({what})", docs.sha256,
                                      docs.description)
    return pick(order[n:], "training documents"), pick(order[:n], "held-out documents")


def training_blocks(tokenizer, docs: Documents, seq_len: int, n_blocks: int) -> torch.Tensor:
    """[N, seq_len] token blocks of the training documents in their order, each document ending with EOS (and
    starting with BOS where the tokenizer puts one first): a pool four times what a run needs (or the whole
    corpus), from which each seed draws its own order."""
    bos, eos = starts_with_bos(tokenizer), getattr(tokenizer, "eos_token_id", None)
    want = 4 * n_blocks * seq_len
    stream: list[int] = []
    for text in docs.texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        stream += ([bos] if bos is not None else []) + ids + ([eos] if eos is not None else [])
        if len(stream) >= want:
            break
    n = len(stream) // seq_len
    if n < n_blocks:
        raise InspectError(f"the training documents hold {len(stream):,} tokens: {n} blocks of {seq_len}, {n_blocks} "
                           f"needed; pass fewer --tokens or a shorter --seq_len")
    return torch.tensor(stream[:n * seq_len], dtype=torch.long).view(n, seq_len)


class Blocks(torch.utils.data.Dataset):
    """Token blocks as the Trainer's causal-LM examples (labels = inputs; the model shifts them)."""

    def __init__(self, blocks: torch.Tensor):
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def set_trainable(model, condition: str) -> dict[str, int]:
    """Freeze the embeddings (both conditions) and, for gains_frozen, the q/k norm gains; returns the counts of
    trainable and frozen parameters. InspectError for a model without q/k norm gains."""
    emb = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    gains = [p for n, p in model.named_parameters() if n.endswith(("q_norm.weight", "k_norm.weight"))]
    if not gains:
        raise InspectError(f"{type(model).__name__} has no q_norm / k_norm gains: the two conditions would be the same "
                           f"model; pass a QK-norm model (Gemma 3, Qwen3, OLMo 2, Apertus), e.g. {DEFAULT_MODEL}")
    frozen = {id(p) for p in gains} if condition == FROZEN else set()
    counts = {"trainable": 0, "frozen": 0}
    for p in model.parameters():
        train = id(p) not in emb and id(p) not in frozen
        p.requires_grad_(train)
        counts["trainable" if train else "frozen"] += p.numel()
    return counts


def run_record(args, model: dict, counts: dict, seed: int, steps: int, every: int, precision: str, data: dict,
               probe_ids: torch.Tensor) -> dict:
    """What a run of one condition at `seed` records of its config, model and data (its results.json's "config"
    and "data"): what a run found in the folder must equal to be kept. `model` (condition_model) and `counts`
    (set_trainable's): the condition's."""
    return {"config": {"model": model,
                       "train": {"seed": seed, "lr": args.lr, "steps": steps, "batch_size": args.batch_size,
                                 "seq_len": args.seq_len, "precision": precision, "corpus": data["corpus"],
                                 "trainable_params": counts["trainable"], "frozen_params": counts["frozen"]},
                       "probe": {"every": every, "probe_batch": int(probe_ids.shape[0])}},
            "data": {**data, "probe_batch_sha256": HFKeyProbe(probe_ids).batch_sha256,
                     "probe_batch": list(probe_ids.shape)}}


def condition_model(adapter) -> dict:
    """The model as a run records it, once set_trainable has set its condition (its q/k norm kind follows it)."""
    return {**model_config(adapter), "source": adapter.source}


def kept(path: Path, asked: dict, steps: int) -> bool:
    """Whether the run at `path` (its results.json) is finished and kept: False where there is none or it stopped
    before its last probe (it is trained again from step 0); ConfigError where its recorded config, model or
    data differ from `asked` (run_record), naming each differing field with both values (utils.compare, the
    comparison the catalog studies' resumes make), so that a study never mixes runs of two settings."""
    if not path.is_file():
        return False
    res = load_results(path)  # a damaged file is no finished run: ResultsError says so
    diffs = differences({"config": res.get("config") or {}, "data": res.get("data") or {}}, asked, only_asked=True)
    if diffs:
        raise ConfigError(f"{path.parent} holds a run of other settings ({'; '.join(diffs)}): a study keeps only "
                          f"runs of the settings asked. Pass the options it ran with, or another --out (or move "
                          f"{path.parent} away to train it again); nothing was written")
    return res["steps"][-1:] == [steps]


def train_one(args, condition: str, seed: int, run_dir: Path, pool: torch.Tensor, probe_ids: torch.Tensor,
              steps: int, every: int, runtime: Runtime, data: dict, log=print) -> None:
    """Fine-tune one condition at one seed with transformers' Trainer and the key probe."""
    from transformers import PrinterCallback, Trainer, TrainingArguments, set_seed
    from transformers.utils import logging as hf_logging
    model, _, adapter = load_model(args.model, "float32", args.cache_dir, lambda *a: None, progress=False)
    counts = set_trainable(model, condition)
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(pool))[:steps * args.batch_size])
    results = run_dir / RESULTS_FILE
    if results.exists():  # an unfinished run of an earlier start, of the same settings: trained again from step 0
        results.unlink()
    device, precision = runtime.device, runtime.precision
    record = run_record(args, condition_model(adapter), counts, seed, steps, every, precision, data, probe_ids)
    header = {"seed": seed, "provenance": {**provenance(device), "train_precision": precision},
              "data": data, "config": record["config"]}
    callback = KeyProbeCallback(results, probe_ids, every=every, tag=condition, header=header)
    targs = TrainingArguments(
        output_dir=str(run_dir / "trainer"), max_steps=steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, lr_scheduler_type="linear", warmup_steps=max(1, steps // 10), weight_decay=0.0,
        logging_steps=every, save_strategy="no", report_to=[], seed=seed, data_seed=seed,
        bf16=precision == "bf16", use_cpu=device.type == "cpu", include_num_input_tokens_seen=True,
        disable_tqdm=args.no_progress, dataloader_num_workers=0,
        train_sampling_strategy="sequential")  # the seed's own order (Blocks below), the same for both conditions
    set_seed(seed)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the Trainer's own info lines; its progress bar stays
    try:
        t0 = time.perf_counter()
        trainer = Trainer(model=model, args=targs, train_dataset=Blocks(pool[order]), callbacks=[callback])
        trainer.remove_callback(PrinterCallback)  # its dict per log; the summary line below says what matters
        trainer.train()
    finally:
        hf_logging.set_verbosity(verbosity)
    res = load_results(results)
    log(f"{condition} seed {seed}: {steps} steps in {time.perf_counter() - t0:.0f} s; val loss "
        f"{res['init_val_loss']:.3f} -> {res['val_loss'][-1]:.3f}, mean key PR {res['mean_pr'][0]:.2f} -> "
        f"{res['mean_pr'][-1]:.2f}")


def train_run(args, pool: torch.Tensor, probe_ids: torch.Tensor, steps: int, every: int, data: dict,
              run: StudyRun[dict], runtime: Runtime | None) -> None:
    """The study's train function (research.studies.study_runs.Train, with its first six arguments given): train_one
    on the study's runtime in this process, or (runtime None: a Ray task) on this worker's device and precision with
    no progress bar."""
    if runtime is None:
        args = argparse.Namespace(**{**vars(args), "no_progress": True})
        runtime = resolve_runtime(args.device, args.precision)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    train_one(args, run.cond, run.seed, run.run_dir, pool, probe_ids, steps, every, runtime, data)


def study_runs(args, out: Path, steps: int, every: int, runtime: Runtime,
               log=print) -> tuple[Callable[[list[int]], list[StudyRun[dict]]], Train]:
    """The runs of any seeds (seed by seed, each condition) with the record each must hold to be kept (run_record),
    and the train function: the model is loaded once to count each condition's parameters (set_trainable refuses one
    without q/k norm gains before any training), the corpus split, the probe batch and the pool of training blocks
    made."""
    model, tokenizer, adapter = load_model(args.model, "float32", args.cache_dir, log, progress=not args.no_progress)
    counts, models = {}, {}  # each condition's, as its runs record them
    for c in CONDITIONS:
        counts[c] = set_trainable(model, c)
        models[c] = condition_model(adapter)
    adapter.check_window(args.seq_len)  # the training blocks and the probe batch: as every study checks
    del model
    docs = text_documents(ENGLISH)
    train_docs, held = split_corpus(docs)
    probe_ids = text_windows(tokenizer, held, args.probe_batch, args.seq_len, seed=0)
    pool = training_blocks(tokenizer, train_docs, args.seq_len, steps * args.batch_size)
    data = {"corpus": docs.name, "corpus_sha256": docs.sha256, "held_out_documents": len(held.texts),
            "probe_documents": held.picked, "pool_blocks": len(pool)}
    log(f"{args.model}: {steps} steps of {args.batch_size} x {args.seq_len} tokens per run, probes every "
        f"{every} steps on {args.probe_batch} held-out windows; {runtime.precision} on {runtime.device}; "
        f"conditions {', '.join(CONDITIONS)} x seeds {' '.join(map(str, args.seeds))}")
    def runs(seeds: list[int]) -> list[StudyRun[dict]]:
        return [StudyRun(c, seed, run_record(args, models[c], counts[c], seed, steps, every, runtime.precision, data,
                                             probe_ids), condition_dir(out, c, seed, len(seeds) > 1))
                for seed in seeds for c in CONDITIONS]
    return runs, functools.partial(train_run, args, pool, probe_ids, steps, every, data)


def main(argv=None, description: str = "") -> int:
    args = parse_args(argv, description)
    out = Path(args.out)
    try:
        refuse_foreign(out, "finetune", "finetune_keys_study.py")  # its own study.json is no other's
        until = check_until(args, KINDS["finetune"], list(args.seeds), STUDY)
        storage = check_ray_options(args, STUDY, "finetune", out)
        runtime = resolve_runtime(args.device, args.precision)  # once for the process: every run uses it
        mix_hosts = check_hosts(out, this_host_kind(runtime.device), runtime.precision, args.mix_hosts)
        steps = args.tokens // (args.batch_size * args.seq_len)
        every = args.probe_every or max(1, steps // 4)
        with FolderLock(out, hint="pass another --out"):
            t0 = time.perf_counter()
            runs_of, train = study_runs(args, out, steps, every, runtime)
            options = ExecuteOptions.from_args(args, runtime, storage, on_cpu=runtime.device.type == "cpu")

            def train_runs(runs: list[StudyRun[dict]], done: set) -> None:  # a round's new runs, together
                execute(runs, out, train, options,  # kept: asked of all before any trains
                        finished=lambda run: run.run_dir in done or kept(run.run_dir / RESULTS_FILE, run.cfg, steps))

            def write_index(seeds: list[int], conditions: dict, looks: list[dict], design: dict | None) -> None:
                write_study_index(out, name=STUDY, kind="finetune", seeds=seeds, preset=None, conditions=conditions,
                                  margin=args.margin, loss_margin=args.loss_margin, looks=looks, design=design,
                                  mix_hosts=mix_hosts)
            family = family_record(CONDITIONS, margin=args.margin, loss_margin=args.loss_margin)
            run_looks(out, list(args.seeds), until, Rounds(runs_of, train_runs, write_index, family))
        written = render_study(out)
        print(f"wrote {', '.join(p.name for p in written)} into {out} ({time.perf_counter() - t0:.0f} s in all)")
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; finished runs are kept in {out}: run the same command again to "
                          f"continue") from None
    return 0
