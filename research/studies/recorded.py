"""What a study checks of its folder before its first run trains: that --out holds this study or nothing of another
tool's (utils.owners), and that every run it already holds was trained with the config the study gives it now
(research.studies.runner asks both, before the lock and before any training)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from configs import ConfigError, RunConfig
from research.results import ResultsError
from research.results.layout import read_study_index
from research.studies.catalog import Study
from research.studies.study_runs import StudyRun
from training.checkpoint import latest_checkpoint
from training.errors import RunError
from training.resume import check_resume_length, config_differences
from training.run_files import RunFolder
from utils.errors import shown
from utils.owners import refuse_foreign

# The data fields data.resolve_offline replaces where the Hub cannot be reached; the run's config.json records the
# ones it used, and its offline_note why
OFFLINE_FIELDS = ("source", "tokenizer")


def check_recorded_runs(runs: list[StudyRun[RunConfig]], replan_schedule: bool) -> None:
    """Before the first run trains: every run the study folder already holds (its config.json, or a checkpoint's
    copy) was trained with the config the study gives it now, on every field a resume may not change (training.resume,
    the one comparison of a recorded run with what is asked: logging, checkpointing, compile and the like may
    differ), and the --tokens asked can continue it (training.resume.check_resume_length). Otherwise one line names
    the run's folder and the fields, and nothing is trained: a study whose file changed would else train its new
    runs with the new config before its first old run was reached, one folder of two configs."""
    for run in runs:
        folder = RunFolder(run.run_dir, log=lambda *_: None)  # the trainer warns of an unreadable config.json
        if not folder.resumable():
            continue  # a new run, or files the trainer refuses to continue, with its own message
        try:
            saved = folder.saved_config()
        except ConfigError as e:
            raise ConfigError(f"{e} (nothing was trained)") from None
        if saved is None:
            continue  # no config to compare: the trainer refuses it, naming the folder
        asked = run.cfg
        if saved.data.offline_note and asked.data.offline == "english" and not asked.data.offline_note:
            # the run fell back to local data (data/offline.py); whether it still must, the trainer asks the Hub
            data = dataclasses.replace(asked.data, **{f: getattr(saved.data, f) for f in OFFLINE_FIELDS})
            asked = dataclasses.replace(asked, data=data)
        diffs = config_differences(saved, asked)
        if diffs:
            raise ConfigError(f"{run.run_dir} (condition {run.cond}, seed {run.seed}) was trained with another config: "
                              f"{'; '.join(diffs)} (recorded -> now). Fix: restore those values, or choose another "
                              f"--out for the new config (nothing was trained)")
        ckpt = latest_checkpoint(folder.checkpoints)
        try:
            check_resume_length(saved, run.cfg, ckpt.step if ckpt else 0, replan_schedule, run.run_dir)
        except RunError as e:
            raise RunError(f"{e} (nothing was trained)") from None


def check_study_folder(out: Path, study: Study) -> None:
    """Refuse an --out that holds something other than this study: another tool's results (a run, another kind's
    study.json or results file: utils.owners), or another study of its kind (its index, figures and
    report would be replaced)."""
    try:
        index = read_study_index(out)
    except ResultsError as e:
        raise ResultsError(f"{e}. This study would replace it: correct or delete it, or choose another --out "
                           f"(nothing was written)") from None
    refuse_foreign(out, study.kind, f"the study {study.name}")
    if index and index["study"] not in (None, study.name):
        raise ResultsError(f"--out {out} holds the study {shown(index['study'])} (its study.json), not {study.name}: "
                           f"choose another --out (nothing was written)")
