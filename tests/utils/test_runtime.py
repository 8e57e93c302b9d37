"""--device auto: CUDA, then Apple's MPS, then the CPU; fp32 on MPS; a missing device is named with those there are."""
import ast
import platform
import subprocess
import sys
from pathlib import Path
import re

import pytest
import torch

import train_llm
from configs import ConfigError
from tests.helpers import stops
from utils.runtime import Runtime, device_choice, precision_choice, resolve_device, resolve_precision, resolve_runtime


@pytest.fixture
def machine(monkeypatch):
    """Pretend this machine has `gpus` CUDA devices and MPS or not."""
    def make(gpus: int = 0, mps: bool = False):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    return make


def test_auto_prefers_cuda_then_mps_then_cpu(machine):
    machine(gpus=2, mps=True)
    assert resolve_device("auto", local_rank=1) == torch.device("cuda:1")
    machine(gpus=0, mps=True)
    assert resolve_device("auto") == torch.device("mps") == resolve_device("mps") == resolve_device("mps:0")
    assert device_choice("auto", torch.device("mps")) == "mps (auto: no CUDA; Apple MPS)"
    machine(gpus=0, mps=False)
    assert resolve_device("auto") == torch.device("cpu")
    assert device_choice("auto", torch.device("cpu")) == "cpu (auto: no CUDA or MPS)"


def test_mps_trains_in_fp32_unless_asked_for_bf16():
    mps = torch.device("mps")
    assert resolve_precision("auto", mps) == "fp32"
    assert precision_choice("auto", mps) == "fp32 (auto: fp32 on mps)"
    assert precision_choice("bf16", mps) == "bf16 (--precision bf16)"


def test_a_device_this_machine_lacks_is_named_with_those_it_has(machine, tmp_path, capsys):
    machine(gpus=1, mps=False)
    with pytest.raises(ConfigError, match=r"--device mps: choose auto or one of the devices available here: "
                                          r"cpu, cuda:0$"):
        resolve_device("mps")
    with pytest.raises(ConfigError, match=r"--device cuda:3: .* here: cpu, cuda:0$"):
        resolve_device("cuda:3")
    machine(gpus=0, mps=True)
    with pytest.raises(ConfigError, match=r"--device cuda: .* here: cpu, mps$"):
        resolve_device("cuda")
    with pytest.raises(ConfigError, match=r"--device tpu: .* here: cpu, mps \(not a device name\)"):
        resolve_device("tpu")
    machine(gpus=0, mps=False)
    assert re.fullmatch(r"error: --device mps: .* here: cpu",
                        stops(capsys, train_llm.main, ["--preset", "debug", "--device", "mps", "--out",
                                                       str(tmp_path / "run")]))
    assert not (tmp_path / "run").exists()


def test_the_run_log_says_which_device_and_precision_and_why(debug_cfg, tmp_path, machine):
    from data import prepare_data
    from tests.helpers import quiet
    from training.trainer import Trainer
    machine(gpus=0, mps=False)
    lines: list[str] = []
    Trainer(debug_cfg(), prepare_data(debug_cfg(), log=quiet), tmp_path, progress=False, log=lines.append)
    assert "device=cpu (auto: no CUDA or MPS) precision=fp32 (--precision fp32)" in lines[0]


def test_the_runtime_is_settled_from_the_settings_and_torchruns_environment(machine):
    machine(gpus=2, mps=False)
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    r = resolve_runtime("auto", "fp32", env)
    assert (r.device, r.precision, r.rank, r.local_rank, r.world_size, r.local_world_size, r.distributed) == \
        (torch.device("cuda:1"), "fp32", 3, 1, 4, 2, True)
    assert r.dtype == torch.float32 and r.device_choice() == "cuda:1 (auto: CUDA)"
    assert r.precision_choice() == "fp32 (--precision fp32)"
    machine(gpus=0, mps=False)
    alone = resolve_runtime("cpu", "bf16", {"WORLD_SIZE": "4"})  # no RANK: not launched by torchrun
    assert alone == Runtime(torch.device("cpu"), "bf16", "cpu", "bf16") and not alone.distributed
    assert alone.dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="--device cuda: "):
        resolve_runtime("cuda", "auto", {})


def test_a_runtime_alone_is_rank_0_and_its_collectives_change_nothing():
    """The process group's collectives are the runtime's (training.distributed starts the group under torchrun;
    tests/training/test_training.py's DDP run uses them over two processes)."""
    alone, t = Runtime(torch.device("cpu"), "fp32"), torch.tensor([1.0, -2.0])
    assert alone.is_main and not Runtime(torch.device("cpu"), "fp32", rank=1, world_size=2).is_main
    alone.barrier()
    assert alone.mean(2.5) == 2.5 and alone.broadcast({"a": 1}) == {"a": 1}
    assert alone.max_(t) is t and t.tolist() == [1.0, -2.0]


