"""Measure this machine: matmul ceilings, training throughput, MFU, Muon's share, peak memory.

    python research/benchmark.py            # human-readable table
    python research/benchmark.py --json     # one JSON object

Each model config is measured in a fresh subprocess so that its peak RSS is its own.
Training steps use random tokens (the data pipeline is not on the hot path: batches are
slices of a memory-mapped array).

FLOPs per token (configs.flops_per_token): 6 x (matmul weights incl. the LM head)
+ 6 x n_layers x seq_len x d_model for causal attention (QK^T and AV, forward 2 x 2 x T x d
halved by the mask, backward twice the forward). MFU = tokens/s x FLOPs per token / ceiling,
against the measured matmul ceiling of the precision the step runs in.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time

import torch

from configs import ModelConfig, TrainConfig, flops_per_token, get_preset
from models import MinimalLLM
from optimizers import build_optimizers
from utils.runtime import autocast, resolve_precision

# The write-ups' small reference config: 8 layers, d_model 256, 4 heads (2 KV), d_ff 1024, vocab 8192, 8 x 256.
REFERENCE = (ModelConfig(vocab_size=8192, n_layers=8, d_model=256, n_heads=4, n_kv_heads=2, d_ff=1024,
                         max_seq_len=256), 8, 256)


DEFAULT_PROBE_EVERY = 25  # the studies' default probe interval


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


def measure_training(name: str, precision: str, steps: int) -> dict:
    mc, B, T = configs()[name]
    torch.manual_seed(0)
    model = MinimalLLM(mc)
    opts, _ = build_optimizers(model, TrainConfig())
    muon = [o for o in opts if type(o).__name__ == "Muon"]
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
        return t2 - t0, t2 - t1

    for _ in range(3):
        step()
    times = [step() for _ in range(steps)]
    total = sum(t for t, _ in times)
    tokens_per_s = steps * B * T / total
    return {"config": name, "precision": precision, "batch": [B, T], "params": model.num_params(),
            "flops_per_token": flops_per_token(mc, T), "tokens_per_s": tokens_per_s,
            "step_ms": 1e3 * total / steps, "muon_share": sum(m for _, m in times) / total,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


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
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure_probe_memory(n_layers: int) -> dict:
    """Peak RSS of probing the 1b preset's layer shape (d_model 2048, 16/8 heads, d_head 128) on an
    8 x 2048 batch, with `n_layers` layers of random weights. Weights are measured separately so the
    probe's own working set can be compared with its bound."""
    from research.probing.probe import KeyProbe

    mc = dataclasses.replace(get_preset("1b").model, n_layers=n_layers)
    torch.manual_seed(0)
    model = MinimalLLM(mc).eval()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ids = torch.randint(0, mc.vocab_size, (8, 2048))
    t = time.perf_counter()
    rec = KeyProbe(ids)(model)
    return {"n_layers": n_layers, "params": model.num_params(), "rss_after_weights_mib": base,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "probe_s": time.perf_counter() - t, "mean_pr": rec["mean_pr"]}


def child(args) -> None:
    if args.child == "probe-memory":
        print(json.dumps(measure_probe_memory(args.layers)))
    elif args.probe_child:
        print(json.dumps(measure_probe(args.child, args.precision)))
    else:
        print(json.dumps(measure_training(args.child, args.precision, args.steps)))


def run_child(*argv: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"benchmark child {argv} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--steps", type=int, default=10, help="timed training steps per config (after 3 warm-up)")
    p.add_argument("--configs", nargs="+", default=list(configs()), choices=list(configs()))
    p.add_argument("--probe-every", type=int, default=DEFAULT_PROBE_EVERY,
                   help="probe interval (optimizer steps) for the overhead estimate")
    p.add_argument("--no-probe", action="store_true", help="skip the probe measurements")
    p.add_argument("--probe-memory-layers", type=int, default=2,
                   help="layers of the 1b-shaped model for the probe memory check (0 skips it)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--probe-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    ceil = {"fp32": matmul_ceiling(torch.float32), "bf16": matmul_ceiling(torch.bfloat16)}
    auto = resolve_precision("auto", torch.device("cpu"))
    result = {"threads": torch.get_num_threads(), "auto_precision": auto,
              "matmul_tflops": {k: v / 1e12 for k, v in ceil.items()}, "configs": {}}
    for name in args.configs:
        runs = {}
        for prec in ("fp32", "bf16"):
            r = run_child("--child", name, "--precision", prec, "--steps", str(args.steps))
            r["mfu_fp32"] = r["tokens_per_s"] * r["flops_per_token"] / ceil["fp32"]
            r["mfu_bf16"] = r["tokens_per_s"] * r["flops_per_token"] / ceil["bf16"]
            r["mfu"] = r[f"mfu_{prec}"]
            runs[prec] = r
        # Top-level numbers are those of the precision training uses here (precision=auto).
        result["configs"][name] = entry = {**runs[auto], "by_precision": runs}
        if not args.no_probe:
            entry["probe"] = {pp: run_child("--child", name, "--probe-child", "--precision", pp)
                              for pp in ("fp32", "bf16")}
            step_s = runs[auto]["step_ms"] / 1e3
            for pp, r in entry["probe"].items():
                r["overhead_share"] = r["probe_s"] / (r["probe_s"] + args.probe_every * step_s)
            entry["probe_every"] = args.probe_every
    if not args.no_probe and args.probe_memory_layers:
        result["probe_memory_1b"] = run_child("--child", "probe-memory", "--layers", str(args.probe_memory_layers))

    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"threads {result['threads']}; matmul 2048^3 ceiling: fp32 {ceil['fp32'] / 1e12:.3f} TFLOP/s, "
          f"bf16 {ceil['bf16'] / 1e12:.3f} TFLOP/s; training precision (auto): {auto}")
    print(f"{'config':<10} {'prec':<5} {'params':>10} {'tokens/s':>10} {'step ms':>9} {'MFU':>7} "
          f"{'Muon share':>10} {'peak RSS MiB':>12}")
    for name, entry in result["configs"].items():
        for prec, r in entry["by_precision"].items():
            print(f"{name:<10} {prec:<5} {r['params']:>10,} {r['tokens_per_s']:>10,.0f} {r['step_ms']:>9.1f} "
                  f"{r['mfu']:>7.1%} {r['muon_share']:>10.1%} {r['peak_rss_mib']:>12.0f}")
    for name, entry in result["configs"].items():
        for pp, r in entry.get("probe", {}).items():
            print(f"probe {name} ({pp} forward, batch {' x '.join(map(str, entry['batch']))}): {r['probe_s']:.3f} s; "
                  f"plain no-grad forward {r['forward_fp32_s']:.3f} s fp32 / {r['forward_bf16_s']:.3f} s bf16; "
                  f"overhead at probe_every={entry['probe_every']}: {r['overhead_share']:.2%} of training time")
    if "probe_memory_1b" in result:
        m = result["probe_memory_1b"]
        print(f"probe memory, 1b layer shape x {m['n_layers']} layers ({m['params']:,} params), batch 8 x 2048: "
              f"RSS {m['rss_after_weights_mib']:.0f} MiB after weights, peak {m['peak_rss_mib']:.0f} MiB "
              f"({m['probe_s']:.1f} s)")


if __name__ == "__main__":
    main()
