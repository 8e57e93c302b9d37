"""--logger: TensorBoard event files and trackio's database hold what metrics.jsonl and results.json hold; W&B
offline; rank 0 only."""
import importlib.machinery
import json
import os
import shutil
import sqlite3
import sys
import types

import numpy as np
import pytest

import train_llm
from research.results import load_results
from tests.helpers import cli_args, stops, train_rows
from training.callbacks import StepInfo
from training.tracking import TrackerCallback, TrackioBackend, WandbBackend


def _scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def f32(values) -> list[float]:
    """What TensorBoard keeps of a float: its float32 value."""
    return [float(np.float32(v)) for v in values]


@pytest.mark.slow
def test_tensorboard_holds_the_runs_metrics_and_probes_each_step_once_across_a_resume(
        corpus_file, cache_dir, straight_run, tmp_path):
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    train_llm.main(cli_args(corpus_file, cache_dir, out, 6, "--logger", "tensorboard", "--eval_every", "3"))
    shutil.rmtree(out / "checkpoints" / "step-000006")  # killed after logging steps 5-6, before their checkpoint
    train_llm.main(cli_args(corpus_file, cache_dir, out, 6, "--logger", "tensorboard", "--eval_every", "3",
                            "--resume"))
    assert train_rows(out) == train_rows(straight_run)  # tracking changes nothing of the training
    got = _scalars(out / "tensorboard")
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "loss" in r]
    for name, tag in (("loss", "train/loss"), ("grad_norm", "train/grad_norm"), ("lr_factor", "train/lr_factor"),
                      ("tokens_per_s", "train/tokens_per_s")):
        assert got[tag] == list(zip([r["step"] for r in train], f32(r[name] for r in train))), tag
    assert got["lr/muon"] == [(s, v) for s, v in zip(range(1, 7), f32([0.024] * 6))]  # constant schedule
    assert got["lr/embed"] == got["lr/gains"] == [(s, float(np.float32(0.006))) for s in range(1, 7)]
    val = [r for r in rows if "val_loss" in r]
    assert [s for s, _ in got["val/loss"]] == [3, 6]
    assert got["val/loss"] == list(zip([r["step"] for r in val], f32(r["val_loss"] for r in val)))
    res = load_results(out / "results.json")
    assert got["probe/mean_pr"] == list(zip(res["steps"], f32(res["mean_pr"])))
    assert [s for s, _ in got["probe/mean_pr"]] == [0, 2, 4, 6]
    for layer in ("0", "1"):
        assert got[f"k_norm.pr_sv/layer_{layer}"] == list(zip(res["steps"], f32(res["layer_pr"][layer])))
        for metric in ("k_norm.norm_mean", "attn.entropy", "attn.sink_mass"):
            means = [p["layers"][int(layer)]["means"][metric] for p in res["probes"]]
            assert got[f"{metric}/layer_{layer}"] == list(zip(res["steps"], f32(means))), metric
    probe_tags = {f"{m}/layer_{i}" for m in ("k_norm.pr_sv", "k_norm.norm_mean", "attn.entropy", "attn.sink_mass",
                                             "attn.logit_max") for i in (0, 1)}
    assert set(got) - probe_tags == {"train/loss", "train/grad_norm", "train/lr_factor", "train/tokens_per_s",
                                     "lr/muon", "lr/embed", "lr/gains", "val/loss", "probe/mean_pr"}


def test_only_rank_0_opens_a_tracker_and_probe_numbers_reach_it():
    def refuse(start):
        raise AssertionError("a tracker opened on rank 1")
    info = dict(total_steps=2, start_step=0, tokens=0, loss=None, wall_time_s=0.0, model=None,
                evaluate=lambda: 0.0, metrics={"loss": 3.0, "grad_norm": 0.5, "step": 1}, lrs={"muon": 0.01})
    TrackerCallback(refuse)(StepInfo(step=1, is_main=False, **info))
    logged: list = []
    backend = types.SimpleNamespace(log=lambda step, s: logged.append((step, dict(s))),
                                    close=lambda: logged.append("closed"))
    tracker = TrackerCallback(lambda start: backend)
    tracker.add(1, {"probe/mean_pr": 40.0})
    tracker(StepInfo(step=1, is_main=True, **info))
    tracker(StepInfo(step=2, is_main=True, **{**info, "metrics": {}}))
    assert logged == [(1, {"train/loss": 3.0, "train/grad_norm": 0.5, "lr/muon": 0.01, "probe/mean_pr": 40.0}),
                      "closed"]  # step 2 logged nothing; the last step closes the backend


def _fake_wandb(monkeypatch) -> list:
    calls: list = []
    run = types.SimpleNamespace(log=lambda d, step: calls.append(("log", step, d)),
                                finish=lambda: calls.append("finish"))
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    module.init = lambda **kw: calls.append(("init", kw, os.environ.get("WANDB_MODE"))) or run
    monkeypatch.setitem(sys.modules, "wandb", module)
    return calls


