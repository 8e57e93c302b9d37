"""ProbeRecorder: the trainer callback that probes keys and keeps results.json up to date."""
from __future__ import annotations

from collections import deque
from pathlib import Path

from research.probe import KeyProbe
from research.results import add_probe, load_results, new_results, save_results, truncate
from utils.runtime import provenance

DEFAULT_TAGS = {"learned": "QK", "frozen": "QK_frozen", "none": "NoQK"}


class ProbeRecorder:
    """Probe at step 0, every `probe_every` optimizer steps and at the last step.

    At each probe: the validation loss (all ranks take part), then on rank 0 the key
    probe on the fixed batch (the first `probe_batch` validation blocks) and an atomic
    rewrite of results.json. `loss` at a probe is the mean training loss of the last
    `probe_every` steps: the steps since the previous probe, as in the write-ups, except
    at a final probe that comes sooner, whose window reaches back so it is as long.
    """

    def __init__(self, trainer, tag: str | None = None, path: str | Path | None = None):
        cfg = trainer.cfg
        if cfg.probe.probe_every <= 0:
            raise ValueError("ProbeRecorder needs probe_every > 0")
        self.every = cfg.probe.probe_every
        self.qk_norm = cfg.model.qk_norm
        self.path = Path(path) if path else trainer.out / "results.json"
        ids = trainer.data.val[: cfg.probe.probe_batch, :-1].long()
        self.probe = KeyProbe(ids, cfg.probe.probe_precision)
        self.recent_losses: deque[float] = deque(maxlen=self.every)
        self.results = None
        if trainer.is_main:
            if trainer.step > 0 and self.path.exists():  # resumed: drop probes after the checkpoint
                self.results = truncate(load_results(self.path), trainer.step)
            else:
                self.results = new_results(
                    tag or DEFAULT_TAGS[cfg.model.qk_norm], config=cfg.to_dict(), preset=cfg.preset,
                    seed=cfg.train.seed, provenance=provenance(trainer.device),
                    data={"source_hash": trainer.data.source_hash, "tokenizer_hash": trainer.data.tokenizer_hash})

    def __call__(self, trainer, step: int) -> None:
        if step > 0:
            self.recent_losses.append(trainer.last_loss)
        if step % self.every and step != trainer.steps:
            return
        val_loss = trainer.evaluate() if step > 0 else None
        if trainer.is_main:
            record = self.probe(trainer.model)
            add_probe(self.results, record, step=step, tokens=trainer.tokens_seen,
                      loss=sum(self.recent_losses) / len(self.recent_losses) if self.recent_losses else None,
                      val_loss=val_loss,
                      wall_time_s=trainer.wall_time, qk_norm=self.qk_norm)
            save_results(self.path, self.results)

    def state_dict(self) -> dict:
        return {"recent_losses": list(self.recent_losses)}

    def load_state_dict(self, d: dict) -> None:
        self.recent_losses.extend(d["recent_losses"])
