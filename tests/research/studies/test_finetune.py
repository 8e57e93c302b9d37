"""The fine-tuning study on a tiny local Qwen3 (q/k norms): both conditions per seed, frozen gains stay put, the
decisions from the files, a rerun keeps finished runs, a model without q/k norms is refused in one line."""
from __future__ import annotations

import json

import numpy as np
import pytest

from research import finetune_keys_study as study
from research.studies import finetune
from research.analysis import finetune as A
from research.results import load_results
from research.results.read import final_site_mean
from research.studies.render import load_and_analyze
from tests.research.inspection.builders import make_hf_model
from tests.helpers import replaced, stops

ARGS = ["--tokens", "256", "--batch_size", "2", "--seq_len", "16", "--seeds", "0", "1", "--no_progress"]


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    model = make_hf_model("qwen3", root / "qwen3")
    out = root / "study"
    assert study.main(["--model", str(model), "--out", str(out), *ARGS]) == 0
    return model, out


def runs(out):
    return {c: [load_results(out / c / f"seed_{s}" / "results.json") for s in (0, 1)] for c in A.CONDITIONS}


@pytest.mark.slow
def test_both_conditions_are_probed_from_one_start(done):
    _, out = done
    index = json.loads((out / "study.json").read_text())
    assert index["kind"] == "finetune" and index["seeds"] == [0, 1] and "preset" not in index
    r = runs(out)
    for c in A.CONDITIONS:
        for res in r[c]:
            assert res["steps"] == [0, 2, 4, 6, 8] and res["tokens"] == [0, 64, 128, 192, 256]
            assert res["config"]["model"]["qk_norm"] == ("learned" if c == A.TRAINED else "frozen")
    # one pretrained model and one probe batch: the same start in every run, to the last bit
    starts = {res["init_val_loss"] for c in A.CONDITIONS for res in r[c]}
    assert len(starts) == 1
    frozen, trained = r[A.FROZEN][0]["probes"], r[A.TRAINED][0]["probes"]
    assert [layer["gamma_k"]["values"] for layer in frozen[0]["layers"]] == \
        [layer["gamma_k"]["values"] for layer in frozen[-1]["layers"]]  # frozen at the pretrained values
    assert A.gain_drift(r[A.FROZEN][0]) == [0.0, 0.0, 0.0] and min(A.gain_drift(r[A.TRAINED][0])) > 0
    assert trained[0]["layers"][0]["gamma_k"]["values"] == frozen[0]["layers"][0]["gamma_k"]["values"]


@pytest.mark.slow
def test_decisions_are_those_of_the_files(done):
    _, out = done
    r = runs(out)
    view = load_and_analyze(out)
    by_hand = np.mean([final_site_mean(a, "k_norm", "pr_sv") - final_site_mean(b, "k_norm", "pr_sv")
                       for a, b in zip(r[A.TRAINED], r[A.FROZEN])])
    assert view.analysis.final["pr"].diff == pytest.approx(by_hand, rel=1e-12, abs=1e-15)
    assert view.analysis.final["val_loss"].n == 2
    text = (out / "report.md").read_text()
    assert view.analysis.verdict in text and "Trained minus frozen" in view.analysis.verdict
    for name in (*__import__("research.plots.finetune", fromlist=["FIGURES"]).FIGURES, "report.md"):
        assert (out / name).is_file()


@pytest.mark.slow
def test_a_rerun_keeps_finished_runs_and_trains_an_unfinished_one_again(done, capsys):
    model, out = done
    path = out / A.FROZEN / "seed_1" / "results.json"
    res = json.loads(path.read_text())
    for k in ("steps", "tokens", "loss", "val_loss", "mean_pr", "wall_time_s", "probe_time_s", "probes"):
        res[k] = res[k][:2]
    res["layer_pr"] = {k: v[:2] for k, v in res["layer_pr"].items()}
    res["gamma_cv"] = {k: v[:2] for k, v in res["gamma_cv"].items()}
    path.write_text(json.dumps(res))
    capsys.readouterr()
    assert study.main(["--model", str(model), "--out", str(out), *ARGS]) == 0
    log = capsys.readouterr().out
    assert log.count("finished earlier, kept") == 3 and "gains_frozen seed 1: 8 steps" in log
    assert load_results(path)["steps"] == [0, 2, 4, 6, 8]


@pytest.mark.slow
@pytest.mark.parametrize("change, fields", [
    (["--lr", "0.05"], "config.train.lr: 0.0001 -> 0.05"),
    (["--seq_len", "32"], "config.train.seq_len: 16 -> 32; config.train.steps: 8 -> 4"),
    (["--lr", "0.05", "--seeds", "0", "1", "2"], "config.train.lr: 0.0001 -> 0.05"),  # a seed added at another lr
    (["--probe_batch", "4"], "config.probe.probe_batch: 8 -> 4"),
])
def test_a_rerun_with_other_settings_is_refused_naming_each_field(done, capsys, change, fields):
    """A study keeps a finished run only when its recorded config, model and data are those asked (the catalog
    studies' rule): another --lr, --seq_len or probe batch is refused before anything is trained or written."""
    model, out = done
    results = lambda: {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}  # noqa: E731
    before = results()
    err = stops(capsys, study.main, ["--model", str(model), "--out", str(out), *replaced(ARGS, change)])
    assert err.startswith(f"error: {out / A.TRAINED / 'seed_0'} holds a run of other settings (") and fields in err
    assert err.endswith("Pass the options it ran with, or another --out (or move "
                        f"{out / A.TRAINED / 'seed_0'} away to train it again); nothing was written")
    assert results() == before
    assert not (out / A.TRAINED / "seed_2").exists()


def test_a_model_without_qk_norms_is_refused(tmp_path, capsys):
    model = make_hf_model("llama", tmp_path / "llama")
    capsys.readouterr()  # the builder's own progress
    assert "has no q_norm / k_norm gains" in stops(capsys, study.main, ["--model", str(model), "--out",
                                                                         str(tmp_path / "o"), *ARGS])
    assert not (tmp_path / "o" / "study.json").exists()


def test_options_that_cannot_work_are_refused(capsys):
    for argv, msg in ((["--tokens", "10"], "less than one step of 8 x 128"),
                      (["--seeds", "1", "1"], "distinct seeds"), (["--lr", "0"], "positive learning rate"),
                      (["--probe_every", "0"], "--probe_every 0")):
        with pytest.raises(SystemExit):
            finetune.parse_args(argv)
        assert msg in capsys.readouterr().err


def test_ray_options_without_ray_are_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "o"
    line = stops(capsys, study.main, ["--out", str(out), *ARGS, "--cpus_per_run", "2"])
    assert line == ("error: --cpus_per_run sets the resources of each run's Ray task: add --ray, or leave "
                    "--cpus_per_run out to train the runs one after another in this process")
    assert not out.exists()
