"""Device, precision, seeding and provenance helpers; `Runtime`, the device, precision and process group decided
once per process (resolve_runtime), with the process group's collectives."""
from __future__ import annotations

import ctypes
import functools
import os
import platform
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
import torch.distributed as tdist

from utils.errors import ConfigError
from utils.hosts import host_kind
from utils.threads import ThreadChoice, omp_budget, thread_choice, usable_core_ids


def mps_available() -> bool:
    """Whether this machine has Apple's Metal GPU backend (MPS) for torch."""
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


def available_devices() -> list[str]:
    """The devices this machine can train on, as --device spells them."""
    names = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if mps_available():
        names.append("mps")
    return names


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """'auto' picks cuda:LOCAL_RANK when CUDA is available, else mps (Apple GPU), else cpu. Anything this
    machine does not have raises ConfigError naming the devices it does have."""
    if name == "auto" and torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"process {local_rank} on this node has no GPU of its own: this machine has "
                              f"{torch.cuda.device_count()}; start at most that many processes per node "
                              f"(torchrun --nproc_per_node), or train on CPU with --device cpu")
        return torch.device(f"cuda:{local_rank}")
    if name == "auto":
        return torch.device("mps") if mps_available() else torch.device("cpu")
    have = available_devices()
    problem = f"--device {name}: choose auto or one of the devices available here: {', '.join(have)}"
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"{problem} (not a device name)") from None
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device(f"cuda:{local_rank}")
    elif dev.type == "cuda" and local_rank > 0:
        raise ConfigError(f"--device {name} under torchrun would put every process on one GPU: use --device cuda "
                          f"(each process takes cuda:LOCAL_RANK) or auto")
    if dev.type == "mps" and dev.index == 0:
        dev = torch.device("mps")
    if dev.type != "cpu" and str(dev) not in have:
        raise ConfigError(problem)
    return dev


def device_choice(name: str, device: torch.device) -> str:
    """The device and why, for the first lines of a run's log."""
    if name != "auto":
        return f"{device} (--device {name})"
    why = {"cuda": "CUDA", "mps": "no CUDA; Apple MPS"}.get(device.type, "no CUDA or MPS")
    return f"{device} (auto: {why})"


@functools.cache
def cpu_bf16_path() -> str:
    """The CPU's native bf16 path, one of utils.hosts.BF16_PATHS: 'AMX' (oneDNN's tile kernels, where the CPU has
    them), 'AVX512-BF16', or 'none' (oneDNN emulates bf16, slower than fp32). Part of the host kind."""
    try:
        if torch.cpu._is_amx_tile_supported():
            return "AMX"
        if torch.cpu._is_avx512_bf16_supported():
            return "AVX512-BF16"
    except AttributeError:  # private helpers missing in some torch version: be conservative
        pass
    return "none"


def cpu_has_native_bf16() -> bool:
    """True when the CPU has bf16 dot-product instructions (AVX512-BF16 or AMX); without them oneDNN
    emulates bf16, which is slower than fp32."""
    return cpu_bf16_path() != "none"


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one), for benchmark reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def resolve_precision(precision: str, device: torch.device) -> str:
    """'auto' -> 'bf16' on CUDA with bf16 support and on CPUs with native bf16 dot products, else 'fp32'
    (research/benchmark.py measures both). On MPS auto is fp32: bf16 there needs macOS 14 and not every
    op has a bf16 kernel, so autocast could fail mid-run; --precision bf16 still asks for it."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu":
        return "bf16" if cpu_has_native_bf16() else "fp32"
    return "fp32"


def precision_choice(precision: str, device: torch.device) -> str:
    """The precision and why, for the first lines of a run's log."""
    return _precision_why(precision, resolve_precision(precision, device), device)


def _precision_why(precision: str, chosen: str, device: torch.device) -> str:
    if precision != "auto":
        return f"{chosen} (--precision {precision})"
    why = {("cuda", "bf16"): "CUDA with bf16", ("cuda", "fp32"): "this GPU has no bf16",
           ("cpu", "bf16"): "CPU with native bf16", ("cpu", "fp32"): "no native bf16 on this CPU",
           }.get((device.type, chosen), f"fp32 on {device.type}")
    return f"{chosen} (auto: {why})"


