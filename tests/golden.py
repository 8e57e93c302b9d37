"""The golden run: 16 steps of the debug preset in fp32 on a corpus that is the same on every machine, whose loss
curve and probe headline at init are stored in tests/golden_debug_fp32.json and compared by
tests/training/test_golden.py, so a change that moves training or the probe is seen at once.

Regenerate (only for a change that is meant to move training, and say so in its commit):
    python -m tests.golden --write
The corpus is generated here, not read from the interpreter's standard library (which differs between Python
versions): sentences drawn from a fixed word list by a 32-bit linear congruential generator with fixed
constants, so the same bytes come out of every Python.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

GOLDEN = Path(__file__).with_name("golden_debug_fp32.json")
STEPS = 16
COMMAND = "python -m tests.golden --write"
# Headline probe metrics at init, per layer (the probe's per-layer means).
HEADLINE = ("k_norm.norm_mean", "k_norm.max_abs", "k_norm.cos_mean", "k_norm.pr_sv", "k_norm.pr_var",
            "k_norm.erank", "attn.entropy", "attn.sink_mass", "attn.logit_max")

_SUBJECTS = ("the farmer", "a child", "the old sailor", "my sister", "the teacher", "a traveller", "the miller",
             "the king", "a young doctor", "the baker", "her brother", "the captain", "a quiet girl", "the smith")
_VERBS = ("saw", "carried", "found", "painted", "lost", "mended", "sold", "built", "remembered", "followed",
          "counted", "washed", "opened", "described")
_OBJECTS = ("a red boat", "the heavy door", "an old map", "the small garden", "a letter", "the broken wheel",
            "a basket of apples", "the long road", "a silver coin", "the winter coat", "a wooden box",
            "the river bank", "a bright lamp", "the stone bridge")
_PLACES = ("in the morning", "near the harbour", "after the storm", "before dinner", "at the market",
           "under the trees", "by the fire", "on the hill", "in the village", "during the fair")
_JOINS = (" and then ", " because ", " while ", " but later ", " so ")


def _lcg(seed: int):
    x = seed
    while True:
        x = (1664525 * x + 1013904223) % 2 ** 32  # Numerical Recipes' constants
        yield x >> 8  # the low bits of a power-of-two LCG are the weakest


def golden_text(n_sentences: int = 2400, seed: int = 12345) -> str:
    """Deterministic English-like text (162,182 characters): clauses of subject, verb, object and place,
    some joined in pairs, ten sentences to a paragraph."""
    r = _lcg(seed)
    pick = lambda words: words[next(r) % len(words)]  # noqa: E731
    clause = lambda: f"{pick(_SUBJECTS)} {pick(_VERBS)} {pick(_OBJECTS)} {pick(_PLACES)}"  # noqa: E731
    sentences = []
    for i in range(n_sentences):
        s = clause() + (pick(_JOINS) + clause() if next(r) % 3 == 0 else "")
        sentences.append(s[0].upper() + s[1:] + ".")
    return "\n\n".join(" ".join(sentences[i:i + 10]) for i in range(0, n_sentences, 10)) + "\n"


def golden_run(workdir: Path) -> dict:
    """Train the golden run in workdir and return what is compared: losses, validation losses, the probe's
    headline at init, and the corpus's hash."""
    import train_llm
    from research.results import load_results
    from tests.helpers import STEP_TOKENS, losses
    corpus = workdir / "golden.txt"
    text = golden_text()
    corpus.write_text(text, encoding="utf-8")
    out = workdir / "run"
    train_llm.main(["--preset", "debug", "--source", "files", "--paths", str(corpus), "--cache_dir",
                    str(workdir / "cache"), "--precision", "fp32", "--device", "cpu", "--compile", "off",
                    "--tokens", str(STEPS * STEP_TOKENS), "--eval_batches", "2", "--eval_every", "4",
                    "--probe_every", str(STEPS), "--ckpt_every", str(STEPS), "--no_progress", "--out", str(out)])
    res = load_results(out / "results.json")
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    init = res["probes"][0]
    return {"corpus_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "loss": losses(out),
            "val_loss": {str(r["step"]): r["val_loss"] for r in rows if "val_loss" in r},
            "init_val_loss": res["init_val_loss"],
            "init_mean_pr": init["mean_pr"],
            "init_layers": [{k: layer["means"][k] for k in HEADLINE} for layer in init["layers"]]}


def _write() -> None:
    import platform
    import tempfile

    import torch

    from utils.runtime import cpu_has_native_bf16, cpu_name, git_commit
    with tempfile.TemporaryDirectory() as d:
        values = golden_run(Path(d))
    record = {"command": COMMAND, "commit": git_commit(), "torch": torch.__version__,
              "python": platform.python_version(), "cpu": cpu_name(), "cpu_native_bf16": cpu_has_native_bf16(),
              "precision": "fp32", **values}
    GOLDEN.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {GOLDEN}: {len(values['loss'])} losses, {values['loss'][0]:.6f} -> {values['loss'][-1]:.6f}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {COMMAND}")
    _write()