def test_a_study_settles_argv_its_base_config_and_its_runtime_once(machine, monkeypatch, tmp_path, corpus_file,
                                                                   cache_dir):
    """One process of a study, up to its first training step: argv parsed once (the help and the run share the
    parse), the device and precision resolved once and handed down (trainer, memory check, probe, provenance)."""
    import argparse

    import research.probing.callback
    import research.studies.runner as runner
    import training.memory_fit
    import training.run
    import training.trainer
    from research import qk_norm_25m_study
    from tests.helpers import STEP_TOKENS
    from training.trainer import Trainer
    machine(gpus=0, mps=False)
    counts = {"parse": 0, "device": 0, "precision": 0, "runtime": []}
    real_parse, real_device, real_precision = argparse.ArgumentParser.parse_known_args, resolve_device, \
        resolve_precision

    def parse(self, *a, **k):
        counts["parse"] += 1
        return real_parse(self, *a, **k)

    def device(*a, **k):
        counts["device"] += 1
        return real_device(*a, **k)

    def precision(*a, **k):
        counts["precision"] += 1
        return real_precision(*a, **k)

    class Stop(Exception):
        pass

    def first_step(trainer):
        counts["runtime"].append(trainer.runtime)
        raise Stop
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse)
    monkeypatch.setattr("utils.runtime.resolve_device", device)
    monkeypatch.setattr("utils.runtime.resolve_precision", precision)
    monkeypatch.setattr(training.memory_fit, "resolve_precision", precision)  # plan_target's, for --plan only
    monkeypatch.setattr(Trainer, "train_step", first_step)
    argv = ["--preset", "debug", "--seed", "0", "--out", str(tmp_path / "s"), "--no_progress", "--source", "files",
            "--paths", str(corpus_file), "--cache_dir", str(cache_dir), "--tokens", str(4 * STEP_TOKENS)]
    with pytest.raises(Stop):
        qk_norm_25m_study.main(argv)
    assert (counts["parse"], counts["device"], counts["precision"]) == (1, 1, 1)
    assert counts["runtime"][0] == Runtime(torch.device("cpu"), resolve_precision("auto", torch.device("cpu")))
    for layer in (runner, training.run, training.trainer, training.memory_fit, research.probing.callback):
        assert not hasattr(layer, "resolve_device"), layer  # each takes the runtime it is handed



def test_cpu_threads_share_the_cores_and_keep_to_omp_num_threads(monkeypatch):
    from utils.runtime import local_cpu_threads
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7}, raising=False)
    for omp, world, threads in ((None, 1, 8), (None, 3, 2), (None, 16, 1),  # the cores shared, at least one
                                ("1", 1, 1), ("2", 1, 2), ("64", 2, 4),  # OMP_NUM_THREADS caps (Ray: a task's CPUs)
                                ("4,2", 1, 4), ("0", 1, 8), ("many", 1, 8)):  # its nested form; no budget read
        if omp is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", omp)
        assert local_cpu_threads(world) == threads, (omp, world)



_PROBE_FAULTS = """
import resource, sys, torch
from configs import get_preset
from models import MinimalLLM
from research.probing.probe import KeyProbe
from utils.runtime import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
torch.manual_seed(0)
probe = KeyProbe(torch.randint(0, 512, (32, 64)))
model = MinimalLLM(get_preset("debug").model)
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    probe(model)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(kept, faults)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="keep_freed_memory tunes glibc's malloc")
def test_a_probe_reuses_freed_memory_without_page_faults():
    """By default glibc hands blocks of a few MiB back to the OS when they are freed, so every probe (and training
    step) touches fresh pages again: thousands of page faults each time. Kept, the later probes fault on no more
    than a few pages (measured: 0-2, with now and then one probe at 257-385, a fresh thread's stack or arena: so the
    median of the five later probes is what is compared)."""
    runs = {}
    for mode in ("keep", "default"):
        out = subprocess.run([sys.executable, "-c", _PROBE_FAULTS, mode], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parents[2]).stdout.split(" ", 1)
        runs[mode] = (out[0], ast.literal_eval(out[1]))
    median = {mode: sorted(faults[1:])[2] for mode, (_, faults) in runs.items()}
    assert runs["keep"][0] == "True" and median["keep"] < 64, runs
    assert median["default"] > 1000, runs  # what the setting removes: the run would fault without it