@dataclass(frozen=True)
class Runtime:
    """Where and how this process computes, and in which process group, settled once per process (resolve_runtime)
    and handed down to the trainer, the memory check, the probe and the provenance, which never read --device or
    --precision again.
    `device_asked` and `precision_asked` are the settings as given (auto, cuda, ...), for the log's "why"."""
    device: torch.device
    precision: str  # what training autocasts to: "bf16" or "fp32"
    device_asked: str = "auto"
    precision_asked: str = "auto"
    rank: int = 0  # torchrun's RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE (0, 0, 1, 1 alone)
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # The process group's collectives (training.distributed.init_distributed starts it; alone each is a no-op).
    def barrier(self) -> None:
        if self.distributed:
            tdist.barrier()

    def mean(self, value: float) -> float:
        """Average a Python float over ranks."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        tdist.all_reduce(t)
        return t.item() / self.world_size

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank (a picklable Python object)."""
        if not self.distributed:
            return obj
        box = [obj if self.is_main else None]
        tdist.broadcast_object_list(box, src=0)
        return box[0]

    def max_(self, t: torch.Tensor) -> torch.Tensor:
        """Element-wise maximum over ranks, in place."""
        if self.distributed:
            tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        return t

    @property
    def dtype(self) -> torch.dtype:
        """The dtype autocast computes matmuls in."""
        return torch.bfloat16 if self.precision == "bf16" else torch.float32

    def device_choice(self) -> str:
        """The device and why, for the first lines of a run's log."""
        return device_choice(self.device_asked, self.device)

    def precision_choice(self) -> str:
        """The precision and why, for the first lines of a run's log."""
        return _precision_why(self.precision_asked, self.precision, self.device)


def resolve_runtime(device: str = "auto", precision: str = "auto", env: Mapping[str, str] | None = None) -> Runtime:
    """The device (resolve_device, on this process's LOCAL_RANK), the precision (resolve_precision) and the
    process group's shape from torchrun's environment, decided once. ConfigError for a device this machine lacks."""
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", "1")) if "RANK" in env else 1
    rank, local_rank = (int(env["RANK"]), int(env.get("LOCAL_RANK", "0"))) if world > 1 else (0, 0)
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world))) if world > 1 else 1
    dev = resolve_device(device, local_rank)
    return Runtime(dev, resolve_precision(precision, dev), device, precision, rank, local_rank, world, local_world)


def resolve_compile(setting: str, device: torch.device) -> tuple[bool, str]:
    """Whether to torch.compile the training forward, and why. 'auto': on CUDA only. On CPU, inductor's
    kernels made two identical runs differ from the 7th step on (in the 7th digit of the loss), which
    would end bit-exact resumes and reproducible runs, so compiling there is asked for with --compile on
    (9,196 against 7,341 tokens/s eager on the tiny preset, docs/speed.md)."""
    if setting != "auto":
        return setting == "on", f"--compile {setting}"
    if device.type == "cuda":
        import torch._dynamo  # auto: a backend that fails to compile falls back to eager with a warning
        torch._dynamo.config.suppress_errors = True
        return True, "auto: CUDA"
    return False, f"auto: not on {device.type} (run-to-run reproducible; --compile on is faster)"


def autocast(device: torch.device, precision: str):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the folder holding configs/, data/, utils/, ... and train_llm.py
DISTRIBUTION = "qk-keys"  # pyproject.toml's [project] name


def package_version() -> str | None:
    """The installed qk-keys distribution's version (pyproject.toml's), None where it is not installed."""
    from importlib import metadata
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def _names_this_project(root: Path) -> bool:
    """Whether root/pyproject.toml is this project's (its name line says qk-keys)."""
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return re.search(rf'^name\s*=\s*"{DISTRIBUTION}"\s*$', text, re.MULTILINE) is not None


