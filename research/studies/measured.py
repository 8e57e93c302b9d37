"""The frame the studies that measure models into one results file share (pretrained keys, checkpoint keys).

    record = run_measured(out, "pretrained_keys", tool="pretrained_keys_study.py", margin=args.margin,
                          render_only=args.render_only, measure=lambda: {...})

--render_only redraws the folder (research.studies.render); otherwise the folder is checked (never one holding
another tool's results) and locked, `measure()` builds the file's record, which is saved with its wall time and
drawn through the registry of study kinds. Ctrl-C says what was kept: the results file once it is written.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from research.results import save_results
from research.results.vocabulary import REPORT
from research.studies.render import render_study
from utils.errors import Interrupted
from utils.lock import FolderLock
from utils.owners import owned_file, refuse_foreign


def run_measured(out: Path, kind: str, *, tool: str, margin: float, render_only: bool,
                 measure: Callable[[], dict]) -> dict | None:
    """The record written to the results file of `kind` in `out` (utils.owners; None with render_only);
    prints what was written."""
    file = owned_file(kind)
    saved = None  # the results file, once written: an interrupt keeps it
    try:
        if render_only:
            render_study(out, margin=margin)
            print(f"wrote {out / REPORT} and the figures")
            return None
        refuse_foreign(out, kind, tool)
        with FolderLock(out, hint="pass another --out"):
            t0 = time.perf_counter()
            record = measure()
            record["wall_s"] = time.perf_counter() - t0
            save_results(out / file, record)
            saved = out / file
        render_study(out, margin=margin)
    except KeyboardInterrupt:
        kept = f"kept {saved}; draw the figures and report with --render_only" if saved else "nothing was written"
        raise Interrupted(f"interrupted; {kept}") from None
    print(f"wrote {out / file}, {out / REPORT} and the figures in {record['wall_s']:.0f} s")
    return record
