"""results.json is rewritten at step 0, before each checkpoint and at the end, not at every probe (issue 66): what a
checkpoint's resume needs is on disk at its step, and a run that stops on a non-finite loss keeps every probe."""
import json

import pytest

from research.probing import callback
from research.results import load_results
from tests.helpers import STEP_TOKENS
from tests.research.probing.test_probe import probed_trainer
from training.errors import NonFiniteLossError


def writes(monkeypatch) -> list[list[int]]:
    """The steps results.json holds at each of its writes, recorded as the callback writes it."""
    seen: list[list[int]] = []
    save = callback.save_results

    def counting(path, res):
        seen.append(list(res["steps"]))
        save(path, res)
    monkeypatch.setattr(callback, "save_results", counting)
    return seen


def test_results_json_is_written_at_step_0_before_each_checkpoint_and_at_the_end(debug_cfg, tmp_path, monkeypatch):
    seen = writes(monkeypatch)
    out = tmp_path / "run"
    probed_trainer(debug_cfg(tokens=7 * STEP_TOKENS, probe_every=1, ckpt_every=3), out).fit()
    assert seen == [[0], [0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5, 6, 7]]
    assert load_results(out / "results.json")["steps"] == list(range(8))


def test_a_checkpoint_between_probes_has_its_probes_on_disk(debug_cfg, tmp_path, monkeypatch):
    seen = writes(monkeypatch)
    probed_trainer(debug_cfg(tokens=7 * STEP_TOKENS, probe_every=4, ckpt_every=5), tmp_path / "run").fit()
    assert seen == [[0], [0, 4], [0, 4, 7]]  # the checkpoint at step 5, no probe there, has the probe of step 4


def test_a_run_that_stops_on_a_non_finite_loss_keeps_every_probe(debug_cfg, tmp_path, monkeypatch):
    out = tmp_path / "run"
    trainer = probed_trainer(debug_cfg(tokens=6 * STEP_TOKENS, probe_every=1, ckpt_every=100), out)
    step = trainer.train_step

    def diverging():  # step 5 meets a non-finite loss: train_step stops the run so
        if trainer.step == 4:
            trainer._fail_non_finite(float("nan"), 1.0)
        return step()
    monkeypatch.setattr(trainer, "train_step", diverging)
    with pytest.raises(NonFiniteLossError):
        trainer.fit()
    assert json.loads((out / "results.json").read_text())["steps"] == [0, 1, 2, 3, 4]  # no checkpoint: written at 0
