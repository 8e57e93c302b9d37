"""The checkpoint-keys study across seeds (research/checkpoint_keys_study.py --seeds): tiny random llama models as
four seeds, two saved revisions each (a folder each) but one seed's second, plus a copy of one revision saved as a
later step; the copy is marked a duplicate, the seed without its last revision is named and left out of the pairs,
and every interval equals research.analysis.rules applied by hand to per-seed changes computed from the JSON."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from research import checkpoint_keys_study as study
from research.analysis import trajectory_seeds as S
from research.analysis.keys import layer_groups
from research.analysis.rules import DIFFERENCE, LOSS_MARGIN, RATIO, Paired, decide
from research.results.trajectory import FILE, load_trajectory
from research.studies import checkpoint_keys
from research.studies.checkpoint_seeds import read_tokens, seed_from_name
from tests.research.inspection.builders import SENTENCES, make_hf, make_tokenizer

SEEDS = (0, 1, 2, 3)          # seed 3 has no step-8000 revision
THRESHOLD = 0.15              # the study's --sink_threshold (stored in the file)


def _save(model, folder, step: int):
    model.save_pretrained(folder)
    make_tokenizer(folder)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "num_input_tokens_seen": step * 64}))
    return str(folder)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """(argv of the study, the output folder): seeds 0-2 at steps 1000 and 8000, seed 3 at 1000 only, and seed 1's
    step-1000 folder copied as its step 4000 (a branch serving another step's weights)."""
    root = tmp_path_factory.mktemp("seeds")
    checkpoints, seeds = [], []
    for seed in SEEDS:
        model = make_hf("llama", seed)
        checkpoints.append(_save(model, root / f"seed{seed}" / "step1000", 1000))
        seeds.append(seed)
        if seed == 3:
            continue
        torch.manual_seed(100 + seed)  # "training": the keys' weights grow and move
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "k_proj" in name or "q_proj" in name:
                    p.mul_(1.5).add_(0.02 * torch.randn_like(p))
        checkpoints.append(_save(model, root / f"seed{seed}" / "step8000", 8000))
        seeds.append(seed)
    copy = root / "seed1" / "step4000"
    shutil.copytree(root / "seed1" / "step1000", copy)
    (copy / "trainer_state.json").write_text(json.dumps({"global_step": 4000}))
    checkpoints.append(str(copy))
    seeds.append(1)
    text = root / "text.txt"
    text.write_text(" ".join(SENTENCES * 40))
    out = root / "out"
    argv = ["--checkpoints", *checkpoints, "--seeds", *map(str, seeds), "--text", str(text), "--batches", "3",
            "--batch", "2", "--seq_len", "16", "--sink_threshold", str(THRESHOLD), "--out", str(out), "--no_progress"]
    return argv, out


@pytest.fixture(scope="module")
def measured(suite):
    argv, out = suite
    assert study.main(argv) == 0
    return out


def _value(rec: dict, field: str, layers: list[int], site: str | None = None) -> float:
    """A seed's value by hand: per batch the mean over the group's layers and heads, then the mean over batches."""
    rows = [b["keys"][site][field] if site else b["attn"][field] for b in rec["batches"]]
    return float(np.mean([np.mean(np.array(r, float)[layers]) for r in rows]))


@pytest.mark.slow
def test_the_copy_is_a_duplicate_and_the_seed_without_its_last_revision_is_named(measured, capsys):
    res = load_trajectory(measured / FILE)
    ck = res["checkpoints"]
    assert [(c["seed"], c["step"]) for c in ck] == [(0, 1000), (1, 1000), (2, 1000), (3, 1000), (1, 4000), (0, 8000),
                                                    (1, 8000), (2, 8000)]
    dup = [c for c in ck if c["duplicate_of"] is not None]
    assert [(c["seed"], c["step"], c["duplicate_of"]) for c in dup] == [(1, 4000, "seed1/step1000")]
    assert dup[0]["label"] == "seed1/step4000"  # a folder of a seed is labelled seed<N>/<its name>
    assert dup[0]["sha256"] == ck[1]["sha256"] and "batches" not in dup[0]
    assert [c["tokens"] for c in ck] == [64000] * 4 + [None] + [512000] * 3  # trainer_state's num_input_tokens_seen
    assert res["sink_threshold"] == THRESHOLD
    t = S.analyze(res)
    assert t.steps == [1000, 8000] and t.seeds == [0, 1, 2, 3] and t.paired == [0, 1, 2]
    assert t.missing == {0: [], 1: [], 2: [], 3: [8000]}
    line = "seed 3 lacks step 8000 (no checkpoint): left out of the first -> last pairs"
    assert S.missing_lines(res) == [line]
    report = (measured / "report.md").read_text()
    assert line in report and f"same weights as **{ck[1]['label']}**" in report and "not detectable" in report
    # three random seeds decide little; an open question names the one route a public suite has (no looks to plan)
    assert "to settle it: a replication on other seeds" in report and "--until_decided" not in report
    from research.plots.trajectory_seeds import figures
    figs = figures(t)
    texts = [x.get_text() for ax in figs["key_trajectories.png"].axes for x in ax.texts]
    assert f"{dup[0]['label']} = {ck[1]['label']}" in texts  # the figure marks the duplicate
    for name in ("key_trajectories.png", "attention_trajectories.png"):
        assert (measured / name).stat().st_size > 1000
    assert study.main(["--render_only", "--out", str(measured)]) == 0  # redrawn from the JSON alone, the same
    assert (measured / "report.md").read_text() == report


@pytest.mark.slow
def test_the_intervals_are_the_rules_applied_by_hand_to_per_seed_changes(measured):
    res = json.loads((measured / FILE).read_text())
    rec = {(c["seed"], c["step"]): c for c in res["checkpoints"] if c["duplicate_of"] is None}
    groups = layer_groups(res["model"]["n_layers"])
    family = {}
    for key, field, site in (("pr_sv@k_proj", "pr_sv", "k_proj"), ("norm_mean@k_proj", "norm_mean", "k_proj"),
                             ("pr_sv@k_rope", "pr_sv", "k_rope"), ("norm_mean@k_rope", "norm_mean", "k_rope"),
                             ("peak_frac@k_proj", "peak_frac", "k_proj"), ("entropy", "entropy", None),
                             ("sink_mass", "sink_mass_excl_q0", None)):
        for g, ix in groups.items():
            last = {s: _value(rec[s, 8000], field, ix, site) for s in (0, 1, 2)}   # seed 3 has no step 8000
            first = {s: _value(rec[s, 1000], field, ix, site) for s in SEEDS}
            # a key PR, a key norm and the attention entropy are decided on per-seed log ratios (issue 64)
            on = RATIO if field in ("pr_sv", "norm_mean", "entropy") else DIFFERENCE
            family[key, g] = Paired.of(last, first, on)
            if on == RATIO:  # the log ratios, by hand
                assert family[key, g].diffs == pytest.approx([math.log(last[s] / first[s]) for s in (0, 1, 2)])
    assert all(p.diffs.size == 3 for p in family.values())
    by_hand = decide(family, res["margin"])
    t = S.analyze(load_trajectory(measured / FILE))
    got = {(c.metric, c.group): c.decision for c in t.changes if c.metric != "loss"}
    assert set(got) == set(by_hand) and len(got) == 21
    for k, d in by_hand.items():
        assert got[k].n == 3 and got[k].outcome == d.outcome, k
        assert np.allclose([got[k].diff, *got[k].ci, got[k].p_adj], [d.diff, *d.ci, d.p_adj], rtol=1e-12), k
    loss = {step: {s: float(np.mean([b["loss"] for b in rec[s, step]["batches"]])) for s in SEEDS if (s, step) in rec}
            for step in (1000, 8000)}
    d = decide({"loss": Paired.of(loss[8000], loss[1000])}, LOSS_MARGIN)["loss"]
    got_loss = next(c.decision for c in t.changes if c.metric == "loss")
    assert np.allclose([got_loss.diff, *got_loss.ci], [d.diff, *d.ci], rtol=1e-12) and got_loss.outcome == d.outcome


@pytest.mark.slow
def test_sink_onsets_are_the_first_revision_above_the_threshold(measured):
    res = load_trajectory(measured / FILE)
    rec = {(c["seed"], c["step"]): c for c in res["checkpoints"] if c["duplicate_of"] is None}
    every = [np.mean([b["attn"]["sink_mass_excl_q0"] for b in r["batches"]], axis=0) for r in rec.values()]
    threshold = float(np.median(np.concatenate([m.ravel() for m in every])))  # splits the heads of random models
    t = S.analyze({**res, "sink_threshold": threshold})
    passed = 0
    for seed in SEEDS:
        steps = [s for s in (1000, 8000) if (seed, s) in rec]
        mass = [np.mean([np.array(b["attn"]["sink_mass_excl_q0"]) for b in rec[seed, s]["batches"]], axis=0)
                for s in steps]
        layers, heads = mass[0].shape
        for layer in range(layers):
            for h in range(heads):
                above = [st for st, m in zip(steps, mass) if m[layer, h] > threshold]
                onset = t.onsets[seed][layer, h]
                assert (t.steps[onset] if onset >= 0 else None) == (above[0] if above else None)
                passed += bool(above)
        share = t.layer_share(seed)
        assert np.allclose(share[0], (mass[0] > threshold).mean(1))
        first = [st for st, m in zip(steps, mass) if (m > threshold).any()]
        assert t.model_onset(seed) == (first[0] if first else None)
    assert 0 < passed < len(SEEDS) * 3 * 4  # the threshold splits the heads: the test can fail either way
    assert any((o == 1).any() for o in t.onsets.values())  # some head becomes a sink only at step 8000


def test_one_model_reads_as_before_and_seeds_are_checked(tmp_path, capsys):
    args = checkpoint_keys.parse_args(["--checkpoints", "org/model", "--revisions", "step1000", "step8000"])
    assert [sorted(e) for e in checkpoint_keys.plan(args)] == [["label", "name", "revision", "step", "step_from"]] * 2
    args = checkpoint_keys.parse_args(["--checkpoints", "org/m-seed1", "org/m-seed2", "--revisions", "step8000",
                                       "step1000"])
    assert [(e["label"], e["seed"], e["step"], e["tokens"]) for e in checkpoint_keys.plan(args)] == [
        ("m-seed1@step1000", 1, 1000, None), ("m-seed2@step1000", 2, 1000, None),
        ("m-seed1@step8000", 1, 8000, None), ("m-seed2@step8000", 2, 8000, None)]
    assert seed_from_name("EleutherAI/pythia-160m-data-seed3") == 3 and seed_from_name("org/model") is None
    assert read_tokens("x", "stage1-step1000-tokens5B") == 5 * 10**9 and read_tokens("x", "step1000") is None
    for argv, msg in ((["--checkpoints", "org/a", "org/b", "--revisions", "r1", "r2"],
                       "no seed in the name of org/a, org/b"),
                      (["--checkpoints", "a", "b", "--seeds", "1"], "--seeds gives 1 seeds for 2 checkpoints"),
                      (["--checkpoints", "a", "b", "--seeds", "1", "1"], "needs 2 or more seeds"),
                      (["--checkpoints", "o/m-seed1", "o/m-seed2", "--revisions", "step1", "step2", "--steps", "1"],
                       "--steps gives 1 steps for 2 revisions"),
                      (["--checkpoints", "o/m-seed1", "o/m-seed2", "--revisions", "step1", "step2", "--steps", "1",
                        "-2"], "steps are 0 or more"),
                      (["--checkpoints", "a", "b", "--seeds", "1", "2", "--sink_threshold", "1.5"],
                       "--sink_threshold 1.5")):
        with pytest.raises(SystemExit):
            checkpoint_keys.parse_args(argv)
        assert msg in capsys.readouterr().err
    args = checkpoint_keys.parse_args(["--checkpoints", "org/a", "--revisions", "step1", "step1", "step2",
                                       "--seeds", "1", "1", "2"])
    from research.access import InspectError
    with pytest.raises(InspectError, match="two checkpoints of seed 1 at step 1"):
        checkpoint_keys.plan(args)


@pytest.mark.network
@pytest.mark.slow
def test_the_smallest_pythia_seeds_at_two_revisions(tmp_path):
    """PolyPythias' 14M seeds 1 and 2 at steps 1000 and 8000 load and are measured (needs the GPT-NeoX adapter and the
    Hub; skipped when the Hub does not answer)."""
    from utils.hub import hub_problem
    repos = ["EleutherAI/pythia-14m-seed1", "EleutherAI/pythia-14m-seed2"]
    for repo in repos:
        problem = hub_problem(repo)
        if problem is not None:
            pytest.skip(f"the Hugging Face Hub: {problem[1]}")
    assert study.main(["--checkpoints", *repos, "--revisions", "step1000", "step8000", "--batches", "2", "--batch",
                       "2", "--seq_len", "64", "--out", str(tmp_path), "--no_progress"]) == 0
    res = load_trajectory(tmp_path / FILE)
    assert [(c["seed"], c["step"]) for c in res["checkpoints"]] == [(1, 1000), (2, 1000), (1, 8000), (2, 8000)]
    assert S.analyze(res).paired == [1, 2]
