"""What the key probe of a Hugging Face model adds to training: its time against a training step, in one run.

    python -m research.speed.hf_probe                          # Gemma 3 270M (packaged GGUF), 8 x 128, CPU or CUDA
    python -m research.speed.hf_probe --model PATH --batch_size 16 --seq_len 512 --every 50

A training step as transformers' Trainer runs it for research/finetune_keys_study.py (forward with labels,
backward, AdamW, embeddings frozen; bf16 autocast where --precision says so) is timed over --steps steps after
warm-up; the probe (research.probing.hf.HFKeyProbe, fp32, on a batch of the same shape) over --probes calls.
The probe's share of training at an interval of --every steps is probe / (every x step): what
KeyProbeCallback adds. Medians; the spread is printed beside them.
"""
from __future__ import annotations

import json
import statistics
import time

from utils.cli import ArgumentParser, command, positive_int

import torch

from research.probing.hf import DEFAULT_EVERY, HFKeyProbe


def build_parser() -> ArgumentParser:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--model", default="gemma3-270m",
                   help="A packaged name, GGUF file, Hugging Face folder or hub id. Default: %(default)s")
    p.add_argument("--batch_size", type=positive_int, default=8,
                   help="Sequences per step and probe. Default: %(default)s")
    p.add_argument("--seq_len", type=positive_int, default=128, help="Tokens per sequence. Default: %(default)s")
    p.add_argument("--steps", type=positive_int, default=5,
                   help="Timed training steps, after 2 warm-up. Default: %(default)s")
    p.add_argument("--probes", type=positive_int, default=3, help="Timed probes, after 1 warm-up. Default: %(default)s")
    p.add_argument("--every", type=positive_int, default=DEFAULT_EVERY,
                   help="Probe interval in optimizer steps (KeyProbeCallback's default). Default: %(default)s")
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                   help="Training precision; auto: bf16 on CUDA and CPUs with native bf16. Default: auto")
    p.add_argument("--json", action="store_true", help="Print one JSON object instead of lines")
    return p


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(args) -> dict:
    from research.access.loading import load_model
    from utils.runtime import provenance, resolve_runtime
    runtime = resolve_runtime("auto", args.precision)
    device, precision = runtime.device, runtime.precision
    model, _, adapter = load_model(args.model, "float32", log=lambda *a: None, progress=False)
    adapter.check_window(args.seq_len)
    model.to(device).train()
    emb = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    params = [p for p in model.parameters() if id(p) not in emb]
    for p in model.parameters():
        p.requires_grad_(id(p) not in emb)
    opt = torch.optim.AdamW(params, lr=1e-5)
    ids = torch.randint(0, adapter.vocab_rows(), (args.batch_size, args.seq_len),
                        generator=torch.Generator().manual_seed(0)).to(device)

    def step() -> float:
        _sync(device)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        return time.perf_counter() - t0

    probe = HFKeyProbe(ids.cpu())

    def probed() -> float:
        _sync(device)
        t0 = time.perf_counter()
        probe(model)
        _sync(device)
        return time.perf_counter() - t0

    for _ in range(2):
        step()
    steps = [step() for _ in range(args.steps)]
    probed()
    probes = [probed() for _ in range(args.probes)]
    steps += [step() for _ in range(args.steps)]  # after the probes too: the reference in the same run
    step_s, probe_s = statistics.median(steps), statistics.median(probes)
    return {"model": args.model, "device": provenance(device).get("device"), "precision": precision,
            "batch": [args.batch_size, args.seq_len], "step_s": step_s, "step_s_range": [min(steps), max(steps)],
            "probe_s": probe_s, "probe_s_range": [min(probes), max(probes)], "every": args.every,
            "overhead": probe_s / (args.every * step_s), "tokens_per_s": args.batch_size * args.seq_len / step_s}


@command
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    r = measure(args)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    print(f"{r['model']} on {r['device']}, {r['precision']} training, batch {r['batch'][0]} x {r['batch'][1]}")
    print(f"training step  {r['step_s']:.3f} s (median; {r['step_s_range'][0]:.3f}-{r['step_s_range'][1]:.3f}), "
          f"{r['tokens_per_s']:.0f} tokens/s")
    print(f"key probe      {r['probe_s']:.3f} s (median; {r['probe_s_range'][0]:.3f}-{r['probe_s_range'][1]:.3f}), "
          f"fp32")
    print(f"every {r['every']} steps the probe adds {r['overhead']:.1%} to training")


if __name__ == "__main__":
    main()
