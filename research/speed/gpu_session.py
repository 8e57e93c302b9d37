"""The prepared GPU session (issue 57): every CUDA-only check and speed measurement, in priority order, inside one
time budget, each step's output in its own log file, so that a lent GPU of about 15 minutes runs it once and has
time left for a rerun.

    python -m research.speed.gpu_session --out $OUT                       # on the GPU machine, 8 minutes at most
    REPO=<their code> python -m research.speed.gpu_session --out $OUT --seed_script shared/bench/gpu_seed.py
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from utils.cli import ArgumentParser, command, positive_number  # first: Ctrl-C while libraries load is one line

from configs.config import declared
from research.results.values import json_safe
from research.speed.variants import timed_fields
from utils.errors import UserError
from utils.io import atomic_write_text
from utils.owners import GPU_SESSION, refuse_foreign

import torch

PY = sys.executable
TOOL = "research/speed/gpu_session.py"
# The files holding the tests marked for CUDA (tests/research/speed/test_gpu_session.py checks the list is
# whole): collecting only these keeps the session off packages the GPU image lacks (Ray, gguf) that other tests import.
CUDA_TEST_FILES = ("tests/training/test_cuda.py", "tests/research/probing/test_hf.py")


@dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]
    limit_s: float
    needs_cuda: bool = True
    tokens: int = 0  # tokens the step trains in all, for an aggregate tokens/s from its wall time (0: none)


def _gpu(*extra: str) -> tuple[str, ...]:
    return (PY, "-m", "research.speed.gpu", *extra)


def _shared(p: int, out: Path, ray: bool) -> Step:
    """p seeds of the tiny-preset study (3p runs), p at a time on one GPU: through a local Ray, each run a 1/p
    share of the GPU, where Ray is installed; else --parallel p worker processes on the same GPU."""
    tokens = 2_000_000
    way = ("--ray", "--gpus_per_run", f"{1 / p:.4f}") if ray else ("--parallel", str(p))
    return Step(f"shared_gpu_{p}", (PY, "research/qk_norm_25m_study.py", "--preset", "tiny", "--device", "cuda",
                                    "--seeds", *map(str, range(p)), "--tokens", str(tokens), "--no_progress",
                                    *way, "--out", str(out / f"shared_{p}")), 75, tokens=3 * p * tokens)


def variant_values() -> list[tuple[str, str]]:
    """(field, value) of each value a field's declaration (configs/config.py) names to time: the variants benchmark's
    list (research.speed.variants), in declaration order."""
    return [(name, text) for name in timed_fields() for text in declared()[name][1].metadata["timed"]]


def session_steps(out: Path, seed_script: str | None) -> list[Step]:
    """The session's steps in priority order (the issue's 1, 2, 5, 4)."""
    steps = [Step("cuda_tests", (PY, "-m", "pytest", "-m", "gpu", "-q", "--durations=0", "-p", "no:cacheprovider",
                                 *CUDA_TEST_FILES), 150),
             Step("project_88m", _gpu("--preset", "88m", "--batch_size", "4", "--grad_accum", "1", "--steps", "20"),
                  60),
             Step("project_1b", _gpu("--preset", "1b", "--steps", "4"), 90)]
    if seed_script and os.environ.get("REPO"):
        steps += [Step("seed_88m", (PY, seed_script, "--cfg", "88m", "--ckpt", "0", "--batch", "4", "--accum", "1",
                                    "--steps", "20"), 120),
                  Step("seed_1b", (PY, seed_script, "--cfg", "1b", "--ckpt", "0", "--steps", "4"), 150)]
    for field, value in variant_values():
        steps.append(Step(f"variant_{field}_{value}", _gpu("--preset", "88m", "--batch_size", "4", "--grad_accum", "1",
                                                           "--steps", "10", f"--{field}", value), 40))
    ray = importlib.util.find_spec("ray") is not None
    return steps + [_shared(p, out, ray) for p in (1, 2, 4)]


def last_result(text: str) -> dict | None:
    """The last JSON object a step printed: a line that parses as one, or gpu_seed.py's `RESULT {...}`."""
    for line in reversed(text.splitlines()):
        line = line.strip().removeprefix("RESULT").strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def run_step(step: Step, out: Path, left_s: float, cuda: bool) -> dict:
    """Runs one step (its output in <out>/<name>.log) under min(its limit, what is left of the budget)."""
    if step.needs_cuda and not cuda:
        return {"status": "skipped", "why": "no CUDA"}
    if left_s < 5:
        return {"status": "skipped", "why": f"budget spent ({left_s:.0f} s left)"}
    limit = min(step.limit_s, left_s)
    log = out / f"{step.name}.log"
    t = time.perf_counter()
    with open(log, "w") as f:
        f.write("$ " + " ".join(step.argv) + "\n")
        f.flush()
        try:
            rc = subprocess.run(step.argv, stdout=f, stderr=subprocess.STDOUT, timeout=limit,
                                start_new_session=True).returncode
            status = "ran" if rc == 0 else f"failed (exit {rc})"
        except subprocess.TimeoutExpired:
            status = f"timeout ({limit:.0f} s)"
    seconds = time.perf_counter() - t
    rec = {"status": status, "seconds": round(seconds, 1), "result": last_result(log.read_text(errors="replace"))}
    if step.tokens and status == "ran":
        rec["aggregate_tokens_per_s"] = round(step.tokens / seconds)
    return rec


