"""The key probe's share of one run of the default study (python research/qk_norm_25m_study.py).

    python -m research.speed.probe_share                      # the QK condition, seed 0, the whole run
    python -m research.speed.probe_share --steps 49 --repeats 3

Trains the study's run config (research.studies.runner: the tiny preset on CPU, its tokens and probe_every) with
the probe callback, timing every call of the callback inside the same run, so the share (callback time / whole
loop) is relative and robust to the host's speed; then the same config without the probe as a check (the two
totals differ by about the callback time). `--repeats` alternates the two; min and median are printed.
`--steps N` cuts the run after N steps and keeps the full run's probe_every. Data are prepared as the study
prepares them (cached after the first time), outside the timings. Prints one JSON object.
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from utils.cli import ArgumentParser, command, count, positive_int

from configs import apply_overrides
from data import prepare_data, resolve_offline
from research.probing.callback import run_callbacks
from research.results.vocabulary import RESULTS_FILE
from research.studies import QK_NORM
from research.studies.runner import base_config, resolve_preset, run_config
from training.trainer import Trainer


class _Timed:
    """A callback that adds the seconds its wrapped callback takes to `spent`."""

    def __init__(self, inner):
        self.inner, self.name, self.spent = inner, inner.name, 0.0

    def __call__(self, info) -> None:
        t = time.perf_counter()
        self.inner(info)
        self.spent += time.perf_counter() - t

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)


def study_run_config(condition: str, steps: int | None, device: str):
    """The default study's config of one condition, seed 0; cut to `steps` with the full run's probe_every."""
    preset = resolve_preset("auto", device, QK_NORM.gpu_preset)
    cfg = run_config(base_config(QK_NORM, preset, {"device": device}), QK_NORM.conditions[condition], 0)
    if steps:
        cfg = apply_overrides(cfg, {"tokens": steps * cfg.tokens_per_step, "probe_every": cfg.probe.probe_every})
    return cfg


def timed_run(cfg, data, probe: bool) -> dict:
    """Seconds of fit() (the loop, probes and checkpoints) and, with the probe, of its callback."""
    timed: list[_Timed] = []

    def callbacks(used_cfg, used_data, device):
        timed.extend(_Timed(c) for c in run_callbacks(used_cfg, used_data, out, device))
        return timed
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(cfg, data, out, progress=False, log=lambda *a, **k: None,
                          callbacks=callbacks if probe else None)
        t = time.perf_counter()
        summary = trainer.fit()
        total = time.perf_counter() - t
        probes = len(json.loads((Path(out) / RESULTS_FILE).read_text())["probes"]) if probe else 0
    return {"total_s": total, "train_s": summary["wall_time_s"], "probe_s": sum(c.spent for c in timed),
            "probes": probes}


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--condition", default="QK", choices=list(QK_NORM.conditions),
                   help="The study condition to train (QK runs the gain ablation after its last step). Default: QK")
    p.add_argument("--steps", type=count, default=0,
                   help="Cut the run after this many steps (0: the whole run). Default: 0")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="Runs with and without the probe, alternated. Default: 1")
    p.add_argument("--device", default="cpu", help="Device to train on. Default: cpu (the study's tiny preset)")
    return p


@command
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    cfg = resolve_offline(study_run_config(args.condition, args.steps, args.device), log=lambda *a, **k: None)
    data = prepare_data(cfg, log=lambda *a, **k: None, progress=False)
    runs: dict[str, list[dict]] = {"probe": [], "no_probe": []}
    for _ in range(args.repeats):
        runs["probe"].append(timed_run(cfg, data, probe=True))
        runs["no_probe"].append(timed_run(cfg, data, probe=False))
    shares = [r["probe_s"] / r["total_s"] for r in runs["probe"]]
    stats = lambda xs: {"min": min(xs), "median": statistics.median(xs)}  # noqa: E731
    print(json.dumps({
        "condition": args.condition, "preset": cfg.preset, "steps": cfg.steps, "probe_every": cfg.probe.probe_every,
        "tokens_per_step": cfg.tokens_per_step, "repeats": args.repeats,
        "with_probe_s": stats([r["total_s"] for r in runs["probe"]]),
        "probe_callback_s": stats([r["probe_s"] for r in runs["probe"]]),
        "train_steps_s": stats([r["train_s"] for r in runs["probe"]]),
        "without_probe_s": stats([r["total_s"] for r in runs["no_probe"]]),
        "per_probe_s": stats([r["probe_s"] / r["probes"] for r in runs["probe"]]),
        "probe_share": stats(shares), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
