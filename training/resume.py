"""What a resume may change, as pure functions of the saved config, the new one and the step reached.

A resume continues the same run: every config field must match config.json except those in RESUMABLE_CHANGES;
where the learning-rate schedule is planned over the total steps, a changed step count is refused unless the user
asks to re-plan (`--replan_schedule`: `lr_factor(step, new_steps)` from the resume step on). It also continues the
same data: every checkpoint records the data it was trained on (`data_identity`), and a resume whose data differ
from them all is refused (`check_same_data`) before any checkpoint is loaded.
The rules as a user meets them: docs/training.md, "Interrupted runs and resumes".
"""
from __future__ import annotations

from typing import Iterable

from configs.config import ConfigError, RunConfig, TrainConfig, declared
from training.errors import RunError
from training.schedule import lr_factor
from utils.compare import differences

# Fields that may change when a run is resumed: those declared results=False (configs/config.py), which do not alter
# what the remaining steps compute, and tokens, which extends or shortens the run within the rules above.
RESUMABLE_CHANGES = frozenset({"tokens", *(name for name, (_, f) in declared().items() if not f.metadata["results"])})


def config_differences(old: RunConfig, new: RunConfig) -> list[str]:
    """'<field>: <saved> -> <asked>' for each field a resume may not change (utils.compare, the one comparison of
    a recorded run with what is asked, which the fine-tuning study uses too)."""
    return differences(old.to_dict(), new.to_dict(), ignore=RESUMABLE_CHANGES)


def check_same_run(old: RunConfig, new: RunConfig, out) -> None:
    diffs = config_differences(old, new)
    if diffs:
        raise ConfigError(f"cannot resume {out} with a different config ({'; '.join(diffs)}): "
                          f"use the original options, or choose another --out")


def schedule_depends_on_total(tc: TrainConfig) -> bool:
    """True when lr_factor of a step depends on the number of steps (cosine decay or a warmup)."""
    return tc.schedule == "cosine" or tc.warmup_frac > 0


def check_resume_length(old: RunConfig, new: RunConfig, done: int, replan: bool, out) -> str | None:
    """Refuse a resume from step `done` whose --tokens ends before it, or changes a schedule planned over
    the total without `replan`; returns a log line when the schedule is re-planned."""
    if new.steps < done:
        raise RunError(f"{out} has already trained {done} steps ({done * new.tokens_per_step:,} tokens); "
                       f"--tokens {new.train.tokens:,} would end at step {new.steps}. Fix: pass --tokens "
                       f"{done * new.tokens_per_step} or more to continue it, or another --out for a shorter run")
    if done == 0 or old.steps == new.steps or done == new.steps == old.steps:
        return None
    if not schedule_depends_on_total(new.train):
        return None
    before, after = lr_factor(done, old.steps, old.train), lr_factor(done, new.steps, new.train)
    what = f"{new.train.schedule} schedule, warmup_frac {new.train.warmup_frac}"
    if not replan:
        raise RunError(f"--tokens {new.train.tokens:,} changes {out} from {old.steps} to {new.steps} steps ({what}): "
                       f"the lr factor at step {done + 1} would jump from {before:.4g} to {after:.4g}. Fix: resume "
                       f"with --tokens {old.train.tokens}, or pass --replan_schedule")
    return (f"resume: --replan_schedule: the schedule now spans {new.steps} steps instead of {old.steps}; "
            f"the lr factor at step {done + 1} is {after:.4g} (it would have been {before:.4g})")


# The data identity's fields a resume compares (the others, corpus and tokenizer names, only word the message).
DATA_FIELDS = {"source_hash": "corpus hash", "tokenizer_hash": "tokenizer hash", "vocab_size": "vocabulary size",
               "seq_len": "block length", "train_blocks": "train blocks", "val_blocks": "validation blocks"}


def data_identity(data) -> dict:
    """What a run's data are (a data.TokenData), as each checkpoint's state.json records it under "data"."""
    return {"corpus": data.corpus, "source_hash": data.source_hash, "tokenizer": data.tokenizer_name,
            "tokenizer_hash": data.tokenizer_hash, "vocab_size": int(data.vocab_size), "seq_len": int(data.seq_len),
            "train_blocks": int(data.train.shape[0]), "val_blocks": int(data.val.shape[0])}


def saved_identity(state: dict) -> dict | None:
    """The data identity a checkpoint's state.json records; for older checkpoints the train-block count of
    their loader; None where neither is readable."""
    if not isinstance(state, dict):
        return None
    data = state.get("data")
    if isinstance(data, dict):
        return data
    loader = state.get("loader")
    n = loader.get("n_blocks") if isinstance(loader, dict) else None
    return {"train_blocks": n} if isinstance(n, int) and not isinstance(n, bool) else None


def _short(value) -> str:
    return value[:12] if isinstance(value, str) and len(value) > 12 else str(value)


def data_differences(saved: dict, now: dict) -> list[str]:
    """"<what>: <saved> -> <now>" for each compared field both identities hold and that differs."""
    return [f"{label} {_short(saved[k])} -> {_short(now[k])}" for k, label in DATA_FIELDS.items()
            if k in saved and k in now and saved[k] != now[k]]


def check_same_data(saved: Iterable[tuple[str, int, dict]], now: dict, cfg: RunConfig, out) -> None:
    """Refuse a resume whose data differ from those of every checkpoint that records them. `saved`: (checkpoint
    name, step, identity), newest first. One checkpoint with the same data is enough: the others are then
    damaged and are set aside when loading them fails."""
    saved = list(saved)
    if not saved or any(not data_differences(ident, now) for _, _, ident in saved):
        return
    name, step, ident = saved[0]
    source = f"--source {cfg.data.source}" + (f" ({', '.join(cfg.data.paths)})" if cfg.data.paths else "")
    if now["corpus"] != cfg.data.source:
        source += f", corpus {now['corpus']}"
    raise RunError(f"cannot resume {out}: its data changed since {name} (step {step}): "
                   f"{'; '.join(data_differences(ident, now))} ({source}; tokenizer {now['tokenizer']}). Fix: "
                   f"restore the original data (the checkpoints are fine), or train the new data in another --out")
