"""A tiny run's training speed on a quiet host and beside one busy process, for each thread setting.

    python -m research.speed.busy_host                        # every setting, 30 steps (61,440 tokens), twice
    python -m research.speed.busy_host --settings cores auto --steps 60 --repeats 3 --json
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from utils.cli import ArgumentParser, command, positive_int

from utils.errors import UserError
from utils.threads import usable_core_ids

# setting -> (environment added to the child's, --threads: 0 follows utils.threads, -1 every core)
SETTINGS = {
    "cores": ({}, -1),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, -1),
    "spin1000": ({"GOMP_SPINCOUNT": "1000"}, -1),
    "one": ({}, 1),
    "auto": ({}, 0),
}
SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def train_speed(threads: int, steps: int, precision: str) -> dict:
    """In this process: the tiny config's training step on `threads` threads (0: utils.threads's rule, -1: every core)
    for `steps` steps after 2 warm-up steps; tokens/s over them all and the thread choice."""
    import torch

    from research.speed.measure import _stepper, configs
    from utils.runtime import resolve_precision, set_cpu_threads

    choice = set_cpu_threads(len(usable_core_ids()) if threads < 0 else threads, 1)
    prec = resolve_precision(precision, torch.device("cpu"))
    step, _, _ = _stepper("tiny", "project", prec, "off")
    _, batch, seq_len = configs()["tiny"]
    for _ in range(2):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return {"tokens_per_s": steps * batch * seq_len / (time.perf_counter() - start), "threads": choice.threads,
            "why": choice.why, "precision": prec}


def measured(setting: str, steps: int, precision: str, busy: bool) -> dict:
    """One measurement of `setting` in a fresh process, beside a spinning process on the last core where `busy`."""
    env_add, threads = SETTINGS[setting]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    env.update(env_add)
    spinner = subprocess.Popen([sys.executable, "-c", SPIN, str(usable_core_ids()[-1])]) if busy else None
    from research.speed.measure import child_json  # torch: only where a child is run
    try:
        if spinner:
            time.sleep(0.5)  # running before the child looks at the load, as a job already there would be
        return child_json("research.speed.busy_host", ["--child", str(threads), "--steps", str(steps),
                                                        "--precision", precision], env)
    finally:
        if spinner:
            spinner.kill()
            spinner.wait()


def run(settings: list[str], steps: int, repeats: int, precision: str) -> dict:
    """Every setting quiet and busy, alternated `repeats` times; per setting and state the runs' results."""
    load = [os.getloadavg()]
    got: dict = {s: {"quiet": [], "busy": []} for s in settings}
    for _ in range(repeats):
        for s in settings:
            for state in ("quiet", "busy"):
                got[s][state].append(measured(s, steps, precision, state == "busy"))
    load.append(os.getloadavg())
    from utils.runtime import cpu_name
    return {"cpu": cpu_name(), "cores": len(usable_core_ids()), "steps": steps, "repeats": repeats,
            "load_before": load[0], "load_after": load[1], "settings": got}


def table(result: dict) -> str:
    """The result as lines for a terminal: medians over the repeats, the ratios against the setting's own quiet speed
    and against `cores` quiet."""
    def med(runs: list[dict]) -> float:
        return statistics.median(r["tokens_per_s"] for r in runs)
    first = result["settings"]
    base = med(first["cores"]["quiet"]) if "cores" in first else None
    some = next(iter(first.values()))["quiet"][0]
    lines = [f"{result['cpu']}, {result['cores']} cores, {some['precision']}, {result['steps']} steps x "
             f"{result['repeats']} repeats; load average before {' '.join(f'{x:.2f}' for x in result['load_before'])}"
             f", after {' '.join(f'{x:.2f}' for x in result['load_after'])}",
             f"{'setting':<9} {'threads quiet/busy':<19} {'quiet tok/s':>11} {'busy tok/s':>10} {'busy/quiet':>10} "
             f"{'quiet/cores':>11}  runs (quiet; busy)"]
    for name, r in first.items():
        q, b = med(r["quiet"]), med(r["busy"])
        threads = " / ".join("/".join(str(x["threads"]) for x in r[state]) for state in ("quiet", "busy"))
        each = (", ".join(f"{x['tokens_per_s']:,.0f}" for x in r["quiet"]) + "; "
                + ", ".join(f"{x['tokens_per_s']:,.0f}" for x in r["busy"]))
        lines.append(f"{name:<9} {threads:<19} {q:>11,.0f} {b:>10,.0f} {b / q:>10.0%} "
                     f"{(f'{q / base:.0%}' if base else 'n/a'):>11}  {each}")
    lines.append("busy/quiet: against the setting's own quiet speed; quiet/cores: against every core quiet")
    return "\n".join(lines)


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
Each measurement is a fresh process (an OpenMP setting is read when torch loads) that trains the tiny preset's model
and batch (the default study's runs on CPU) for --steps steps on random tokens after 2 warm-up steps, in --precision
(auto: as the study would), and prints its tokens/s over all timed steps (a collapse comes in spells: no median).
"Busy" starts one process that spins on the last core this process may use, as another job would, for the length of
the measurement. Settings and measurements alternate (each setting quiet, then busy, in turn, --repeats times), so a
drift of the host's load touches all. Prints a table (or one JSON object) with the load average before and after:
numbers to read, never a verdict. The settings:

    cores     every core this process may use (the default before threads followed the load)
    passive   every core, with OMP_WAIT_POLICY=PASSIVE (waiting threads sleep instead of spinning)
    spin1000  every core, with GOMP_SPINCOUNT=1000
    one       one thread
    auto      the default: the cores free when the run starts (utils.threads)
"""


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=DESCRIPTION)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS), metavar="SETTING",
                   help=f"Thread settings to measure: {', '.join(SETTINGS)}. Default: all")
    p.add_argument("--steps", type=positive_int, default=30,
                   help="Timed training steps per measurement (2,048 tokens each). Default: %(default)s")
    p.add_argument("--repeats", type=positive_int, default=2,
                   help="Times each setting is measured quiet and busy, alternated. Default: %(default)s")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                   help="Precision of the training step (auto: as a study picks it here). Default: %(default)s")
    p.add_argument("--json", action="store_true", help="Print one JSON object instead of the table")
    p.add_argument("--child", type=int, default=None, metavar="N",
                   help="Measure once in this process on N threads (-1: every core, 0: the default's rule) and print "
                        "one JSON object: what the driver runs in each fresh process. Default: the driver")
    return p


@command
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.child is not None:  # one measurement, in the process the driver started
        print(json.dumps(train_speed(args.child, args.steps, args.precision)))
        return
    if len(usable_core_ids()) < 2:
        raise UserError("busy_host needs 2 or more cores this process may use (one is kept busy); fix: run it "
                        "without taskset or on a larger host")
    result = run(args.settings, args.steps, args.repeats, args.precision)
    print(json.dumps(result, indent=2) if args.json else table(result))


if __name__ == "__main__":
    main()