def test_wandb_goes_offline_without_a_network_unless_the_user_chose(monkeypatch, tmp_path):
    calls = _fake_wandb(monkeypatch)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    backend = WandbBackend(tmp_path, "runs/a", {"model": {}}, reachable=lambda: False)
    backend.log(3, {"train/loss": 2.5})
    backend.close()
    assert calls[0] == ("init", {"project": "qk-keys", "name": "runs/a", "dir": str(tmp_path),
                                 "config": {"model": {}}}, "offline")
    assert calls[1:] == [("log", 3, {"train/loss": 2.5}), "finish"]
    monkeypatch.setenv("WANDB_MODE", "online")
    WandbBackend(tmp_path, "runs/a", {}, reachable=lambda: False)
    assert calls[-1][2] == "online"  # the user's choice stands


def _trackio_rows(folder) -> list[tuple[str, int, dict]]:
    """(run name, step, scalars) of every row trackio wrote into `folder`, read with sqlite3 alone."""
    with sqlite3.connect(folder / "qk-keys.db") as db:
        rows = db.execute("SELECT run_name, step, metrics FROM metrics ORDER BY id").fetchall()
    return [(name, step, json.loads(scalars)) for name, step, scalars in rows]


def _trackio_default_folder():
    """Where trackio stores when nobody points it elsewhere (TRACKIO_DIR, else HF_HOME/trackio)."""
    from trackio.utils import _get_trackio_dir
    folder = _get_trackio_dir()
    return sorted(folder.iterdir()) if folder.is_dir() else None


def test_trackio_writes_each_run_into_its_own_folder_within_one_process(tmp_path):
    pytest.importorskip("trackio")
    before = _trackio_default_folder()
    for run, loss in (("a", 2.5), ("b", 3.25)):  # a study's conditions, one after the other in one process
        backend = TrackioBackend(tmp_path / run, f"study/{run}", {"model": {"d_model": 8}})
        backend.log(1, {"train/loss": loss, "lr/muon": 0.01})
        backend.log(2, {"val/loss": loss + 1})
        backend.close()
    for run, loss in (("a", 2.5), ("b", 3.25)):
        assert _trackio_rows(tmp_path / run / "trackio") == [
            (f"study/{run}", 1, {"train/loss": loss, "lr/muon": 0.01}), (f"study/{run}", 2, {"val/loss": loss + 1})]
    assert _trackio_default_folder() == before  # nothing landed in trackio's own folder


@pytest.mark.slow
def test_trackio_holds_the_runs_metrics_at_their_steps(corpus_file, cache_dir, tmp_path):
    pytest.importorskip("trackio")
    out = tmp_path / "run"
    train_llm.main(cli_args(corpus_file, cache_dir, out, 4, "--logger", "trackio", "--eval_every", "2"))
    got: dict[str, list] = {}
    for name, step, scalars in _trackio_rows(out / "trackio"):
        assert name == f"{tmp_path.name}/run"  # W&B's run name: the folder and its parent
        for tag, value in scalars.items():
            got.setdefault(tag, []).append((step, value))
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    train, val = [r for r in rows if "loss" in r], [r for r in rows if "val_loss" in r]
    for name, tag in (("loss", "train/loss"), ("grad_norm", "train/grad_norm"), ("lr_factor", "train/lr_factor"),
                      ("tokens_per_s", "train/tokens_per_s")):
        assert got[tag] == [(r["step"], r[name]) for r in train], tag  # float64 in JSON: the values exactly
    assert [s for s, _ in got["train/loss"]] == [1, 2, 3, 4]
    assert got["val/loss"] == [(r["step"], r["val_loss"]) for r in val] and [s for s, _ in got["val/loss"]] == [2, 4]
    assert got["lr/muon"] == [(s, 0.024) for s in range(1, 5)]  # the debug preset's constant schedule
    res = load_results(out / "results.json")
    assert got["probe/mean_pr"] == list(zip(res["steps"], res["mean_pr"])) and res["steps"] == [0, 2, 4]
    probe_tags = {f"{m}/layer_{i}" for m in ("k_norm.pr_sv", "k_norm.norm_mean", "attn.entropy", "attn.sink_mass",
                                             "attn.logit_max") for i in (0, 1)}
    assert set(got) - probe_tags == {"train/loss", "train/grad_norm", "train/lr_factor", "train/tokens_per_s",
                                     "lr/muon", "lr/embed", "lr/gains", "val/loss", "probe/mean_pr"}
    assert probe_tags <= set(got)  # TensorBoard's tags, the same names


@pytest.mark.parametrize("kind", ["wandb", "tensorboard", "trackio"])
def test_a_logger_that_is_not_installed_is_named_before_training(monkeypatch, tmp_path, kind, capsys):
    monkeypatch.setitem(sys.modules, kind, None)  # import fails as if not installed
    assert stops(capsys, train_llm.main, ["--preset", "debug", "--out", str(tmp_path / "run"), "--logger", kind]
                 ).startswith(f"error: --logger {kind} needs the {kind} package, which is not installed: pip install "
                              f"{kind}")
    assert not (tmp_path / "run").exists()
