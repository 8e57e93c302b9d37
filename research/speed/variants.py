"""The training step of each study variant (each value configs/config.py names for a variant field to time) against
the default recipe, in one process: `python -m research.speed.measure variants --steps 20` prints it as JSON.

Every round runs one step of each variant in turn on the same batch, so a slower or faster spell of a shared machine
touches all of them alike; a variant's cost is the median over rounds of its step time divided by the default's in
the same round (1.10: 10% slower). The step is the trainer's: forward and loss (the z-loss objective where set),
backward, clipping, the AdamW and Muon steps, with each variant's optimizer split (optimizers.build_optimizers).
"""
from __future__ import annotations

import time

import torch

from configs import apply_overrides, get_preset
from configs.config import declared, field_hints
from configs.fields import coerce_value
from models import MinimalLLM
from optimizers import build_optimizers


def timed_fields() -> list[str]:
    """The variant fields the benchmark times: those whose declaration (configs/config.py) names values to time."""
    return [name for name, (_, f) in declared().items() if f.metadata["timed"]]


def variants() -> dict[str, dict]:
    """name -> config overrides: the default recipe, then each value each field's declaration times (docs/
    study_files.md's study's soft-cap 15, the field's usual value: z-loss 1e-4 as PaLM), named as a command line
    writes it ("attn_softcap=15")."""
    out: dict[str, dict] = {"default": {}}
    for name, (_, f) in declared().items():
        hint = field_hints()[name][1]
        out.update({f"{name}={text}": {name: coerce_value(name, hint, text, "")} for text in f.metadata["timed"]})
    return out


def _stepper(preset: str, overrides: dict, x: torch.Tensor):
    cfg = apply_overrides(get_preset(preset), {**overrides, "precision": "fp32", "compile": "off"})
    torch.manual_seed(0)
    model = MinimalLLM(cfg.model)
    model.z_loss = cfg.train.z_loss
    opts, _ = build_optimizers(model, cfg.train)

    def step() -> float:
        t = time.perf_counter()
        model(x[:, :-1], x[:, 1:]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        return time.perf_counter() - t
    return step, sum(p.numel() for p in model.parameters())


def measure_variants(steps: int, preset: str = "tiny") -> dict:
    """{variant: {"ratio": median step-time ratio to the default, "range": [min, max] over rounds, "step_ms":
    median step, "params": parameters}} on the preset's model and batch, fp32, eager, on the CPU."""
    base = get_preset(preset)
    torch.manual_seed(0)
    x = torch.randint(0, base.model.vocab_size, (base.train.batch_size, base.data.seq_len + 1))
    steppers = {name: _stepper(preset, o, x) for name, o in variants().items()}
    for _ in range(2):  # warm-up
        for step, _ in steppers.values():
            step()
    rounds = [{name: step() for name, (step, _) in steppers.items()} for _ in range(steps)]
    out = {}
    for name, (_, params) in steppers.items():
        ratios = sorted(r[name] / r["default"] for r in rounds)
        times = sorted(r[name] for r in rounds)
        out[name] = {"ratio": ratios[steps // 2], "range": [ratios[0], ratios[-1]], "step_ms": 1e3 * times[steps // 2],
                     "params": params}
    return {"preset": preset, "batch": [base.train.batch_size, base.data.seq_len], "precision": "fp32",
            "steps": steps, "torch_threads": torch.get_num_threads(), "variants": out}
