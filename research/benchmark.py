"""Measure this machine: matmul ceilings, training throughput, MFU, Muon's share, the probe, peak memory.

    python research/benchmark.py            # human-readable table
    python research/benchmark.py --json     # one JSON object

On CUDA it measures the 88m and 1b presets' training step as the Trainer runs it (research/speed/gpu.py):
tokens/s, MFU against the measured bf16 ceiling, Muon's share, peak memory and the probe's cost.
"""
from __future__ import annotations

import json

from utils.cli import ArgumentParser, command, count, positive_int

import torch

from research.speed.measure import configs
from research.speed.suite import gpu_suite, gpu_table, run_suite, table


GPU_PRESETS = ("88m", "1b")  # measured on CUDA, each as research/speed/gpu.py runs it


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
FLOPs per token (configs.flops_per_token): 6 x (matmul weights incl. the LM head)
+ 6 x n_layers x seq_len x d_model for causal attention (QK^T and AV, forward 2 x 2 x T x d
halved by the mask, backward twice the forward). MFU = tokens/s x FLOPs per token / ceiling,
against the matmul ceiling of the precision the step runs in, measured in the step's own process
right after it. On CPU it also trains the tiny config compiled and eager, twice each in fresh
processes: whether compiled runs repeat bit for bit, and whether compiling pays back within
the README's first command.
"""


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=DESCRIPTION)
    p.add_argument("--json", action="store_true", help="Print one JSON object instead of the table")
    p.add_argument("--steps", type=positive_int, default=10,
                   help="Timed training steps per config, after 3 warm-up steps (on CUDA: per preset). "
                        "Default: %(default)s")
    p.add_argument("--configs", nargs="+", default=list(configs()), choices=list(configs()), metavar="CONFIG",
                   help=f"Model configs the CPU suite measures: tiny (the tiny preset's model and batch) and "
                        f"reference (the write-ups' small model, research/speed/measure.py). Choices: "
                        f"{', '.join(configs())}. Default: all")
    p.add_argument("--probe_every", type=positive_int, default=25,
                   help="Probe interval, in optimizer steps, for the CPU suite's estimate of the probe's share of "
                        "training. Default: %(default)s")
    p.add_argument("--no_probe", action="store_true", help="Skip the CPU suite's probe measurements")
    p.add_argument("--probe_memory_layers", type=count, default=2,
                   help="Layers of the 1b-shaped model whose probe memory the CPU suite measures; 0 skips it. "
                        "Default: %(default)s")
    p.add_argument("--compile_steps", type=count, default=20,
                   help="Training steps of each of the CPU suite's torch.compile runs (two compiled, two eager, each "
                        "a fresh process: bit for bit? pays back within the first command?); 0 skips them. "
                        "Default: %(default)s")
    p.add_argument("--cpu", action="store_true",
                   help=f"Measure the CPU suite even where CUDA is available (there the benchmark otherwise "
                        f"measures the {' and '.join(GPU_PRESETS)} presets)")
    return p


@command
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if torch.cuda.is_available() and not args.cpu:
        result = gpu_suite(GPU_PRESETS, args.steps)
        print(json.dumps(result, indent=2) if args.json else gpu_table(result))
        return
    result = run_suite(args.configs, args.steps, args.probe_every, not args.no_probe, args.probe_memory_layers,
                       args.compile_steps)
    print(json.dumps(result, indent=2) if args.json else table(result))


if __name__ == "__main__":
    main()
