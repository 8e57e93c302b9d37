"""Prepare one text file as a run would, printing the process's peak RSS so far after every log line.

    /usr/bin/time -v python -m tests.data.measure_prep FILE CACHE_DIR

The debug preset with --vocab_size 4096 --seq_len 128 --max_seq_len 128 on --source files --paths FILE; CACHE_DIR
should be fresh, so the BPE is trained and the blocks built. The peak printed after the tokenizer's line is the
tokenizer step's share (the libraries, reading the corpus and training the BPE); /usr/bin/time gives the whole
preparation's. Not a test: docs/data.md ("Memory") records what it printed.
"""
from __future__ import annotations

import resource
import sys
import time


def main(argv=None) -> None:
    path, cache = (argv or sys.argv[1:])[:2]
    t0 = time.time()

    def log(msg: str) -> None:
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        print(f"[{time.time() - t0:7.1f}s, peak RSS so far {peak_mib:,.0f} MiB] {msg}", flush=True)

    from configs import apply_overrides, get_preset
    from data import prepare_data

    cfg = apply_overrides(get_preset("debug"), {"source": "files", "paths": [path], "cache_dir": cache,
                                                "vocab_size": 4096, "seq_len": 128, "max_seq_len": 128})
    log("imported")
    prepare_data(cfg, log=log, progress=False)


if __name__ == "__main__":
    main()
