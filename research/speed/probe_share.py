"""The key probe's share of one run of the default study (python research/qk_norm_25m_study.py), and its cost in
forward passes.

    python -m research.speed.probe_share                      # the QK condition, seed 0, the whole run
    python -m research.speed.probe_share --steps 49 --repeats 3
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from utils.cli import ArgumentParser, command, count, positive_int

import torch

from configs import apply_overrides
from data import prepare_data, resolve_offline
from research.probing import probe as probe_module
from research.probing.callback import run_callbacks
from research.probing.probe import KeyProbe, measuring
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


# The probe's metric functions, by the names research.probing.probe calls them (those it has are timed).
METRIC_FUNCTIONS = ("key_moments", "divided_moments", "key_eigvals", "key_metrics", "key_rank", "rotary_use",
                    "logit_pair_shares", "pre_gain_keys", "attention_metrics", "attention_record", "gate_metrics",
                    "gamma_stats", "lists_and_means", "layer_means")
REST = "forward and the rest"  # the hooked forward, the hooks and the glue: the probe's time less its metrics


@contextmanager
def timing_metrics(spent: dict[str, float]) -> Iterator[None]:
    """research.probing.probe's metric functions wrapped to add their seconds to spent[name]; put back after."""
    originals = {n: getattr(probe_module, n) for n in METRIC_FUNCTIONS if hasattr(probe_module, n)}

    def timed(name: str, fn: Callable) -> Callable:
        def call(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return call
    try:
        for name, fn in originals.items():
            setattr(probe_module, name, timed(name, fn))
        yield
    finally:
        for name, fn in originals.items():
            setattr(probe_module, name, fn)


def _seconds(fn: Callable[[], object], device: torch.device, clock: Callable[[], float] = time.perf_counter) -> float:
    t = clock()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return clock() - t


THREADS = (1, 2)  # the thread counts the probe's cost is printed at


def cost_by_threads(model: torch.nn.Module, probe: KeyProbe, repeats: int = 5) -> dict[str, dict[str, float]]:
    """{threads: {"forward_passes", "forward_passes_cpu"}} for each of THREADS: the probe of its batch over the
    plain forward, in wall time and in this process's CPU time (steadier on a busy host; at 2 threads it counts
    both threads' work, their waiting included), median of `repeats` each, alternated; the threads put back."""
    device, ids = next(model.parameters()).device, probe.ids.to(next(model.parameters()).device)

    def forward() -> None:
        with torch.no_grad(), measuring(model, device, probe.precision):
            model.hidden(ids)
    probing = lambda: probe.measure(model)  # noqa: E731
    before, out = torch.get_num_threads(), {}
    try:
        for n in THREADS:
            torch.set_num_threads(n)
            forward(), probing()
            times: dict[str, list[float]] = {"wall_f": [], "wall_p": [], "cpu_f": [], "cpu_p": []}
            for _ in range(repeats):
                for kind, clock in (("wall", time.perf_counter), ("cpu", time.process_time)):
                    times[f"{kind}_f"].append(_seconds(forward, device, clock))
                    times[f"{kind}_p"].append(_seconds(probing, device, clock))
            med = {k: statistics.median(v) for k, v in times.items()}
            out[str(n)] = {"forward_passes": med["wall_p"] / med["wall_f"],
                           "forward_passes_cpu": med["cpu_p"] / med["cpu_f"], "forward_s": med["wall_f"]}
    finally:
        torch.set_num_threads(before)
    return out


def threads_line(by_threads: dict[str, dict[str, float]]) -> str:
    """The probe's cost in plain forwards at each thread count, wall and CPU time."""
    return "probe cost: " + "; ".join(f"{n} thread{'s' * (n != '1')} {c['forward_passes']:.2f} forward passes (CPU "
                                      f"time {c['forward_passes_cpu']:.2f})" for n, c in by_threads.items())


def probe_cost(model: torch.nn.Module, probe: KeyProbe, repeats: int = 5) -> dict:
    """The probe of its batch against the model's plain no-grad forward of that batch (model.hidden, what the probe
    runs with its hooks; no hooks, eval mode, the probe's precision, the process's threads), alternated after a
    warm-up of each, median of `repeats` each; then `repeats` probes with their metric functions timed."""
    device = next(model.parameters()).device
    ids = probe.ids.to(device)

    def forward() -> None:
        with torch.no_grad(), measuring(model, device, probe.precision):
            model.hidden(ids)
    probing = lambda: probe.measure(model)  # noqa: E731
    forward(), probing()
    times: dict[str, list[float]] = {"forward": [], "probe": []}
    for _ in range(repeats):
        times["forward"].append(_seconds(forward, device))
        times["probe"].append(_seconds(probing, device))
    spent: dict[str, float] = {}
    with timing_metrics(spent):
        whole = sum(_seconds(probing, device) for _ in range(repeats))
    by_metric = {name: s / repeats for name, s in sorted(spent.items(), key=lambda kv: -kv[1])}
    by_metric[REST] = whole / repeats - sum(by_metric.values())
    fwd, prb = statistics.median(times["forward"]), statistics.median(times["probe"])
    return {"forward_s": fwd, "probe_s": prb, "forward_passes": prb / fwd, "repeats": repeats, "times_s": times,
            "by_metric_s": by_metric}


def timed_run(cfg, data, probe: bool, cost: bool = False) -> dict:
    """Seconds of fit() (the loop, probes and checkpoints) and, with the probe, of its callback; with `cost` also
    probe_cost on the trained model."""
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
    result = {"total_s": total, "train_s": summary["wall_time_s"], "probe_s": sum(c.spent for c in timed),
              "probes": probes}
    if probe and cost:
        key_probe = next(c.inner.probe for c in timed if hasattr(c.inner, "probe"))
        result["cost"] = probe_cost(trainer.model, key_probe)
        result["cost"]["by_threads"] = cost_by_threads(trainer.model, key_probe)
    return result


def final_line(forward_passes: float, share: float) -> str:
    """The line the output ends with: the probe's cost in forward passes and the callback's share of the run."""
    return f"probe: {forward_passes:.2f} forward passes, {100 * share:.1f}% of the run"


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
Trains the study's run config (research.studies.runner: the tiny preset on CPU, its tokens and probe_every) with
the probe callback, timing every call of the callback inside the same run, so the share (callback time / whole
loop) is relative and robust to the host's speed; then the same config without the probe as a check (the two
totals differ by about the callback time). `--repeats` alternates the two; min and median are printed.
`--steps N` cuts the run after N steps and keeps the full run's probe_every. Data are prepared as the study
prepares them (cached after the first time), outside the timings.

