"""Measurements of this machine and of the training step and probe (research/benchmark.py runs them).

Each measurement of a model config runs in a fresh process (`python -m research.speed.measure ...`)
so that its peak RSS is its own; it prints one JSON object. Training steps use random tokens (the
data pipeline is not on the hot path: batches are slices of a memory-mapped array).
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time

from utils.cli import ArgumentParser, command, positive_int

import torch

from configs import ModelConfig, TrainConfig, flops_per_token, get_preset
from configs.config import COMPILE_MODES
from models import MinimalLLM
from optimizers import build_optimizers
from research.speed.reference import ReferenceLM, reference_optimizers
from research.speed.variants import measure_variants, timed_fields
from utils.runtime import autocast, cpu_has_native_bf16, peak_rss_mib, resolve_compile

# The write-ups' small reference config: 8 layers, d_model 256, 4 heads (2 KV), d_ff 1024, vocab 8192, 8 x 256.
REFERENCE = (ModelConfig(vocab_size=8192, n_layers=8, d_model=256, n_heads=4, n_kv_heads=2, d_ff=1024,
                         max_seq_len=256), 8, 256)


def configs() -> dict[str, tuple[ModelConfig, int, int]]:
    tiny = get_preset("tiny")
    return {"tiny": (tiny.model, tiny.train.batch_size, tiny.data.seq_len), "reference": REFERENCE}


def matmul_ceiling(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """Best-of-`repeats` FLOP/s of an n x n x n matmul."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def _build(impl: str, mc: ModelConfig, precision: str, compile_setting: str):
    """(the model, its optimizers, compiled?) for the project or the reference step."""
    torch.manual_seed(0)
    if impl == "reference":
        model = ReferenceLM(mc)
        ortho = torch.bfloat16 if precision == "bf16" else torch.float32
        return model, reference_optimizers(model, ortho_dtype=ortho), False
    model = MinimalLLM(mc)
    opts, _ = build_optimizers(model, TrainConfig(), precision=precision)  # Muon in the measured precision
    compiled, _ = resolve_compile(compile_setting, torch.device("cpu"))
    if compiled:
        model.compile_blocks()  # as training compiles
    return model, opts, compiled


def _stepper(name: str, impl: str, precision: str, compile_setting: str, losses: list | None = None):
    """(step() -> (step seconds, Muon seconds), the model, compiled?) for one config and implementation; each step's
    loss appended to `losses` as float.hex where given."""
    mc, B, T = configs()[name]
    model, opts, compiled = _build(impl, mc, precision, compile_setting)
    muon = [o for o in opts if "Muon" in type(o).__name__]
    others = [o for o in opts if o not in muon]
    device = torch.device("cpu")
    x = torch.randint(0, mc.vocab_size, (B, T + 1))

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        with autocast(device, precision):
            loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for o in others:
            o.step()
        t1 = time.perf_counter()
        for o in muon:
            o.step()
        t2 = time.perf_counter()
        for o in opts:
            o.zero_grad(set_to_none=True)
        if losses is not None:
            losses.append(float(loss.detach()).hex())
        return t2 - t0, t2 - t1
    return step, model, compiled