def git_commit(repo: str | Path | None = None) -> str | None:
    """The commit of the code's own checkout (default: the folder holding the packages, PACKAGE_ROOT), with
    "-dirty" when tracked files differ from it. None unless that folder is the top level of a git checkout of
    qk-keys: an installed copy, an archive, or a copy inside another git repository (a virtual environment in
    the user's project) has no commit of its own, and neither the working folder nor GIT_DIR picks the
    repository."""
    root = Path(repo).resolve() if repo else PACKAGE_ROOT
    if not _names_this_project(root):
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # GIT_DIR, GIT_WORK_TREE: another repo

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=root, env=env, capture_output=True, text=True, timeout=5)
    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root:
            return None
        head = git("rev-parse", "--verify", "HEAD")
        if head.returncode != 0:  # a repository without a commit yet
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.TimeoutExpired):  # no git here
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def host_fields(device: torch.device) -> dict:
    """The fields of a provenance that say which host a run on `device` trains on: device, cpu, cpu_native_bf16,
    cpu_bf16, gpu (on CUDA) and host_kind (utils.hosts, read from the others; None where the CPU is not named). The
    one source of both provenance() and this_host_kind(): the host check compares a folder's recorded kinds with
    this host's, so they must be computed alike."""
    info = {"device": str(device), "cpu": cpu_name(), "cpu_native_bf16": cpu_has_native_bf16(),
            "cpu_bf16": cpu_bf16_path()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    info["host_kind"] = host_kind(info)
    return info


def provenance(device: torch.device) -> dict:
    """Versions and hardware, recorded beside every run's results. git_commit is None where the code is not a
    git checkout of qk-keys (an installed copy); qk_keys, the installed version, then says which code it was
    (None where it is not installed either): readers print "no git commit (qk-keys 0.1.0)". The host's fields:
    host_fields."""
    import numpy
    import transformers

    return {
        "git_commit": git_commit(),
        "qk_keys": package_version(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        **({"cpu_threads_why": _thread_choice.why} if _thread_choice else {}),
        **host_fields(device),
    }


def this_host_kind(device: torch.device) -> str | None:
    """The host kind (utils.hosts) of runs trained here on `device`, as their provenance will record it (host_fields);
    None where the CPU is not named, as in their provenance."""
    return host_fields(device)["host_kind"]


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB: getrusage's ru_maxrss (KiB on Linux), or where the resource
    module is missing (Windows) the peak working set (psutil, which accelerate depends on)."""
    try:
        import resource
    except ImportError:
        import psutil
        info = psutil.Process().memory_info()
        return getattr(info, "peak_wset", info.rss) / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def usable_cores() -> int:
    """How many CPU cores this process may run on (usable_core_ids)."""
    return len(usable_core_ids())


def local_cpu_threads(local_world_size: int) -> int:
    """Threads per process so that processes on one machine do not oversubscribe its cores: the cores this process
    may use, shared among the machine's `local_world_size` processes, and never more than OMP_NUM_THREADS where it is
    set (a budget given from outside: a Ray task's CPUs, torchrun's 1, the user's own). The load is not looked at
    (set_cpu_threads's default does: utils.threads)."""
    threads = max(1, usable_cores() // max(1, local_world_size))
    budget = omp_budget()
    return min(threads, budget) if budget else threads


# glibc's mallopt parameters (malloc.h): M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 * 2 ** 20  # glibc's largest mmap threshold on 64-bit hosts
_TRIM_THRESHOLD = 2 ** 30


@functools.cache
def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed blocks of up to 32 MiB in the process (and up to 1 GiB of free heap) instead
    of handing them back to the OS: CPU training and the probe free and reallocate tensors of a few MiB every step,
    and each block handed back costs a page fault per 4 KiB when it is touched again (measured: a third of a probe's
    time went to faults, docs/speed.md). Process-wide and once; no effect on any value computed. False where the C
    library is not glibc (macOS, musl, Windows), which is left as it is."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) and
                    libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    except (OSError, AttributeError):
        return False


_thread_choice: ThreadChoice | None = None  # set_cpu_threads's last choice: the provenance's cpu_threads_why


def set_cpu_threads(asked: int, local_world_size: int) -> ThreadChoice:
    """Set torch's threads for this process and return how many and why: `asked` (--threads) where it is positive,
    else utils.threads's rule (OMP_NUM_THREADS, else the cores free at the process's first run). Inter-op threads
    follow where torch still allows it (once per process, before any parallel work: a second run in one process
    keeps the first's, which eager training does not use)."""
    global _thread_choice
    choice = _thread_choice = thread_choice(asked, local_world_size)
    torch.set_num_threads(choice.threads)
    if torch.get_num_interop_threads() != choice.threads:
        try:
            torch.set_num_interop_threads(choice.threads)
        except RuntimeError:  # already set, or parallel work has started in this process
            pass
    return choice
