"""The memory plan against the device: `--plan` prints it, a CUDA run that cannot fit is refused.

`plan_text(cfg, world_size)` is what `train_llm.py --plan` and every study's `--plan` print;
`check_fits(cfg, runtime)` runs before the model is built (training.run.train_run) and raises
MemoryPlanError, naming the options that would fit, when the plan with its headroom exceeds the memory
CUDA reports free (torch.cuda.mem_get_info). On every device the model is first built in this machine's
memory, whose RoPE tables grow with --max_seq_len: tables that would take more than half of the physical
memory (os.sysconf) are refused, naming a --max_seq_len that fits. Otherwise nothing is refused on CPU:
the plan is printed on request.
"""
from __future__ import annotations

import os

import torch

from configs.cli import apply_overrides
from configs.config import ConfigError, RunConfig
from training.memory import GIB, HEADROOM, MemoryPlan, format_plan, needed_bytes, plan_memory
from utils.runtime import Runtime, resolve_precision

DEVICE_COUNTS = (2, 4, 8, 16, 32)  # FSDP sizes tried when naming options


class MemoryPlanError(ConfigError):
    """The run's planned peak does not fit the device; the message names options that would."""


def plan_target(cfg: RunConfig) -> tuple[str, str]:
    """(device type, precision) the run would use, without touching a GPU: --device cuda plans for CUDA even
    on a machine without one; precision auto is what the Trainer would pick (bf16 on CUDA without a GPU here)."""
    name = cfg.train.device
    cuda = name.startswith("cuda") or (name == "auto" and torch.cuda.is_available())
    if cfg.train.precision != "auto":
        return ("cuda" if cuda else "cpu"), cfg.train.precision
    if cuda:  # the GPU here decides (fp32 where it has no bf16); planning without one assumes bf16
        return "cuda", resolve_precision("auto", torch.device("cuda")) if torch.cuda.is_available() else "bf16"
    return "cpu", resolve_precision("auto", torch.device("cpu"))


def _plan(cfg: RunConfig, world_size: int, target: tuple[str, str] | None = None, **overrides) -> MemoryPlan:
    """The plan on `target` (device type, precision): the runtime's where one is settled, else plan_target's."""
    device_type, precision = target or plan_target(cfg)
    return plan_memory(apply_overrides(cfg, overrides) if overrides else cfg, device_type, precision, world_size)


def fit_options(cfg: RunConfig, world_size: int, available: int) -> list[str]:
    """Changes that bring the planned need (peak + HEADROOM) under `available` bytes, each with its need:
    the largest micro-batch that fits (grad_accum raised to keep the tokens per step), gradient checkpointing
    (alone, then with a smaller micro-batch), FSDP over the fewest devices that fit."""
    t, out = cfg.train, []

    def fits(world: int, **over) -> int | None:
        need = needed_bytes(_plan(cfg, world, **over))
        return need if need <= available else None

    def smaller_batch(**over) -> str | None:
        b, a = t.batch_size, t.grad_accum
        while b % 2 == 0 and b // 2 >= world_size:
            b, a = b // 2, a * 2
            need = fits(world_size, batch_size=b, grad_accum=a, **over)
            if need:
                extra = "".join(f" --{k} {str(v).lower()}" for k, v in over.items())
                return f"--batch_size {b} --grad_accum {a}{extra} ({need / GIB:.1f} GiB)"
        return None

    out.append(smaller_batch())
    if not t.grad_checkpointing:
        need = fits(world_size, grad_checkpointing=True)
        out.append(f"--grad_checkpointing true ({need / GIB:.1f} GiB)" if need
                   else smaller_batch(grad_checkpointing=True))
    if t.shard == "none" and not t.qk_clip:  # FSDP does not take QK-clip yet
        for n in (c for c in DEVICE_COUNTS if c >= world_size and t.batch_size % c == 0):
            need = fits(n, shard="fsdp")
            if need:
                launch = "" if n == world_size else f" under torchrun --nproc_per_node {n} (one GPU each)"
                out.append(f"--shard fsdp{launch} ({need / GIB:.1f} GiB per device)")
                break
    return [o for o in out if o]


def cuda_free(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device as the driver reports them."""
    return torch.cuda.mem_get_info(device)


def plan_text(cfg: RunConfig, world_size: int = 1) -> str:
    """The plan as printed by --plan; on a machine with CUDA, against the free memory of the current device,
    with the options that would fit when it does not."""
    plan = _plan(cfg, world_size)
    if plan.device_type != "cuda" or not torch.cuda.is_available():
        return format_plan(plan, cfg)
    device = torch.device("cuda", torch.cuda.current_device())
    free, total = cuda_free(device)
    text = format_plan(plan, cfg, available=free, where=f" free on {device} (of {total / GIB:.1f})")
    if needed_bytes(plan) > free:
        options = fit_options(cfg, world_size, free)
        text += "\n  options that fit: " + ("; ".join(options) if options else "none of micro-batch, checkpointing "
                                              "or FSDP up to 32 devices")
    return text


def physical_memory() -> int | None:
    """Bytes of memory this machine has (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def rope_bytes_per_position(cfg: RunConfig) -> int:
    """Peak bytes per position while models.layers.Rotary builds its tables: the float64 positions, angles
    and a float64 cos or sin, and the two float32 tables kept."""
    half = cfg.model.d_head // 2
    return 8 + half * (8 + 8 + 4 + 4)


def check_rope_fits(cfg: RunConfig, memory: int | None = None) -> None:
    """Refuse a --max_seq_len whose RoPE tables would take more than half of this machine's memory."""
    memory = physical_memory() if memory is None else memory
    if not memory:
        return
    per = rope_bytes_per_position(cfg)
    need = cfg.model.max_seq_len * per
    if need <= memory // 2:
        return
    fits = memory // 2 // per
    suggest = max(cfg.data.seq_len, 1 << (fits.bit_length() - 1)) if fits >= cfg.data.seq_len else cfg.data.seq_len
    raise MemoryPlanError(
        f"--max_seq_len {cfg.model.max_seq_len:,}: the model's RoPE tables (built for every position up to "
        f"max_seq_len, in this machine's memory before any device) need {need / GIB:.1f} GiB, more than half of the "
        f"{memory / GIB:.1f} GiB this machine has. Fix: --max_seq_len {suggest} (up to {fits:,} fits; the run's "
        f"blocks need only --seq_len {cfg.data.seq_len})")


def check_fits(cfg: RunConfig, runtime: Runtime) -> None:
    """Refuse a model whose RoPE tables cannot be built in this machine's memory, and a CUDA run whose planned
    need exceeds the device's free memory (MemoryPlanError names options); the device, precision and process
    count are the runtime's."""
    check_rope_fits(cfg)
    device, world_size = runtime.device, runtime.world_size
    if device.type != "cuda":
        return
    plan = _plan(cfg, world_size, (device.type, runtime.precision))
    need = needed_bytes(plan)
    free, total = cuda_free(device)
    if need <= free:
        return
    options = fit_options(cfg, world_size, free)
    fix = ("options that fit: " + "; ".join(options)) if options else \
        "no micro-batch, checkpointing or FSDP setting up to 32 devices fits: use a smaller model or larger GPUs"
    raise MemoryPlanError(
        f"the run needs {need / GIB:.1f} GiB per device ({plan.peak_phase} peak {plan.peak / GIB:.1f} GiB + "
        f"{HEADROOM:.0%} headroom; --plan lists every part) but {device} has {free / GIB:.1f} GiB free of "
        f"{total / GIB:.1f}. {fix}")
