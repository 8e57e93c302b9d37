"""Measure this machine: matmul ceilings, training throughput, MFU, Muon's share, the probe, peak memory.

    python research/benchmark.py            # human-readable table
    python research/benchmark.py --json     # one JSON object

On CUDA it measures the 88m and 1b presets' training step as the Trainer runs it (research/speed/gpu.py):
tokens/s, MFU against the measured bf16 ceiling, Muon's share, peak memory and the probe's cost.

FLOPs per token (configs.flops_per_token): 6 x (matmul weights incl. the LM head)
+ 6 x n_layers x seq_len x d_model for causal attention (QK^T and AV, forward 2 x 2 x T x d
halved by the mask, backward twice the forward). MFU = tokens/s x FLOPs per token / ceiling,
against the measured matmul ceiling of the precision the step runs in.
"""
from __future__ import annotations

import json

import torch

from research.speed.measure import configs
from research.speed.suite import gpu_suite, gpu_table, run_suite, table
from utils.cli import ArgumentParser


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--steps", type=int, default=10, help="timed training steps per config (after 3 warm-up)")
    p.add_argument("--configs", nargs="+", default=list(configs()), choices=list(configs()))
    p.add_argument("--probe_every", type=int, default=25, help="probe interval (optimizer steps) for the overhead "
                                                                "estimate (default 25)")
    p.add_argument("--no_probe", action="store_true", help="skip the probe measurements")
    p.add_argument("--probe_memory_layers", type=int, default=2,
                   help="layers of the 1b-shaped model for the probe memory check (0 skips it)")
    p.add_argument("--cpu", action="store_true", help="measure the CPU suite even where CUDA is available")
    args = p.parse_args(argv)
    if torch.cuda.is_available() and not args.cpu:
        result = gpu_suite(("88m", "1b"), args.steps)
        print(json.dumps(result, indent=2) if args.json else gpu_table(result))
        return
    result = run_suite(args.configs, args.steps, args.probe_every, not args.no_probe, args.probe_memory_layers)
    print(json.dumps(result, indent=2) if args.json else table(result))


if __name__ == "__main__":
    main()
