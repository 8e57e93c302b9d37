"""Process-group setup from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK), read into a `utils.runtime.Runtime`,
the one object that says where and in which process group a process runs."""
from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from utils.runtime import Runtime

_gloo_started = False  # set once this process has started a gloo process group (init_distributed; end_process)


def init_distributed(runtime: Runtime) -> None:
    """Start the process group of `runtime` (utils.runtime.resolve_runtime read torchrun's environment) when
    launched by torchrun; a no-op for a single process. The runtime then carries the group's collectives.

    gloo on CPU, NCCL on CUDA.
    """
    global _gloo_started
    if not runtime.distributed:
        return
    if not dist.is_initialized():
        if runtime.device.type == "cuda":
            torch.cuda.set_device(runtime.local_rank)
        # a long timeout: rank 0 alone may tokenize a corpus or write a large checkpoint while the others wait
        backend = "nccl" if runtime.device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=timedelta(hours=2))
        _gloo_started |= backend == "gloo"


def shutdown_distributed(runtime: Runtime, wait_for_peers: bool = True) -> None:
    """Leave the process group. After a run that ended well every rank first waits at a barrier, so none tears
    its connections down while a peer is still in its last collective; after an error there is no barrier
    (a peer may be stuck in a collective that will never complete)."""
    if runtime.distributed and dist.is_initialized():
        if wait_for_peers:
            dist.barrier()
        dist.destroy_process_group()


def end_process(code: int | str | None = 0) -> NoReturn:
    """Exit like sys.exit(code), except in a process that ran a gloo process group: that one ends without the
    interpreter's finalization (os._exit, after flushing stdout and stderr).

    Why (torch 2.13, reproduced with gdb on a core dump): gloo's worker threads hold the last reference to the
    tensors of a collective for a moment after it completes, and releasing a tensor that has a Python object
    takes the GIL. Once FSDP2 has sharded a module, destroy_process_group() no longer ends those threads, so
    they are still running when the interpreter finalizes; a thread that asks for the GIL then is ended by
    Python, unwinds through a noexcept frame and std::terminate aborts the process ("terminate called without
    an active exception", SIGABRT, intermittently and more often under load). Call this after
    shutdown_distributed, when everything the process writes is written and closed."""
    if not _gloo_started:
        sys.exit(code)
    if isinstance(code, str):  # sys.exit's convention: a message means failure
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)

