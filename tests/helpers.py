"""Helpers shared by the tests (fixtures live in conftest.py)."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The write-ups' own results.json of their three-condition 1.5B study (the raw numbers they published), kept in the
# clone so that every test reads only what the clone holds.
REFERENCE = REPO / "tests" / "fixtures" / "reference" / "qk_norm_50m_study"
STEP_TOKENS = 8 * 32  # debug preset: batch 8 x seq_len 32


def pyproject() -> dict:
    """pyproject.toml read: by tomllib from Python 3.11, by tomli (which pytest needs before 3.11) on 3.10."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def free_port() -> int:
    """A TCP port no process listens on now (for torchrun's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_train_llm(args: list[str], nproc: int = 1) -> str:
    """train_llm.py in a subprocess (under torchrun with nproc > 1, one thread per process); its stdout.
    Fails the test with the stderr's end when it exits non-zero."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    env["OMP_NUM_THREADS"] = "1"
    launch = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                                                   str(nproc), "--master_port", str(free_port())]
    proc = subprocess.run([*launch, str(REPO / "train_llm.py"), *args], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def quiet(*args, **kwargs) -> None:
    pass


def losses(out: Path) -> list[float]:
    """Training losses of a run folder's metrics.jsonl, one per logged step."""
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def build_trainer(cfg, out, **kwargs):
    """A single-process Trainer on freshly prepared data, silent and without a progress bar."""
    from data import prepare_data
    from training.trainer import Trainer
    return Trainer(cfg, prepare_data(cfg, log=quiet), out, progress=False, log=quiet, **kwargs)


def md_table(text: str, first_header: str) -> list[dict[str, str]]:
    """The rows of the markdown table whose header row starts with `first_header`, as dicts."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first_header} |"))
    cells = lambda ln: [c.strip() for c in ln.strip().strip("|").split("|")]  # noqa: E731
    header = cells(lines[start])
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append(dict(zip(header, cells(ln))))
    return rows


def bullet(text: str, label: str) -> str:
    """What follows '- <label>: ' on its line of a report."""
    line = next(ln for ln in text.splitlines() if ln.startswith(f"- {label}: "))
    return line[len(f"- {label}: "):]


def labelled_lines(ax) -> dict:
    """{legend label: y data} of an axes' labelled lines."""
    import numpy as np
    return {ln.get_label(): np.asarray(ln.get_ydata(), float) for ln in ax.get_lines()
            if not ln.get_label().startswith("_")}


def replaced(args: list[str], change: list[str]) -> list[str]:
    """`args` with each option `change` names given its values there instead (an option given twice is refused)."""
    named = {a for a in change if a.startswith("--")}
    out, skip = [], False
    for a in args:
        if a.startswith("--"):
            skip = a in named
        if not skip:
            out.append(a)
    return out + list(change)


def cli_args(corpus_file, cache_dir, out, steps: int, *extra) -> list[str]:
    """train_llm.py arguments of a debug run of `steps` steps: probes and checkpoints every 2 steps; an option in
    `extra` replaces its default here."""
    return replaced(["--preset", "debug", "--source", "files", "--paths", str(corpus_file), "--cache_dir",
                     str(cache_dir), "--precision", "fp32", "--no_progress", "--eval_batches", "2", "--probe_every",
                     "2", "--ckpt_every", "2", "--tokens", str(steps * STEP_TOKENS), "--out", str(out)], list(extra))


def train_lines(out: Path) -> list[dict]:
    """The training lines of a run folder's metrics.jsonl (those with a loss), whole."""
    return [r for r in (json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def train_rows(out: Path) -> list[tuple]:
    """(step, loss, grad_norm, lr_factor) of every training row of metrics.jsonl (timings left out)."""
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["grad_norm"], r["lr_factor"]) for r in rows if "loss" in r]


def assert_same_run(a: Path, b: Path, last_step: int) -> None:
    """Two run folders hold the same training: metrics rows (each step once), probes and final weights."""
    import torch
    from safetensors.torch import load_file

    from research.results import load_results
    rows = train_rows(b)
    assert [r[0] for r in rows] == list(range(1, last_step + 1))  # every step once, in order
    assert rows == train_rows(a)
    ra, rb = load_results(a / "results.json"), load_results(b / "results.json")
    for k in ("steps", "tokens", "loss", "val_loss", "mean_pr", "layer_pr", "gamma_cv", "gamma_final"):
        assert ra[k] == rb[k], k
    wa = load_file(str(a / "checkpoints" / f"step-{last_step:06d}" / "model.safetensors"))
    wb = load_file(str(b / "checkpoints" / f"step-{last_step:06d}" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def hidden_files(out: Path) -> list[str]:
    """Names starting with '.' anywhere under a run folder, the lock file aside: what a crash could leave."""
    return sorted(str(p.relative_to(out)) for p in out.rglob(".*") if p.name != ".lock")


def hold_lock(folder: Path):
    """Another process that takes folder's lock (utils.lock) and keeps it for a minute; returns it once it
    holds the lock. Kill it to release."""
    import os
    import subprocess
    import sys
    code = ("import sys, time; from utils.lock import FolderLock; FolderLock(sys.argv[1]).acquire(); "
            "print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def spawn_gloo(fn, world_size: int, *args) -> None:
    """Run fn(rank, world_size, *args) in `world_size` processes joined in a gloo process group on a free port."""
    import torch.multiprocessing as mp
    mp.spawn(_gloo_worker, args=(fn, world_size, free_port(), args), nprocs=world_size, join=True)


def _gloo_worker(rank: int, fn, world_size: int, port: int, args) -> None:
    """One spawned rank, started and ended as train_llm.py's are (training.distributed): fn's exception reaches
    mp.spawn as usual; a rank that returns leaves through end_process (why: its docstring)."""
    import os

    import torch

    from training.distributed import end_process, init_distributed, shutdown_distributed
    from utils.runtime import resolve_runtime
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    runtime = resolve_runtime("cpu")
    init_distributed(runtime)
    try:
        fn(rank, world_size, *args)
    except BaseException:
        shutdown_distributed(runtime, wait_for_peers=False)
        raise
    shutdown_distributed(runtime)
    end_process(0)


def stops(capsys, main, argv, code: int = 2) -> str:
    """Run a command's `main(argv)` expecting it to stop as utils.cli.command stops a command: exit status `code`
    (2: a user error, 130: Ctrl-C), its last stderr line the one line that says why, no traceback. That line."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == code and "Traceback" not in err, (stop.value.code, err[-2000:])
    line = err.rstrip("\n").rsplit("\n", 1)[-1]
    assert code != 2 or line.startswith("error: "), err[-2000:]
    return line


def _comparable(value):
    """A results file without what differs between two trainings of the same run: provenance, timings, and the
    threads asked (a runtime setting)."""
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()
                if k not in ("provenance", "threads") and not k.endswith("time_s")}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


def comparable_index(out: Path) -> dict:
    """A study folder's study.json without its time split (seconds measured, not results: utils.time_split)."""
    index = json.loads((out / "study.json").read_text())
    index.pop("time_split", None)
    return index


def comparable_results(out: Path) -> dict:
    """{path in the study folder: its results.json, what two trainings of the same runs share (_comparable)}."""
    return {p.relative_to(out).as_posix(): _comparable(json.loads(p.read_text()))
            for p in sorted(out.rglob("results.json"))}


def probe_tensors(model, ids, keep_proj: bool = False) -> list[dict]:
    """Per layer the tensors the training probe's LayerSink hands layer_record ([heads, B, T, D]: k_norm, k_rope,
    q_norm, q_rope, where present k_proj (keep_proj), k_hat's gain side not applied), copied, from one forward of
    this project's model on ids."""
    import torch

    from research.probing.probe import KeyProbe

    sink = KeyProbe(ids).sink(model)
    sink.projections = keep_proj
    kept: list[dict] = [{} for _ in model.blocks]

    def keep(i, q, k, v, *args):
        kept[i] = {n: x.clone() for n, x in sink.tensors(i, q, k)[0].items()}
    sink.on_attention = keep
    with torch.no_grad(), sink.adapter.capture(sink):
        model.hidden(ids)
    return kept
