"""training.checkpoint takes a folder as a str as well as a Path, in every function that takes one."""
from __future__ import annotations

import torch

from training.checkpoint import (Checkpoint, latest_checkpoint, list_checkpoints, load_model_weights, load_newest,
                                 load_newest_weights, remove_orphans, save_checkpoint, step_dirs)


def test_every_function_takes_a_str_folder(tmp_path):
    root = str(tmp_path / "checkpoints")
    model = torch.nn.Linear(3, 2)
    save_checkpoint(root, 1, model, [], {"loader": {}}, keep_last=2)
    newest = save_checkpoint(root, 2, model, [], {"loader": {}}, keep_last=2)
    assert [s for s, _ in step_dirs(root)] == [1, 2] and [c.step for c in list_checkpoints(root)] == [1, 2]
    assert latest_checkpoint(root).path == newest and latest_checkpoint(root).state["step"] == 2
    assert remove_orphans(root) == []

    other = torch.nn.Linear(3, 2)
    ckpt, failed = load_newest_weights(root, other)
    assert ckpt.step == 2 and failed == [] and torch.equal(other.weight, model.weight)
    load_model_weights(str(newest), torch.nn.Linear(3, 2))
    assert load_newest(root, lambda c: None)[0].path == newest
    assert Checkpoint(str(newest), 2, {}).path == newest
