"""The memory plan against the device: `--plan` prints it, a run that cannot fit is refused.

`plan_text(cfg, world_size)` is what `train_llm.py --plan` and every study's `--plan` print;
`check_fits(cfg, runtime)` is the one check every tool passes before it builds a model from a config
(training.run.train_run, loading a run folder, its export). The model is built in this machine's memory on
every device (fp32 weights, the RoPE tables of --max_seq_len), and a CPU run trains there (the whole plan:
gradients, Muon + AdamW state, activations): a need above the memory available now is refused, naming the size
field that costs the most and its largest value that fits. A CUDA run's plan with its headroom is compared with
the memory CUDA reports free (torch.cuda.mem_get_info): MemoryPlanError names the options that would fit.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch

from configs.cli import apply_overrides
from configs.config import ConfigError, RunConfig
from training.memory import GIB, HEADROOM, MemoryPlan, format_plan, needed_bytes, param_counts, plan_memory
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


def available_memory() -> int | None:
    """Bytes this machine can give a new allocation now: MemAvailable of /proc/meminfo (Linux), else the physical
    memory (None where the OS says neither)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return physical_memory()


def rope_bytes_per_position(cfg: RunConfig) -> int:
    """Peak bytes per position while models.layers.Rotary builds its tables: the float64 positions, angles
    and a float64 cos or sin, and the two float32 tables kept."""
    half = cfg.model.d_head // 2
    return 8 + half * (8 + 8 + 4 + 4)


def host_parts(cfg: RunConfig, runtime: Runtime | None) -> dict[str, int]:
    """Bytes this machine's memory holds for the model, by part: the model is built here in fp32 (its weights and
    the RoPE tables' build) on every device; a CPU run also trains here (the whole plan of training/memory.py:
    gradients, the optimizer state of Muon + AdamW, activations for batch x seq_len x d_model x layers), once
    per process. runtime None: the model is only built (inspection, export)."""
    rope = cfg.model.max_seq_len * rope_bytes_per_position(cfg)
    weights = 4 * param_counts(cfg.model).total
    if runtime is None or runtime.device.type != "cpu":
        return {"weights": weights, "rope_tables": rope}
    q = _plan(cfg, runtime.world_size, ("cpu", runtime.precision)).parts
    procs = runtime.local_world_size  # the processes on this machine, each with its model
    optimizer = q["muon_momentum"] + q["adamw_moments"] + max(q["muon_step"], q["adamw_step"])
    activations = sum(q[k] for k in ("activations", "recomputed_block", "loss_saved", "loss_workspace",
                                     "loss_gradients", "block_backward", "probe", "bf16_weight_copies"))
    return {"weights": procs * q["weights"], "gradients": procs * q["gradients"],
            "optimizer_state": procs * optimizer, "activations": procs * activations, "rope_tables": procs * rope}


SIZE_FIELDS = ("vocab_size", "d_model", "d_ff", "n_layers", "max_seq_len", "batch_size", "seq_len", "probe_batch")
_SECTION = {"batch_size": "train", "seq_len": "data", "probe_batch": "probe"}


def _value(cfg: RunConfig, field: str) -> int:
    return getattr(getattr(cfg, _SECTION.get(field, "model")), field)


def _reference(cfg: RunConfig) -> RunConfig:
    """What the sizes are compared with: the config's preset, else the defaults."""
    from configs.presets import PRESETS
    return PRESETS[cfg.preset]() if cfg.preset in PRESETS else RunConfig()


def _with(cfg: RunConfig, field: str, value: int) -> RunConfig | None:
    try:
        return apply_overrides(cfg, {field: value})
    except ConfigError:
        return None


def largest_fit(cfg: RunConfig, field: str, need: Callable[[RunConfig], int], available: int) -> int | None:
    """The largest value of `field` up to its current one with which `need` fits `available`, the other fields kept
    (None: not even the smallest). d_model moves in whole heads of an even size."""
    step = 2 * cfg.model.n_heads if field == "d_model" else 1
    lo = cfg.data.seq_len if field == "max_seq_len" else 1  # RoPE covers the blocks at least
    hi = _value(cfg, field) // step
    fits = lambda k: (c := _with(cfg, field, k * step)) is not None and need(c) <= available  # noqa: E731
    if _with(cfg, field, lo * step) is None:  # e.g. a BPE vocabulary below 260: start from the preset's value
        lo = min(_value(_reference(cfg), field), _value(cfg, field)) // step
    if not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo * step


