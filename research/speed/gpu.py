"""The training step of a preset on CUDA, as training runs it: the Trainer's own step (regional compile,
bf16 autocast, fused AdamW, the chunked loss, checkpointing as configured) on random tokens, with
tokens/s, MFU against the measured bf16 matmul ceiling, Muon's share, peak memory and the probe's cost.

    python -m research.speed.gpu --preset 1b --steps 10
    python -m research.speed.gpu --preset 1b --grad_checkpointing true --batch_size 4 --grad_accum 8

research/benchmark.py runs it for the 88m and 1b presets when CUDA is available.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from utils.cli import ArgumentParser, command, positive_int

import torch

from configs import PRESETS, add_config_args, apply_overrides, flops_per_token, get_preset
from configs.cli import help_defaults, start_from_args, start_in
from utils.errors import UserError

# What the measurement changes in the preset: CUDA, and no checkpoints or validation between the timed steps.
MEASURED = {"device": "cuda", "ckpt_every": 0, "eval_every": 0}
# Data fields that do not reach the measurement: it trains on random tokens of the config's vocabulary and seq_len.
RANDOM_TOKENS_IGNORE = ("source", "paths", "text_field", "hub_dataset", "hub_subset", "hub_docs", "stdlib_max_bytes",
                        "tokenizer", "offline", "offline_note", "val_frac", "cache_dir")


def bf16_ceiling(n: int = 8192, repeats: int = 10) -> float:
    """FLOP/s of an n x n x n bf16 matmul on the current GPU (mean of `repeats` after 3 warm-ups)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * repeats / (time.perf_counter() - t)


def _synthetic(cfg, folder: Path):
    from data.prepare import TokenData
    T, V = cfg.data.seq_len, cfg.model.vocab_size
    g = torch.Generator().manual_seed(0)
    blocks = lambda n: torch.randint(0, V, (n, T + 1), generator=g, dtype=torch.int32)  # noqa: E731
    return TokenData(train=blocks(4 * cfg.train.batch_size), val=blocks(max(8, cfg.probe.probe_batch)),
                     tokenizer_dir=folder, vocab_size=V, source_hash="random", tokenizer_hash="random",
                     cache_dir=folder)


def _timed(fn, times: list[float]):
    def wrapper(*args, **kwargs):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        return out
    return wrapper


def _seconds(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def measure(preset: str, steps: int, overrides: dict, ceiling: float) -> dict:
    """Median step of `steps` optimizer steps after 3 warm-up steps (the first compiles)."""
    from optimizers.muon import Muon
    from research.probing.probe import KeyProbe
    from training.trainer import Trainer

    cfg = apply_overrides(get_preset(preset), {**MEASURED, **overrides})
    with tempfile.TemporaryDirectory() as tmp:
        data = _synthetic(cfg, Path(tmp))
        torch.cuda.reset_peak_memory_stats()
        t_build = time.perf_counter()
        trainer = Trainer(cfg, data, Path(tmp) / "run", progress=False, log=lambda *a, **k: None)
        muon_s: list[float] = []
        for opt in trainer.optimizers:
            if isinstance(opt, Muon):
                opt.step = _timed(opt.step, muon_s)
        say = lambda *a: print(f"[{preset}]", *a, file=sys.stderr, flush=True)  # noqa: E731
        say(f"built in {time.perf_counter() - t_build:.1f} s; first step (compiles)...")
        first = _seconds(trainer.train_step)
        say(f"first step {first:.1f} s")
        for _ in range(2):
            trainer.train_step()
        muon_s.clear()
        torch.cuda.reset_peak_memory_stats()
        times = sorted(_seconds(trainer.train_step) for _ in range(steps))
        peak_train = torch.cuda.max_memory_allocated()
        say(f"median step {times[len(times) // 2]:.3f} s; probing...")
        probe = KeyProbe(data.val[:cfg.probe.probe_batch, :-1].long(), cfg.probe.probe_precision)
        probe(trainer.model)  # warm-up
        torch.cuda.reset_peak_memory_stats()
        probe_s = _seconds(lambda: probe(trainer.model))
        peak_probe = torch.cuda.max_memory_allocated()
    step_s = times[len(times) // 2]
    tokens = cfg.tokens_per_step
    fpt = flops_per_token(cfg.model, cfg.data.seq_len)
    every = cfg.probe.probe_every or 100
    return {"preset": preset, "overrides": overrides, "precision": trainer.precision, "compiled": trainer.compiled,
            "grad_checkpointing": cfg.train.grad_checkpointing, "batch": [cfg.train.batch_size, cfg.data.seq_len],
            "grad_accum": cfg.train.grad_accum, "params": trainer.model.num_params(), "first_step_s": first,
            "step_s": step_s, "step_range_s": [times[0], times[-1]], "tokens_per_s": tokens / step_s,
            "mfu": tokens / step_s * fpt / ceiling, "muon_share": sorted(muon_s)[len(muon_s) // 2] / step_s,
            "peak_train_gib": peak_train / 2 ** 30, "probe_s": probe_s, "peak_probe_gib": peak_probe / 2 ** 30,
            "probe_every": every, "probe_share": probe_s / (probe_s + every * step_s),
            "mfu_with_probe": tokens * every / (every * step_s + probe_s) * fpt / ceiling}


def build_parser(argv: list[str] | None = None) -> ArgumentParser:
    """The parser; its help shows the config measured: the chosen preset on CUDA without checkpoints or
    validation, with the --config file's values over it."""
    preset, file = start_in(argv, "1b")
    preset = preset if preset in PRESETS else "1b"
    defaults = help_defaults(apply_overrides(get_preset(preset), MEASURED), file)
    p = ArgumentParser(description=f"{__doc__.rstrip()}\n\nDefaults below are those measured for the {preset} "
                                   f"preset" + (f" with {file.path}" if file else "") + ".")
    p.add_argument("--steps", type=positive_int, default=10,
                   help="Timed optimizer steps, after 3 warm-up steps (the first compiles); the median is reported. "
                        "Default: %(default)s")
    add_config_args(p, defaults, default_preset="1b", file=file,
                    notes={name: "unused (the tokens are random)" for name in RANDOM_TOKENS_IGNORE})
    return p


@command
def main(argv: list[str] | None = None) -> None:
    a = build_parser(argv).parse_args(argv)
    if not torch.cuda.is_available():
        raise UserError("research.speed.gpu needs CUDA: on CPU run python research/benchmark.py")
    preset, overrides = start_from_args(a, "1b")
    ceiling = bf16_ceiling()
    result = measure(preset, a.steps, overrides, ceiling)
    result.update(device=torch.cuda.get_device_name(), bf16_tflops=ceiling / 1e12)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