After the first run with the probe, on its trained model in the same process and threads: the probe of its batch
(KeyProbe.measure, no loss) against the model's plain forward of that batch (no hooks, eval mode, the probe's
precision), alternated, median of 5 each; then 5 more probes with the probe's metric functions timed one by one
(the rest is the hooked forward and the glue); then the probe against the plain forward at 1 and at 2 threads, in
wall and CPU time. Prints one JSON object, the probe's cost at 1 and 2 threads, its time by metric, and last the
line `probe: X forward passes, Y% of the run` (X the probe over the plain forward, Y the callback's median share
of the run).
"""


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=DESCRIPTION)
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
    for i in range(args.repeats):
        runs["probe"].append(timed_run(cfg, data, probe=True, cost=i == 0))
        runs["no_probe"].append(timed_run(cfg, data, probe=False))
    cost = runs["probe"][0].pop("cost")
    shares = [r["probe_s"] / r["total_s"] for r in runs["probe"]]
    stats = lambda xs: {"min": min(xs), "median": statistics.median(xs)}  # noqa: E731
    print(json.dumps({
        "condition": args.condition, "preset": cfg.preset, "steps": cfg.steps, "probe_every": cfg.probe.probe_every,
        "tokens_per_step": cfg.tokens_per_step, "repeats": args.repeats, "threads": torch.get_num_threads(),
        "probe_precision": cfg.probe.probe_precision, "probe_batch": cfg.probe.probe_batch,
        "with_probe_s": stats([r["total_s"] for r in runs["probe"]]),
        "probe_callback_s": stats([r["probe_s"] for r in runs["probe"]]),
        "train_steps_s": stats([r["train_s"] for r in runs["probe"]]),
        "without_probe_s": stats([r["total_s"] for r in runs["no_probe"]]),
        "per_probe_s": stats([r["probe_s"] / r["probes"] for r in runs["probe"]]),
        "probe_share": stats(shares), "probe_cost": cost, "runs": runs}, indent=1))
    print(threads_line(cost["by_threads"]))
    print(f"the probe by metric, a probe (plain forward {1e3 * cost['forward_s']:.1f} ms, probe "
          f"{1e3 * cost['probe_s']:.1f} ms):")
    for name, s in cost["by_metric_s"].items():
        print(f"  {name:<22} {1e3 * s:8.1f} ms  {s / cost['forward_s']:5.2f} forward passes")
    print(final_line(cost["forward_passes"], statistics.median(shares)))

if __name__ == "__main__":
    main()
