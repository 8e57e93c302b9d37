"""The benchmark suite: every measurement of research.speed.measure, combined into one result, and its table."""
from __future__ import annotations

import torch

from research.speed.measure import in_child, matmul_ceiling
from utils.runtime import resolve_precision


def run_suite(configs: list[str], steps: int, probe_every: int, probe: bool, probe_memory_layers: int) -> dict:
    """Matmul ceilings, then per config the training step in fp32 and bf16 (tokens/s, MFU, Muon's share,
    peak RSS), the probe against a plain forward, and the probe's memory at the 1b layer shape."""
    ceil = {"fp32": matmul_ceiling(torch.float32), "bf16": matmul_ceiling(torch.bfloat16)}
    auto = resolve_precision("auto", torch.device("cpu"))
    result = {"threads": torch.get_num_threads(), "auto_precision": auto,
              "matmul_tflops": {k: v / 1e12 for k, v in ceil.items()}, "configs": {}}
    for name in configs:
        runs = {}
        for prec in ("fp32", "bf16"):
            r = in_child("training", name, prec, steps)
            r["mfu_fp32"] = r["tokens_per_s"] * r["flops_per_token"] / ceil["fp32"]
            r["mfu_bf16"] = r["tokens_per_s"] * r["flops_per_token"] / ceil["bf16"]
            r["mfu"] = r[f"mfu_{prec}"]
            runs[prec] = r
        # Top-level numbers are those of the precision training uses here (precision=auto).
        result["configs"][name] = entry = {**runs[auto], "by_precision": runs}
        if probe:
            entry["probe"] = {pp: in_child("probe", name, pp) for pp in ("fp32", "bf16")}
            step_s = runs[auto]["step_ms"] / 1e3
            for r in entry["probe"].values():
                r["overhead_share"] = r["probe_s"] / (r["probe_s"] + probe_every * step_s)
            entry["probe_every"] = probe_every
    if probe and probe_memory_layers:
        result["probe_memory_1b"] = in_child("probe-memory", layers=probe_memory_layers)
    return result


def table(result: dict) -> str:
    """The suite's result as lines for a terminal."""
    t = result["matmul_tflops"]
    lines = [f"threads {result['threads']}; matmul 2048^3 ceiling: fp32 {t['fp32']:.3f} TFLOP/s, "
             f"bf16 {t['bf16']:.3f} TFLOP/s; training precision (auto): {result['auto_precision']}",
             f"{'config':<10} {'prec':<5} {'params':>10} {'tokens/s':>10} {'step ms':>9} {'MFU':>7} "
             f"{'Muon share':>10} {'peak RSS MiB':>12}"]
    for name, entry in result["configs"].items():
        for prec, r in entry["by_precision"].items():
            lines.append(f"{name:<10} {prec:<5} {r['params']:>10,} {r['tokens_per_s']:>10,.0f} {r['step_ms']:>9.1f} "
                         f"{r['mfu']:>7.1%} {r['muon_share']:>10.1%} {r['peak_rss_mib']:>12.0f}")
    for name, entry in result["configs"].items():
        for pp, r in entry.get("probe", {}).items():
            lines.append(f"probe {name} ({pp} forward, batch {' x '.join(map(str, entry['batch']))}): "
                         f"{r['probe_s']:.3f} s; plain no-grad forward {r['forward_fp32_s']:.3f} s fp32 / "
                         f"{r['forward_bf16_s']:.3f} s bf16; overhead at probe_every={entry['probe_every']}: "
                         f"{r['overhead_share']:.2%} of training time")
    if "probe_memory_1b" in result:
        m = result["probe_memory_1b"]
        lines.append(f"probe memory, 1b layer shape x {m['n_layers']} layers ({m['params']:,} params), batch "
                     f"8 x 2048: RSS {m['rss_after_weights_mib']:.0f} MiB after weights, peak "
                     f"{m['peak_rss_mib']:.0f} MiB ({m['probe_s']:.1f} s)")
    return "\n".join(lines)