def measure_training(name: str, precision: str, steps: int, impl: str = "project",
                     compile_setting: str = "auto") -> dict:
    """Median step time of `steps` training steps (after warm-up) of the project or the reference."""
    mc, B, T = configs()[name]
    step, model, compiled = _stepper(name, impl, precision, compile_setting)
    first = step()[0]  # includes compilation when compiled
    for _ in range(2):
        step()
    times = sorted(step() for _ in range(steps))
    step_s, muon_s = times[len(times) // 2]
    ceiling = ceiling_here(precision)
    tokens_per_s = B * T / step_s
    return {"config": name, "impl": impl, "precision": precision, "compiled": compiled, "batch": [B, T],
            "params": sum(p.numel() for p in model.parameters()), "flops_per_token": flops_per_token(mc, T),
            "tokens_per_s": tokens_per_s, "step_ms": 1e3 * step_s, "muon_share": muon_s / step_s,
            "first_step_s": first, "peak_rss_mib": peak_rss_mib(),
            "ceiling_tflops": ceiling and ceiling / 1e12,
            "mfu": ceiling and tokens_per_s * flops_per_token(mc, T) / ceiling}


def ceiling_here(precision: str) -> float | None:
    """The matmul ceiling of `precision` in this process, with its threads, right after the step was timed (a shared
    host's speed drifts between processes); None for bf16 on a CPU that emulates it, whose step runs far below its
    own ceiling (no meaningful share)."""
    if precision == "bf16" and not cpu_has_native_bf16():
        return None
    return matmul_ceiling(torch.bfloat16 if precision == "bf16" else torch.float32)


def measure_compile(name: str, precision: str, steps: int, compile_setting: str) -> dict:
    """`steps` training steps of `name` from seed 0 (the benchmark's step, its one batch), compiled or not: each
    step's loss (as float.hex, compared bit for bit between processes), the first step's seconds (compilation
    included where compiled) and the median of the others."""
    losses: list[str] = []
    step, _, compiled = _stepper(name, "project", precision, compile_setting, losses)
    times = [step()[0] for _ in range(steps)]
    rest = sorted(times[1:])
    return {"config": name, "precision": precision, "compiled": compiled, "steps": steps, "losses": losses,
            "first_step_s": times[0], "step_s": rest[len(rest) // 2] if rest else None}


def measure_pair(name: str, precision: str, steps: int, compile_setting: str = "auto") -> dict:
    """The project's step against the reference's at one precision, their steps alternating in one process, so
    that a slower or faster spell of a shared machine touches both: the median of the per-pair time ratios."""
    mc, B, T = configs()[name]
    project, _, compiled = _stepper(name, "project", precision, compile_setting)
    reference, _, _ = _stepper(name, "reference", precision, "off")
    for _ in range(3):
        project(), reference()
    pairs = [(project()[0], reference()[0]) for _ in range(steps)]
    ratios = sorted(r / p for p, r in pairs)
    return {"config": name, "precision": precision, "compiled": compiled, "steps": steps,
            "project_tokens_per_s": B * T / sorted(p for p, _ in pairs)[steps // 2],
            "reference_tokens_per_s": B * T / sorted(r for _, r in pairs)[steps // 2],
            "speedup": ratios[steps // 2], "speedup_range": [ratios[0], ratios[-1]]}


def _best_time(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure_probe(name: str, probe_precision: str, repeats: int = 3) -> dict:
    """Full key probe vs a plain no-grad forward on the same evaluation batch (B x T of the config)."""
    from research.probing.probe import KeyProbe

    mc, B, T = configs()[name]
    torch.manual_seed(0)
    model = MinimalLLM(mc).eval()
    ids = torch.randint(0, mc.vocab_size, (B, T))
    probe = KeyProbe(ids, probe_precision)
    with torch.no_grad():
        fwd_fp32 = _best_time(lambda: model(ids), repeats)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fwd_bf16 = _best_time(lambda: model(ids), repeats)
    return {"config": name, "probe_precision": probe_precision, "probe_s": _best_time(lambda: probe(model), repeats),
            "forward_fp32_s": fwd_fp32, "forward_bf16_s": fwd_bf16,
            "peak_rss_mib": peak_rss_mib()}


def measure_probe_memory(n_layers: int) -> dict:
    """Peak RSS of probing the 1b preset's layer shape (d_model 2048, 16/8 heads, d_head 128) on an
    8 x 2048 batch, with `n_layers` layers of random weights. Weights are measured separately so the
    probe's own working set can be compared with its bound."""
    from research.probing.probe import KeyProbe

    mc = dataclasses.replace(get_preset("1b").model, n_layers=n_layers)
    torch.manual_seed(0)
    model = MinimalLLM(mc).eval()
    base = peak_rss_mib()
    ids = torch.randint(0, mc.vocab_size, (8, 2048))
    t = time.perf_counter()
    rec = KeyProbe(ids)(model)
    return {"n_layers": n_layers, "params": model.num_params(), "rss_after_weights_mib": base,
            "peak_rss_mib": peak_rss_mib(),
            "probe_s": time.perf_counter() - t, "mean_pr": rec["mean_pr"]}


def measure_logit_tracking(name: str, steps: int) -> dict:
    """QK-clip's per-step max-logit tracking (training.observers.LogitMax, at the model's hook points) as a share of
    the training step, without QK-norm (where QK-clip is used): steps with and without tracking alternate in one
    process."""
    from training.observers import LogitMax
    mc, B, T = configs()[name]
    torch.manual_seed(0)
    model = MinimalLLM(dataclasses.replace(mc, qk_norm="none"))
    opts, _ = build_optimizers(model, TrainConfig())
    x = torch.randint(0, mc.vocab_size, (B, T + 1))
    logits = LogitMax(model.blocks, torch.device("cpu"))

    def step(track: bool) -> float:
        logits.on = track
        t = time.perf_counter()
        model(x[:, :-1], x[:, 1:]).backward()
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        return time.perf_counter() - t
    for _ in range(3):
        step(True), step(False)
    shares = sorted(1 - plain / tracked for tracked, plain in ((step(True), step(False)) for _ in range(steps)))
    return {"config": name, "steps": steps, "share": shares[steps // 2], "range": [shares[0], shares[-1]]}


def run(kind: str, config: str, precision: str, steps: int, layers: int, impl: str = "project",
        compile_setting: str = "auto") -> dict:
    """One measurement, as a child process runs it."""
    if kind == "training":
        return measure_training(config, precision, steps, impl, compile_setting)
    if kind == "pair":
        return measure_pair(config, precision, steps, compile_setting)
    if kind == "compile":
        return measure_compile(config, precision, steps, compile_setting)
    if kind == "probe":
        return measure_probe(config, precision)
    if kind == "probe-memory":
        return measure_probe_memory(layers)
    if kind == "logit-tracking":
        return measure_logit_tracking(config, steps)
    if kind == "variants":
        return measure_variants(steps)
    if kind == "telemetry":
        from research.speed.telemetry import measure_telemetry
        return measure_telemetry(steps)
    if kind == "kv-formats":
        from research.speed.kv_formats import measure_kv_formats
        return measure_kv_formats(steps)
    raise ValueError(f"unknown measurement {kind!r}")


def in_child(kind: str, config: str = "tiny", precision: str = "fp32", steps: int = 10, layers: int = 2,
             impl: str = "project", compile_setting: str = "auto") -> dict:
    """Run one measurement in a fresh Python process and return its JSON result."""
    return child_json("research.speed.measure", [kind, "--config", config, "--precision", precision, "--steps",
                                                 str(steps), "--layers", str(layers), "--impl", impl,
                                                 "--compile", compile_setting])


def child_json(module: str, argv: list[str], env: dict[str, str] | None = None) -> dict:
    """`python -m module *argv` in a fresh process (with `env`, else this one's); the JSON object its last line
    prints."""
    out = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"benchmark child {module} {argv} failed (exit {out.returncode}): {tail[0][:300]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# The measurements a child process runs (`run`), by kind, as --help describes them.
MEASUREMENTS = {
    "training": "median training step of --config (tokens/s, Muon's share, peak RSS), of --impl",
    "pair": "the project's step against the reference's, alternating in one process: the median speed-up",
    "compile": "--steps training steps from seed 0 on seeded tokens, compiled or not (--compile): each loss bit for "
               "bit, the first step's seconds and the others' median",
    "probe": "the full key probe against a plain no-grad forward on the same batch, at --precision",
    "probe-memory": "peak RSS of probing --layers layers of the 1b preset's layer shape",
    "logit-tracking": "QK-clip's max-logit tracking as a share of the training step (no QK-norm)",
    "variants": f"each study variant's training step ({', '.join(timed_fields())}) against the default's, on the tiny "
                f"preset, alternating in one process: the median time ratio",
    "telemetry": "the per-step telemetry's cost (logit_max, key_norm, update_rms at every step, as log_every 1 "
                 "logs) on the tiny preset's training step, with and without, alternating in one process: the median "
                 "relative cost",
    "kv-formats": "the key-cache section with and without the key-cache formats on the tiny preset's model and the "
                  "section's 8 sequences, --steps rounds alternating: the formats' cost in plain forwards",
}


def build_parser() -> ArgumentParser:
    kinds = "; ".join(f"{k}: {v}" for k, v in MEASUREMENTS.items())
    ref = REFERENCE[0]
    p = ArgumentParser(description=f"{__doc__.rstrip()}\n\nOne measurement in this process; prints one JSON object.")
    p.add_argument("kind", choices=list(MEASUREMENTS), help=f"The measurement. {kinds}. Required")
    p.add_argument("--config", default="tiny", choices=list(configs()),
                   help=f"Model config: tiny (the tiny preset's model and batch) or reference (the write-ups' small "
                        f"model: {ref.n_layers} layers, d_model {ref.d_model}, {ref.n_heads} heads, batch "
                        f"{REFERENCE[1]} x {REFERENCE[2]}). Default: %(default)s")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="Precision of the training step (bf16: autocast), or of the probe's forward. "
                        "Default: %(default)s")
    p.add_argument("--steps", type=positive_int, default=10,
                   help="Timed training steps, after 3 warm-up steps (training, pair, logit-tracking; variants: "
                        "rounds of one step of each variant, after 2; telemetry: rounds of a step with and one "
                        "without, after 2). "
                        "Default: %(default)s")
    p.add_argument("--layers", type=positive_int, default=2,
                   help="Layers of the 1b-shaped model (probe-memory). Default: %(default)s")
    p.add_argument("--impl", default="project", choices=["project", "reference"],
                   help="Whose training step: this project's or the plain reference's (research/speed/reference.py; "
                        "training). Default: %(default)s")
    p.add_argument("--compile", default="auto", choices=COMPILE_MODES,
                   help="torch.compile of the project's step: auto decides as training does (utils.runtime: on "
                        "CUDA only). Default: %(default)s")
    return p


@command
def main(argv: list[str] | None = None) -> None:
    a = build_parser().parse_args(argv)
    print(json.dumps(run(a.kind, a.config, a.precision, a.steps, a.layers, a.impl, a.compile)))


if __name__ == "__main__":  # one measurement, e.g. python -m research.speed.measure probe-memory --layers 4
    main()
