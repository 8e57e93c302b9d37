"""The cost of the key-cache formats in the key-cache section (research/probing/kv_cache.py): `python -m
research.speed.measure kv-formats --steps 5` prints it as JSON.

On the tiny preset's model (seeded initial weights) and the key-cache section's batch (its first 8 sequences of
seq_len tokens), each round measures the section as it is (the integer schemes, the projections and every format
engines ship, alone and with 4 and 32 tokens kept) and the section without the formats, in alternating order, and
one plain forward of those sequences; the cost of the formats is the median over rounds of the difference, in plain
forwards. Printed, never asserted.
"""
from __future__ import annotations

import statistics
import time
from unittest import mock

import torch

from configs import get_preset
from models import MinimalLLM
from research.probing import kv_cache


def measure_kv_formats(rounds: int, preset: str = "tiny") -> dict:
    cfg = get_preset(preset)
    torch.manual_seed(0)
    model = MinimalLLM(cfg.model).eval()
    x = torch.randint(0, cfg.model.vocab_size, (kv_cache.KV_ROWS, cfg.data.seq_len + 1),
                      generator=torch.Generator().manual_seed(0))
    ids, targets = x[:, :-1], x[:, 1:]

    def timed(fn) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    with_f, without, forward = [], [], []
    for r in range(rounds):
        first, second = (True, False) if r % 2 == 0 else (False, True)
        for formats in (first, second):
            if formats:
                with_f.append(timed(lambda: kv_cache.kv_cache_record(model, ids, targets)))
            else:
                with mock.patch.object(kv_cache, "format_cases", lambda D: ()):
                    without.append(timed(lambda: kv_cache.kv_cache_record(model, ids, targets)))
        with torch.no_grad():
            forward.append(timed(lambda: model(ids, targets)))
    f, w, fw = (statistics.median(v) for v in (with_f, without, forward))
    return {"preset": preset, "batch": list(ids.shape), "rounds": rounds, "threads": torch.get_num_threads(),
            "section_s": {"with_formats": f, "without": w}, "forward_s": fw,
            "formats_cost_forwards": (f - w) / fw, "section_forwards": f / fw}
