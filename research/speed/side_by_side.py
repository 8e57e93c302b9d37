"""A study's runs on a small CPU host two ways: one after another in the study's process on every core it may use
(the default), or side by side with --parallel P (each run in a worker process of its own, pinned to its share of
the cores: on 2 cores, two runs of one thread each).

    python -m research.speed.side_by_side                      # the default study's first 2 runs, 40 steps each
    python -m research.speed.side_by_side --runs 4 --steps 100 --repeats 2
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from utils.cli import ArgumentParser, command, positive_int

from configs import ConfigError, apply_overrides
from data import prepare_data, resolve_offline
from research.studies import QK_NORM
from research.studies.executors import ExecuteOptions, execute
from utils.runtime import usable_cores
from research.studies.runner import base_config, resolve_preset, study_runs, train_study_run
from utils.runtime import local_cpu_threads, resolve_runtime


def study_base(steps: int, precision: str):
    """The default study's shared config on CPU in `precision`, cut to `steps` steps with the full run's
    probe_every."""
    preset = resolve_preset("auto", "cpu", QK_NORM.gpu_preset)
    base = base_config(QK_NORM, preset, {"device": "cpu", "precision": precision})
    return apply_overrides(base, {"tokens": steps * base.tokens_per_step, "probe_every": base.probe.probe_every})


def timed_way(base, n_runs: int, parallel: int, threads: int = 0) -> tuple[float, list[list[float]]]:
    """Wall seconds to train the study's first `n_runs` runs with `parallel` at a time (1: in this process, on
    `threads`, 0: the cores), in a fresh folder, and each run's training losses."""
    base = apply_overrides(base, {"threads": threads})
    runtime = resolve_runtime("cpu", base.train.precision)
    train = functools.partial(train_study_run, progress=False, replan_schedule=False, logger="none",
                              divergence_is_a_result=False)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        seeds = list(range(-(-n_runs // len(QK_NORM.conditions))))
        runs = study_runs(QK_NORM, base, seeds, out)[:n_runs]
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # the runs' own lines
            execute(runs, out, train, ExecuteOptions(runtime, parallel=parallel))
        wall = time.perf_counter() - start
        losses = [[json.loads(ln)["loss"] for ln in (r.run_dir / "metrics.jsonl").read_text().splitlines()
                   if '"loss"' in ln] for r in runs]
    return wall, losses


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
Builds the default study's runs (research/qk_norm_25m_study.py: the tiny preset on CPU, seed by seed, each
condition; the first `--runs`), cut to `--steps` steps with the full run's probe_every, prepares their data once
(outside the timings), then trains them through the study executor (research.studies.executors.execute) both ways,
alternated `--repeats` times, each time in fresh folders: the wall time of each way (workers' start-up included),
the runs' tokens/s, the ratio, the load average before and after, and whether both ways gave the same training
losses bit for bit (a run on one thread against the same run on several may differ in the last bits). Prints one
JSON object.
"""


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=DESCRIPTION)
    p.add_argument("--runs", type=positive_int, default=2, help="Runs of the study to train each way. Default: 2")
    p.add_argument("--steps", type=positive_int, default=40, help="Steps of each run. Default: 40")
    p.add_argument("--parallel", type=positive_int, default=2,
                   help="Runs side by side in the second way. Default: 2")
    p.add_argument("--threads", type=int, default=0,
                   help="Threads of the runs one after another (0: the cores this process may use). Default: 0")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"),
                   help="Precision of every run (auto: bf16 where the CPU has it natively, else fp32). Default: auto")
    p.add_argument("--repeats", type=positive_int, default=1, help="Times each way is timed, alternated. Default: 1")
    return p


@command
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.parallel > usable_cores():
        raise ConfigError(f"--parallel {args.parallel}: this process may use {usable_cores()} core(s): give "
                          f"at most that many")
    base = study_base(args.steps, args.precision)
    prepare_data(resolve_offline(base, log=lambda *a, **k: None), log=lambda *a, **k: None, progress=False)
    load_before = os.getloadavg()
    walls: dict[str, list[float]] = {"one_after_another": [], "side_by_side": []}
    losses = {}
    for _ in range(args.repeats):
        for way, parallel in (("one_after_another", 1), ("side_by_side", args.parallel)):
            wall, losses[way] = timed_way(base, args.runs, parallel, args.threads if parallel == 1 else 0)
            walls[way].append(wall)
            print(f"{way}: {wall:.1f} s (load average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    tokens = args.runs * base.steps * base.tokens_per_step
    median = {way: statistics.median(w) for way, w in walls.items()}
    print(json.dumps({
        "preset": base.preset, "precision": resolve_runtime("cpu", base.train.precision).precision,
        "runs": args.runs, "steps": base.steps, "tokens": tokens, "cores": usable_cores(),
        "threads_one_after_another": args.threads or local_cpu_threads(1),
        "parallel": args.parallel, "repeats": args.repeats, "wall_s": walls,
        "tokens_per_s": {way: tokens / m for way, m in median.items()},
        "side_by_side_speedup": median["one_after_another"] / median["side_by_side"],
        "same_losses_bit_for_bit": losses["one_after_another"] == losses["side_by_side"],
        "max_relative_loss_difference": max(abs(a - b) / abs(b) for x, y in zip(*losses.values())
                                            for a, b in zip(x, y)),
        "load_average_before": load_before, "load_average_after": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