def largest_contributor(cfg: RunConfig, need: Callable[[RunConfig], int]) -> str:
    """The size field that costs the most memory: of the fields above the preset's (or default) value, the one whose
    return to it saves the most; when none is above, the one whose halving saves the most."""
    ref, total = _reference(cfg), need(cfg)
    saved = {}
    for field in SIZE_FIELDS:
        if _value(cfg, field) > _value(ref, field):
            c = _with(cfg, field, _value(ref, field))
            saved[field] = total - need(c) if c is not None else 0
    if not saved or max(saved.values()) <= 0:
        saved = {}
        for field in SIZE_FIELDS:
            c = _with(cfg, field, max(1, _value(cfg, field) // 2))
            if c is not None:
                saved[field] = total - need(c)
    return max(saved, key=saved.get) if saved else "n_layers"  # n_layers always halves; kept for safety


def _size_fix(cfg: RunConfig, need: Callable[[RunConfig], int], available: int) -> str:
    """'The largest contributor is --F = V (...). Fix: --F N or less' for a need that does not fit."""
    field = largest_contributor(cfg, need)
    ref = _reference(cfg)
    value, base = _value(cfg, field), _value(ref, field)
    where = f"the {ref.preset} preset has {base:,}" if ref.preset != "custom" else f"the default is {base:,}"
    fit = largest_fit(cfg, field, need, available)
    fix = (f"--{field} {fit:,} or less (the other sizes as given)" if fit is not None else
           f"--{field} {base:,} and smaller other sizes (no --{field} alone fits)")
    return f"the largest contributor is --{field} {value:,} ({where}). Fix: {fix}"


def _gib(n: int) -> str:
    return f"{n / GIB:,.1f}"


def check_fits(cfg: RunConfig, runtime: Runtime | None = None) -> None:
    """The one memory check before a model is built from a config (training.run.train_run, loading a run of this
    project, its export): the model, and on CPU its whole training (weights, gradients, Muon + AdamW state,
    activations), against this machine's available memory; a CUDA run's plan against the device's free memory.
    MemoryPlanError gives the numbers and a fix naming the size field that costs the most. runtime None: the model
    is only built, not trained."""
    memory = available_memory()
    if memory:
        need = lambda c: sum(host_parts(c, runtime).values())  # noqa: E731
        parts = host_parts(cfg, runtime)
        total = sum(parts.values())
        if total > memory:
            what = "training it on cpu" if runtime is not None and runtime.device.type == "cpu" else "building it"
            listed = ", ".join(f"{k.replace('_', ' ')} {_gib(v)}" for k, v in parts.items() if v >= total / 1000)
            raise MemoryPlanError(
                f"the model ({param_counts(cfg.model).total:,} parameters) does not fit in this machine's memory: "
                f"{what} needs {_gib(total)} GiB ({listed}) but {_gib(memory)} GiB is available; "
                f"{_size_fix(cfg, need, memory)}")
    if runtime is None or runtime.device.type != "cuda":
        return
    device, world_size = runtime.device, runtime.world_size
    plan = _plan(cfg, world_size, (device.type, runtime.precision))
    need = needed_bytes(plan)
    free, total = cuda_free(device)
    if need <= free:
        return
    options = fit_options(cfg, world_size, free)
    fix = ("options that fit: " + "; ".join(options)) if options else \
        _size_fix(cfg, lambda c: needed_bytes(_plan(c, world_size, (device.type, runtime.precision))), free)
    raise MemoryPlanError(
        f"the run needs {need / GIB:.1f} GiB per device ({plan.peak_phase} peak {plan.peak / GIB:.1f} GiB + "
        f"{HEADROOM:.0%} headroom; --plan lists every part) but {device} has {free / GIB:.1f} GiB free of "
        f"{total / GIB:.1f}. {fix}")
