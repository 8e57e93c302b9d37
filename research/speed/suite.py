"""The benchmark suite: every measurement of research.speed.measure, combined into one result, and its table."""
from __future__ import annotations

import torch

from research.speed.measure import child_json, in_child, matmul_ceiling
from utils.runtime import cpu_has_native_bf16, cpu_name, resolve_precision


def _training_runs(name: str, steps: int, auto: str, native_bf16: bool) -> dict:
    """The project's step in both precisions and without compilation, the reference's in both precisions; each
    child's MFU is against the ceiling it measured itself, with its threads, right after its steps."""
    def n(prec: str) -> int:  # emulated bf16 is ~10x slower: fewer timed steps keep the run short
        return steps if prec == "fp32" or native_bf16 else max(2, steps // 5)

    def child(prec: str, **kw) -> dict:
        return in_child("training", name, prec, n(prec), **kw)

    project = {prec: child(prec) for prec in ("fp32", "bf16")}
    reference = {prec: child(prec, impl="reference") for prec in ("fp32", "bf16")}
    other = "off" if project[auto]["compiled"] else "on"  # the step with compilation switched the other way
    entry = {**project[auto], "by_precision": project, "reference": reference,
             "other_compile": child(auto, compile_setting=other),
             # ratios from alternating steps in one process: robust to the host's speed drifting
             "pair": in_child("pair", name, auto, steps),
             "pair_other": in_child("pair", name, auto, steps, compile_setting=other)}
    entry["vs_reference_bf16"] = project[auto]["tokens_per_s"] / reference["bf16"]["tokens_per_s"]
    return entry


def first_command_steps() -> tuple[int, int]:
    """(runs, steps per run) of the README's first command on CPU: the default study on the tiny preset."""
    from research.studies import QK_NORM
    from research.studies.runner import base_config
    return len(QK_NORM.runs()) * len(QK_NORM.default_seeds), base_config(QK_NORM, "tiny", {}).steps


def compile_check(name: str, precision: str, steps: int) -> dict:
    """torch.compile on CPU, each run a fresh process: two compiled runs of `steps` steps compared loss by loss bit
    for bit (and the eager runs likewise), and its pay-back: the compile's extra seconds (its first step against
    eager's) over the seconds a step saves, against the steps of the README's first command."""
    eager = [in_child("compile", name, precision, steps, compile_setting="off") for _ in range(2)]
    comp = [in_child("compile", name, precision, steps, compile_setting="on") for _ in range(2)]

    def first_difference(a: dict, b: dict) -> int | None:  # the first step whose loss differs, from 1
        return next((i + 1 for i, (x, y) in enumerate(zip(a["losses"], b["losses"])) if x != y), None)
    # the first step's excess over a steady step, compiled against eager (a busy host slows eager's first step too)
    extra = (min(c["first_step_s"] - c["step_s"] for c in comp) - min(e["first_step_s"] - e["step_s"] for e in eager))
    saved = min(e["step_s"] for e in eager) - min(c["step_s"] for c in comp)
    runs, per_run = first_command_steps()
    return {"config": name, "precision": precision, "steps": steps,
            "compiled_differ_at": first_difference(*comp), "eager_differ_at": first_difference(*eager),
            "eager_step_s": min(e["step_s"] for e in eager), "compiled_step_s": min(c["step_s"] for c in comp),
            "compile_s": extra, "saved_per_step_s": saved,
            "payback_steps": max(0.0, extra) / saved if saved > 0 else None,
            "first_command": {"runs": runs, "steps_per_run": per_run}}


def run_suite(configs: list[str], steps: int, probe_every: int, probe: bool, probe_memory_layers: int,
              compile_steps: int = 0) -> dict:
    """Matmul ceilings, then per config the training step of the project (fp32, bf16, and uncompiled) and of
    the plain reference (research/speed/reference.py) with tokens/s, MFU, Muon's share and peak RSS; the
    probe against a plain forward; and the probe's memory at the 1b layer shape."""
    ceil = {"fp32": matmul_ceiling(torch.float32), "bf16": matmul_ceiling(torch.bfloat16)}
    auto = resolve_precision("auto", torch.device("cpu"))
    result = {"threads": torch.get_num_threads(), "cpu": cpu_name(), "auto_precision": auto,
              "native_bf16": cpu_has_native_bf16(), "matmul_tflops": {k: v / 1e12 for k, v in ceil.items()},
              "configs": {}}
    for name in configs:
        result["configs"][name] = entry = _training_runs(name, steps, auto, cpu_has_native_bf16())
        if compile_steps and name == "tiny":  # the first command's model
            entry["compile_check"] = compile_check(name, auto, compile_steps)
        if probe:
            entry["probe"] = {pp: in_child("probe", name, pp) for pp in ("fp32", "bf16")}
            step_s = entry["step_ms"] / 1e3
            for r in entry["probe"].values():
                r["overhead_share"] = r["probe_s"] / (r["probe_s"] + probe_every * step_s)
            entry["probe_every"] = probe_every
    if probe and probe_memory_layers:
        result["probe_memory_1b"] = in_child("probe-memory", layers=probe_memory_layers)
    return result


def table(result: dict) -> str:
    """The suite's result as lines for a terminal."""
    t = result["matmul_tflops"]
    lines = [f"{result['cpu']}, {result['threads']} threads; matmul 2048^3 ceiling: fp32 {t['fp32']:.3g} TFLOP/s, "
             f"bf16 {t['bf16']:.3g} TFLOP/s (native bf16: {result['native_bf16']}); training precision (auto): "
             f"{result['auto_precision']}",
             f"{'config':<10} {'impl':<34} {'prec':<5} {'tokens/s':>10} {'step ms':>9} {'MFU':>7} {'ceiling':>8} "
             f"{'Muon share':>10} {'1st step s':>10} {'peak RSS MiB':>12}"]

    def row(name: str, impl: str, r: dict) -> str:
        mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
        ceiling = "n/a" if r["ceiling_tflops"] is None else f"{r['ceiling_tflops']:.3g}"
        return (f"{name:<10} {impl:<34} {r['precision']:<5} {r['tokens_per_s']:>10,.0f} {r['step_ms']:>9.1f} "
                f"{mfu:>7} {ceiling:>8} {r['muon_share']:>10.1%} {r['first_step_s']:>10.1f} "
                f"{r['peak_rss_mib']:>12.0f}")
    for name, entry in result["configs"].items():
        for prec, r in entry["by_precision"].items():
            lines.append(row(name, "project" + (" (compiled)" if r["compiled"] else ""), r))
        other = entry["other_compile"]
        what = "compiled (--compile on)" if other["compiled"] else "not compiled"
        lines.append(row(name, f"project, {what}", other))
        for prec, r in entry["reference"].items():
            lines.append(row(name, "reference", r))
    for name, entry in result["configs"].items():
        for pair in (entry["pair"], entry["pair_other"]):
            lo, hi = pair["speedup_range"]
            lines.append(f"{name}: project ({'compiled' if pair['compiled'] else 'not compiled'}) / reference, both "
                         f"{pair['precision']}, steps alternating in one process: {pair['speedup']:.2f}x (median of "
                         f"{pair['steps']} pairs, range {lo:.2f}-{hi:.2f})")
        lines.append(f"{name}: project (default) / reference in bf16 autocast: {entry['vs_reference_bf16']:.2f}x")
    lines.append("MFU: the step's FLOPs (6 x matmul weights + causal attention, per token) x tokens/s over the "
                 "matmul ceiling (TFLOP/s, 2048^3) its own process measured right after the step, on its threads")
    for name, entry in result["configs"].items():
        if "compile_check" in entry:
            lines.append(compile_text(entry["compile_check"]))
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


def compile_text(c: dict) -> str:
    """compile_check's result in words."""
    def differ(at: int | None) -> str:
        return "bit for bit" if at is None else f"differ from step {at}"
    runs, per_run = c["first_command"]["runs"], c["first_command"]["steps_per_run"]
    pays = (f"pays back after {c['payback_steps']:.0f} steps (the first command: {runs} runs x {per_run} steps; "
            f"{'within one run' if c['payback_steps'] <= per_run else 'not within one run'})"
            if c["payback_steps"] is not None else "never pays back (no step saved)")
    return (f"{c['config']}: torch.compile, {c['precision']}, two runs of {c['steps']} steps each way, fresh "
            f"processes: compiled {differ(c['compiled_differ_at'])}, eager {differ(c['eager_differ_at'])}; step "
            f"{1e3 * c['eager_step_s']:.1f} ms eager, {1e3 * c['compiled_step_s']:.1f} ms compiled; compiling costs "
            f"{c['compile_s']:.1f} s and {pays}")


def gpu_suite(presets: tuple[str, ...], steps: int) -> dict:
    """research.speed.gpu for each preset, each in a fresh process (its own peak memory and compile cache)."""
    runs = {name: child_json("research.speed.gpu", ["--preset", name, "--steps", str(steps)]) for name in presets}
    return {"device": torch.cuda.get_device_name(), "presets": runs}


def gpu_table(result: dict) -> str:
    lines = [f"{result['device']}: training step as the Trainer runs it (bf16 autocast, compiled blocks, random "
             f"tokens)",
             f"{'preset':<7} {'batch':>12} {'tokens/s':>10} {'step s':>7} {'MFU':>6} {'MFU+probe':>9} {'Muon':>6} "
             f"{'peak GiB':>8} {'probe s':>7} {'bf16 TFLOP/s':>12}"]
    for name, r in result["presets"].items():
        batch = f"{r['batch'][0]}x{r['batch'][1]}x{r['grad_accum']}"
        lines.append(f"{name:<7} {batch:>12} {r['tokens_per_s']:>10,.0f} {r['step_s']:>7.3f} {r['mfu']:>6.1%} "
                     f"{r['mfu_with_probe']:>9.1%} {r['muon_share']:>6.1%} {r['peak_train_gib']:>8.1f} "
                     f"{r['probe_s']:>7.2f} {r['bf16_tflops']:>12.0f}")
    lines.append("MFU+probe: with one probe every probe_every steps (100 where the preset sets none); Muon: its "
                 "share of the step")
    return "\n".join(lines)
