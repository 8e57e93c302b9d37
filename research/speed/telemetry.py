"""The cost of the per-step telemetry (training/step_telemetry.py) on the training step: `python -m
research.speed.measure telemetry --steps 50` prints it as JSON.

Two copies of the preset's model (same initial weights, same batch) train side by side, one with the telemetry of a
logged step at every step (as the spike study logs, log_every 1), one without; each round times one step of each, in
alternating order, so a slower or faster spell of a shared machine touches both alike. The cost is the median over
rounds of (step with telemetry) / (step without) - 1. The step is the trainer's: forward and loss, backward, clipping,
the Muon and AdamW steps, and with telemetry its begin, the weight copy around the optimizer steps and the fields.
"""
from __future__ import annotations

import time

import torch

from configs import apply_overrides, get_preset
from models import MinimalLLM
from optimizers import build_optimizers
from training.step_telemetry import StepTelemetry
from utils.runtime import Runtime


def _stepper(cfg, x: torch.Tensor, telemetry: bool):
    torch.manual_seed(0)
    model = MinimalLLM(cfg.model)
    opts, _ = build_optimizers(model, cfg.train)
    tel = StepTelemetry(model.blocks, opts, Runtime(torch.device("cpu"), "fp32")) if telemetry else None

    def step() -> float:
        t = time.perf_counter()
        if tel:
            tel.begin()
        model(x[:, :-1], x[:, 1:]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip).item()
        if tel:
            tel.before_update()
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        if tel:
            tel.after_update()
            tel.fields()
        return time.perf_counter() - t
    return step


def measure_telemetry(steps: int, preset: str = "tiny") -> dict:
    """{"cost": median relative cost of the telemetry, "range": [min, max] over rounds, "step_ms": {"on", "off"}}
    on the preset's model and batch, fp32, eager, on the CPU."""
    cfg = apply_overrides(get_preset(preset), {"precision": "fp32", "compile": "off"})
    torch.manual_seed(0)
    x = torch.randint(0, cfg.model.vocab_size, (cfg.train.batch_size, cfg.data.seq_len + 1))
    on, off = _stepper(cfg, x, True), _stepper(cfg, x, False)
    for _ in range(2):  # warm-up
        on(), off()
    rounds = [(on(), off()) if i % 2 else tuple(reversed((off(), on()))) for i in range(steps)]
    costs = sorted(a / b - 1 for a, b in rounds)
    median = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    return {"preset": preset, "batch": [cfg.train.batch_size, cfg.data.seq_len], "precision": "fp32",
            "steps": steps, "torch_threads": torch.get_num_threads(), "cost": median(costs),
            "range": [costs[0], costs[-1]], "step_ms": {"on": 1e3 * median([a for a, _ in rounds]),
                                                        "off": 1e3 * median([b for _, b in rounds])}}
