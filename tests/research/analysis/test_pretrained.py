"""The pretrained key study's decisions on hand-made records, and its script end to end on a tiny model."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from research.analysis import pretrained as A
from research.analysis.rules import DIFFERENT, NO_SPREAD
from research.results import ResultsError
from research.results.pretrained import FILE, SCHEMA, VERSION, load_pretrained_keys
from tests.helpers import stops

L, HQ, HKV, D = 6, 4, 2, 4


def _record(n_batches=5, sink_norm=3.0, other_norm=2.0):
    """6 layers, KV head 0 a sink (its query heads: first-token attention 0.8, entropy 0.5) with key norm
    `sink_norm`, KV head 1 a gatherer (0.1, 2.0) with `other_norm`; batch b adds 0.01 * b to both norms, and
    0.002 * (b - 2) (0 in the mean over the batches) to the sink's alone, so the sink-gatherer gap spreads.
    Trained pr_sv 1.5, untrained 3.0 in every head."""
    rng_free = []
    for b in range(n_batches):
        wobble = 0.002 * (b - (n_batches - 1) / 2)
        norm = [[sink_norm + 0.01 * b + wobble, other_norm + 0.01 * b] for _ in range(L)]
        keys = {"k_proj": {"norm_mean": norm, "pr_sv": [[1.5 + 0.01 * b] * HKV] * L,
                           "pr_var": [[1.0] * HKV] * L, "erank": [[2.0] * HKV] * L}}
        init = {"k_proj": {"norm_mean": norm, "pr_sv": [[3.0 - 0.01 * b] * HKV] * L,
                           "pr_var": [[2.0] * HKV] * L, "erank": [[3.0] * HKV] * L}}
        sink = [[0.8, 0.8, 0.1, 0.1]] * L
        ent = [[0.5, 0.5, 2.0, 2.0]] * L
        rng_free.append({"loss": 3.0 + 0.1 * b, "keys": keys, "init_keys": init,
                         "attn": {"entropy": ent, "sink_mass": sink, "sink_mass_excl_q0": sink, "logit_max": sink}})
    return {"n_layers": L, "n_heads": HQ, "n_kv_heads": HKV, "head_dim": D, "batches": rng_free,
            "gains": {"k_norm": None, "q_norm": None}}


def test_norms_against_sqrt_d_head_and_by_depth():
    n = A.norm_claims(_record())
    # every group: mean of (3 + 2) / 2 + 0.01 b over b = 0..4 -> 2.52, against sqrt(4) = 2
    assert n["site"] == "k_proj" and n["sqrt_d_head"] == 2.0
    for g, d in n["vs_sqrt_d"].items():
        assert d.diff == pytest.approx(0.52) and d.outcome == DIFFERENT
    for d in n["depth"].values():  # the groups are identical batch by batch: no spread, so no test (not "equal")
        assert d.diff == pytest.approx(0.0, abs=1e-12) and d.outcome == NO_SPREAD and not d.decided


def test_groups_that_are_the_same_layers_are_not_compared_by_depth():
    """3 layers: early and middle are layers 0 and 1 both (research.analysis.keys.layer_groups), so their comparison
    would set a group against itself; final (layers 1, 2) is compared with each. 2 layers: every group is layers 0
    and 1, and nothing is compared."""
    def first_layers(n):
        rec = _record()
        rec["n_layers"] = n
        for b in rec["batches"]:
            for key in ("keys", "init_keys"):
                b[key]["k_proj"] = {m: v[:n] for m, v in b[key]["k_proj"].items()}
        return rec
    three = A.norm_claims(first_layers(3))
    assert three["same_layers"] == [("early", "middle")] and list(three["depth"]) == ["final - middle", "final - early"]
    two = A.norm_claims(first_layers(2))
    assert len(two["same_layers"]) == 3 and two["depth"] == {}
    assert A.norm_claims(_record())["same_layers"] == [] and len(A.norm_claims(_record())["depth"]) == 3


def test_sinks_have_longer_keys_within_a_layer():
    s = A.sink_claims(_record())
    assert s["counts"] == {"sink": L, "gatherer": L, "neither": 0} and s["layers"] == list(range(L))
    d = s["within_layer"]["sink - gatherer key norm"]
    assert d.diff == pytest.approx(1.0) and d.outcome == DIFFERENT
    assert s["top_sink"]["top-sink KV head - the others"].diff == pytest.approx(1.0)
    assert s["sink_rate"] == 0.5
    # one KV head per layer: not testable, and said so
    one = _record()
    one["n_kv_heads"] = 1
    for b in one["batches"]:
        b["keys"]["k_proj"]["norm_mean"] = [[2.0]] * L
    assert "one KV head per layer" in A.sink_claims(one)["why_not"]


def test_rank_against_the_untrained_architecture():
    r = A.rank_claims(_record())
    for d in r["groups"].values():  # trained 1.5 + 0.01 b, untrained 3.0 - 0.01 b: mean difference -1.46
        assert d.diff == pytest.approx(-1.46) and d.outcome == DIFFERENT


def test_golden_dimensions_and_gain_spread():
    g = np.array([1, 1.1, 0.9, 1, 1.05, 0.95, 1, 5.0])
    # median 1, MAD 0.05 -> robust SD 0.0741, threshold 1 + 3 x 0.0741 = 1.222: only dimension 7
    assert A.golden_dims(g) == [7]
    assert A.golden_dims(np.array([1.0, 1.0, 1.0, 4.0])) == [3]  # MAD 0: any gain above the rest
    assert A.golden_dims(np.ones(4)) == []
    rec = _record()
    rec["gains"]["k_norm"] = [[1.0, -1.0, 2.0, 2.0]] * L
    layer = A.gain_claims(rec)["layers"][0]
    assert layer["mean"] == 1.0 and layer["mean_abs"] == 1.5 and layer["negative"] == 1
    assert layer["cv"] == pytest.approx(np.std([1, -1, 2, 2], ddof=1))


def _write(path, models):
    path.write_text(json.dumps({"schema": SCHEMA, "version": VERSION, "models": models}))
    return path


def test_the_study_file_is_checked_on_every_read(tmp_path):
    good = _write(tmp_path / FILE, {"toy": _record()})
    assert load_pretrained_keys(good)["models"]["toy"]["n_layers"] == L
    bad = _record()
    bad["batches"][2]["keys"]["k_proj"]["norm_mean"] = [[1.0]] * L  # one head short
    with pytest.raises(ResultsError, match=r"batches\[2\].keys.k_proj.norm_mean\[0\] should be 2 numbers"):
        load_pretrained_keys(_write(tmp_path / "b.json", {"toy": bad}))
    (tmp_path / "cut.json").write_text(good.read_text()[:100])
    with pytest.raises(ResultsError, match="corrupted or was cut off"):
        load_pretrained_keys(tmp_path / "cut.json")


@pytest.mark.slow
def test_study_script_on_a_tiny_model(tmp_path, capsys):
    from research import pretrained_keys_study as study
    from tests.research.inspection.builders import SENTENCES, make_hf_model
    model = make_hf_model("llama", tmp_path / "llama")
    text = tmp_path / "text.txt"
    text.write_text(" ".join(SENTENCES * 20))
    out = tmp_path / "out"
    args = ["--models", str(model), "--text", str(text), "--batches", "3", "--batch", "2", "--seq_len", "16",
            "--out", str(out), "--no_progress"]
    assert study.main(args) == 0
    res = load_pretrained_keys(out / FILE)
    rec = res["models"][str(model)]
    assert len(rec["batches"]) == 3 and rec["text"]["seq_len"] == 16
    assert all(math.isfinite(b["loss"]) for b in rec["batches"])
    # the key cache: losses by bits on every batch, whose 16 bits are the batch's own loss (the same attention, fp32);
    # the layers' errors on the first batch only; rank and rotary use beside the key metrics
    kvs = [b["kv"] for b in rec["batches"]]
    assert [len(kv["layers"]) for kv in kvs] == [3, 0, 0]
    for b, kv in zip(rec["batches"], kvs):
        assert kv["loss"]["by_bits"]["16"] == pytest.approx(b["loss"], rel=1e-5) and kv["loss"]["change"]["16"] == 0
    assert "rank90" in rec["batches"][0]["keys"]["k_rope"] and "low_freq_share" in rec["batches"][0]["keys"]["k_proj"]
    for name in ("report.md", "key_norms.png", "sinks.png", "gains.png", "key_rank.png"):
        assert (out / name).stat().st_size > 0
    report = (out / "report.md").read_text()
    assert "over TEXT BATCHES" in report and "seeds would decide" not in report
    assert "### 5. What a key cache holds" in report and "Usable key bits" in report
    (out / "report.md").unlink()
    assert study.main(["--render_only", "--out", str(out)]) == 0 and (out / "report.md").is_file()
    (out / FILE).write_text("{")
    stops(capsys, study.main, ["--render_only", "--out", str(out)])
    stops(capsys, study.main, [*args[:-3], "--out", str(tmp_path / "o2"), "--text", str(tmp_path / "none.txt")])
