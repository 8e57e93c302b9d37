"""How a process that ran gloo ends (training.distributed.end_process), and the torch behaviour that makes it
necessary: once FSDP2 has sharded a module, destroy_process_group() leaves gloo's worker threads running, so
they would still be alive when the interpreter finalizes (what aborted tests/optimizers/test_muon_sharded.py
intermittently with "terminate called without an active exception")."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, spawn_gloo


def _gloo_threads() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            names.append(f.read().strip())
    return sorted(n for n in names if "gloo" in n)


def _shard_then_destroy(rank: int, world: int, out) -> None:
    import atexit

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    model = nn.ParameterList([nn.Parameter(torch.randn(8, 4))])
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    next(iter(model.parameters())).full_tensor()
    del model
    before = _gloo_threads()
    dist.destroy_process_group()
    (out / f"threads{rank}.txt").write_text(f"{len(before)} {len(_gloo_threads())}")
    # the helper's own shutdown then finds no group; its end_process must skip this handler
    atexit.register(lambda: (out / f"atexit{rank}.txt").write_text("ran"))


@pytest.mark.slow
def test_gloo_threads_outlive_destroy_after_fsdp_and_the_process_ends_without_finalizing(tmp_path):
    if not sys.platform.startswith("linux"):
        import pytest
        pytest.skip("counts threads through /proc")
    spawn_gloo(_shard_then_destroy, 2, tmp_path)
    for rank in range(2):
        before, after = map(int, (tmp_path / f"threads{rank}.txt").read_text().split())
        # torch 2.13: 2 worker threads and the tcp loop, before and after destroy. If this fails, a torch
        # upgrade ends them now and end_process's os._exit may be reconsidered.
        assert before == after == 3, (before, after)
        assert not (tmp_path / f"atexit{rank}.txt").exists()  # no interpreter finalization ran


def _end(code_literal: str, gloo: bool) -> subprocess.CompletedProcess:
    code = ("import atexit, sys, training.distributed as d; atexit.register(lambda: print('finalized'));"
            f"d._gloo_started = {gloo}; print('out', flush=False); d.end_process({code_literal})")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.slow
def test_end_process_keeps_sys_exit_semantics():
    done = _end("0", gloo=True)
    assert (done.returncode, done.stdout) == (0, "out\n")  # stdout flushed, atexit skipped
    failed = _end("'error: the folder is locked'", gloo=True)
    assert (failed.returncode, failed.stdout, failed.stderr) == (1, "out\n", "error: the folder is locked\n")
    plain = _end("3", gloo=False)  # no gloo group: an ordinary exit that finalizes
    assert (plain.returncode, plain.stdout) == (3, "out\nfinalized\n")