class SessionError(UserError):
    """A session asked to write where an earlier session's record is."""


def _holds_a_session(folder: Path) -> bool:
    """Whether `folder` holds any file a session writes: its record, a step's log, a shared-GPU study."""
    return folder.is_dir() and any(p.name == GPU_SESSION or p.suffix == ".log" or p.name.startswith("shared_")
                                   for p in folder.iterdir())


def session_folder(out: Path) -> tuple[Path, int]:
    """(the folder this session writes, its number): `out` itself for the first session into it; after that
    <out>/session_<n>, the first n from 2 whose folder does not exist, so that no earlier record or log is
    replaced. `out` must be the session's own folder or a new one (utils.owners; SessionError otherwise)."""
    refuse_foreign(out, "gpu_session", TOOL)
    if not _holds_a_session(out):
        return out, 1
    n = 2
    while (out / f"session_{n}").exists():
        n += 1
    return out / f"session_{n}", n


def run_session(steps: list[Step], out: Path, budget_s: float, cuda: bool | None = None, session: int = 1) -> dict:
    """Every step in order inside budget_s; writes <out>/gpu_session.json after each step (a session cut off
    keeps what it measured). A folder holding an earlier session's record is refused before anything runs (main
    chooses a new folder for it: session_folder). `session`: its number in --out, kept in its record."""
    refuse_foreign(out, "gpu_session", TOOL)
    if (out / GPU_SESSION).exists():
        raise SessionError(f"{out / GPU_SESSION} is an earlier session's record, never replaced: write this session "
                           f"into a new folder (research.speed.gpu_session.session_folder chooses one)")
    cuda = torch.cuda.is_available() if cuda is None else cuda
    out.mkdir(parents=True, exist_ok=True)
    session = {**({"session": session} if session > 1 else {}),
               "device": torch.cuda.get_device_name(0) if cuda else "no CUDA", "torch": torch.__version__,
               "budget_s": budget_s, "steps": {}}
    start = time.perf_counter()
    for step in steps:
        rec = run_step(step, out, budget_s - (time.perf_counter() - start), cuda)
        session["steps"][step.name] = rec
        print(f"{step.name}: {rec['status']}" + (f", {rec['seconds']} s" if "seconds" in rec else ""), flush=True)
        atomic_write_text(out / GPU_SESSION, json.dumps(json_safe(session), indent=1, allow_nan=False) + "\n")
    return session


# --help's description: the module docstring, then these details (docs/speed.md, "The prepared GPU session")
DESCRIPTION = __doc__ + """
Steps, in order (each a subprocess with its own time limit, cut to what is left of --budget_s):
  cuda_tests       python -m pytest -m gpu (every test marked for CUDA), with each test's time
  project_88m      research.speed.gpu on the 88m preset at the write-ups' batch (4 x 2048, no accumulation)
  project_1b       research.speed.gpu on the 1b preset, no checkpointing
  seed_88m/1b      the write-ups' own step (../shared/bench/gpu_seed.py), only with --seed_script and $REPO
  variant_F_V      the 88m step with field F at value V, each value configs/config.py declares to time (as
                   research.speed.variants does): against project_88m
  shared_gpu_P     the tiny study's runs P at a time on the GPU (Ray's --gpus_per_run 1/P where Ray is installed,
                   else --parallel P): their aggregate tokens/s, against P = 1
Without CUDA every step that needs it is recorded as skipped (the CPU check of this script). Writes
<out>/gpu_session.json (each step: status ran / failed / timeout / skipped, seconds, and the last JSON object or
RESULT line it printed; docs/schema/gpu_session.schema.json) and <out>/<step>.log; prints one line per step.

An earlier session's record is never replaced: a session into a folder that holds one (or any file of one: a step's
log, a shared-GPU study) writes <out>/session_<n>/ instead, the first n from 2 whose folder does not exist, and says
so; its record holds its number. --out is the GPU session's own folder (utils.owners): a run's, a study's or another
tool's folder is refused before anything is written.
"""


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=DESCRIPTION)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_session")),
                   help="Folder for gpu_session.json and the steps' logs (one holding an earlier session: its "
                        "session_<n>/). Default: $OUT, else ./gpu_session")
    p.add_argument("--budget_s", type=positive_number, default=480.0,
                   help="Seconds for all steps together; a step gets what is left of it at most. Default: 480")
    p.add_argument("--seed_script", default=None,
                   help="The write-ups' step (../shared/bench/gpu_seed.py, copied into the tree), run when $REPO "
                        "names their code. Default: not run")
    return p


@command
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    folder, n = session_folder(args.out)
    if n > 1:
        print(f"{args.out} holds an earlier session, kept as it is: this one (session {n}) writes {folder}",
              flush=True)
    run_session(session_steps(folder, args.seed_script), folder, args.budget_s, session=n)


if __name__ == "__main__":
    main()
