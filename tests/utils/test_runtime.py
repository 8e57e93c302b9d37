"""--device auto: CUDA, then Apple's MPS, then the CPU; fp32 on MPS; a missing device is named with those there are."""
import re

import pytest
import torch

import train_llm
from configs import ConfigError
from tests.helpers import stops
from utils.runtime import device_choice, precision_choice, resolve_device, resolve_precision


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
