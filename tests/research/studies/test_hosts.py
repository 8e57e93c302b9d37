"""A study adds runs only in the precision and on the host kind of the runs its folder holds, unless made with
--mix_hosts (research.studies.hosts): refused in one line naming both and the fix, before anything trains and with
every file left as it was; with the option, the folder records it and its report counts the host kinds."""
import json

import pytest
import torch

from configs.config import ConfigError
from research import qk_norm_25m_study
from research.results.layout import read_study_index, write_study_index
from research.studies import QK_NORM
from research.studies.hosts import check_hosts, study_threads
from research.studies.runner import run_study
from tests.helpers import STEP_TOKENS, stops
from tests.research.studies.test_runner import study_args
from utils.runtime import this_host_kind
from utils.threads import ThreadChoice

HERE = this_host_kind(torch.device("cpu"))
OTHER = "Other CPU 9000 (AMX)"
THIRD = "Third CPU 9000 (AVX512-BF16)"


def held(out, provenance: dict, cond: str = "QK") -> dict:
    """A folder holding one run of `cond`, seed 0, with `provenance` (and what it held): {file: bytes} of everything
    in it."""
    (out / cond).mkdir(parents=True)
    (out / cond / "results.json").write_text(json.dumps({"tag": cond, "seed": 0, "provenance": provenance}))
    return {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}


def untrained(monkeypatch):
    """Training fails the test: a refusal comes before any run trains."""
    from research.studies import runner

    def train(*args, **kwargs):
        raise AssertionError("a run was trained")
    monkeypatch.setattr(runner, "train_run", train)


@pytest.mark.parametrize("case", ["host kind", "precision"])
def test_a_study_refuses_runs_on_another_host_kind_or_precision_before_training(corpus_file, cache_dir, tmp_path,
                                                                             case, capsys, monkeypatch):
    untrained(monkeypatch)
    out = tmp_path / "study"
    theirs = ({"train_precision": "fp32", "host_kind": OTHER} if case == "host kind" else
              {"train_precision": "bf16", "host_kind": HERE})
    before = held(out, theirs)
    msg = stops(capsys, qk_norm_25m_study.main, study_args(corpus_file, cache_dir, out, 4 * STEP_TOKENS, "--seed", "0"))
    if case == "host kind":
        assert msg == (f"error: {out} holds runs trained on {OTHER} (1 run, e.g. QK/results.json), and this host is "
                       f"{HERE}: bf16 numerics differ between host kinds, so a study compares the runs of one "
                       f"(docs/decisions.md#which-runs-are-compared-identity-before-statistics). Fix: run it on a "
                       f"{OTHER} host, or another --out, or pass --mix_hosts to combine them (the report then says "
                       f"they were trained on 2 host kinds) (nothing was trained)")
    else:
        assert msg.startswith(f"error: {out} holds runs trained in bf16 (1 run, e.g. QK/results.json), and this "
                              f"command trains in fp32: a study compares runs of one precision")
        assert msg.endswith("Fix: --precision bf16 (as they were trained), or another --out (nothing was trained)")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"} == before


def test_the_fine_tuning_study_refuses_another_host_kind_before_loading_its_model(tmp_path, capsys):
    from research import finetune_keys_study
    out = tmp_path / "finetune"
    before = held(out, {"train_precision": "fp32", "host_kind": OTHER})
    msg = stops(capsys, finetune_keys_study.main, ["--model", str(tmp_path / "no_such_model"), "--out", str(out),
                                                   "--device", "cpu", "--precision", "fp32", "--no_progress"])
    assert f"holds runs trained on {OTHER}" in msg and "pass --mix_hosts" in msg and "(nothing was trained)" in msg
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_mix_hosts_lets_another_host_kind_in_but_never_another_precision(tmp_path):
    out = tmp_path / "study"
    held(out, {"train_precision": "bf16", "host_kind": OTHER})
    check_hosts(out, HERE, "bf16", mix_hosts=True)  # passes
    assert check_hosts(out, OTHER, "bf16", mix_hosts=False) is False  # the folder's own kind: not mixed
    with pytest.raises(ConfigError, match="Fix: --precision bf16"):
        check_hosts(out, HERE, "fp32", mix_hosts=True)
    check_hosts(tmp_path / "new", HERE, "fp32", mix_hosts=False)  # nothing held: nothing to match


def test_a_folder_holding_two_host_kinds_or_precisions_is_refused_whichever_this_is(tmp_path):
    """Adding to a folder that mixes host kinds (without --mix_hosts) or precisions (ever) would leave the analysis
    to set a group aside, perhaps the runs just trained: refused even where this command's is one of them."""
    out = tmp_path / "kinds"
    held(out, {"train_precision": "bf16", "host_kind": OTHER})
    held(out, {"train_precision": "bf16", "host_kind": THIRD}, "NoQK")
    for here in (OTHER, THIRD, HERE):
        with pytest.raises(ConfigError) as e:
            check_hosts(out, here, "bf16", mix_hosts=False)
        n = 2 if here != HERE else 3
        assert str(e.value) == (
            f"{out} holds runs trained on {THIRD} (1 run, e.g. NoQK/results.json), {OTHER} (1 run, e.g. "
            f"QK/results.json), and this host is {here}: bf16 numerics differ between host kinds, so a study compares "
            f"the runs of one (docs/decisions.md#which-runs-are-compared-identity-before-statistics). Fix: pass "
            f"--mix_hosts to combine them (the report then says they were trained on {n} host kinds), or move the "
            f"runs of all but one host kind out of the folder, or another --out (nothing was trained)")
    with pytest.raises(ConfigError, match=r"and this host's kind is not known \(its CPU is not named\)"):
        check_hosts(out, None, "bf16", mix_hosts=False)
    assert check_hosts(out, OTHER, "bf16", mix_hosts=True) is True
    held(tmp_path / "one", {"train_precision": "bf16", "host_kind": OTHER})
    check_hosts(tmp_path / "one", None, "bf16", mix_hosts=False)  # a kind not known is not counted
    out = tmp_path / "precisions"
    held(out, {"train_precision": "bf16", "host_kind": HERE})
    held(out, {"train_precision": "fp32", "host_kind": HERE}, "NoQK")
    for precision in ("bf16", "fp32"):
        with pytest.raises(ConfigError) as e:
            check_hosts(out, HERE, precision, mix_hosts=True)
        assert str(e.value) == (
            f"{out} holds runs trained in fp32 (1 run, e.g. NoQK/results.json), bf16 (1 run, e.g. QK/results.json), "
            f"and this command trains in {precision}: a study compares runs of one precision "
            f"(docs/decisions.md#which-runs-are-compared-identity-before-statistics). Fix: move the runs of all but "
            f"one precision out of the folder (and give --precision as the rest were trained), or another --out "
            f"(nothing was trained)")


def test_an_older_run_takes_its_bf16_path_from_its_folder_never_from_this_host(tmp_path):
    """Files written before the host kind was recorded name the CPU and whether it has native bf16, not which path
    (AMX or AVX512-BF16; one model name can have either): a newer run of that CPU model in the same folder says
    which; this host never does, so an older native run alone is of a kind no host is now, added to only with
    --mix_hosts. One without native bf16 is of that kind, as a newer run records it."""
    old = {"train_precision": "bf16", "cpu": "AMD EPYC", "cpu_native_bf16": True}
    alone = tmp_path / "alone"
    held(alone, old)  # trained, say, on an AMX box named "AMD EPYC"
    with pytest.raises(ConfigError) as e:
        check_hosts(alone, "AMD EPYC (AVX512-BF16)", "bf16", mix_hosts=False)
    assert str(e.value) == (
        f"{alone} holds runs trained on AMD EPYC (native bf16, path not recorded) (1 run, e.g. QK/results.json), and "
        f"this host is AMD EPYC (AVX512-BF16): bf16 numerics differ between host kinds, so a study compares the runs "
        f"of one (docs/decisions.md#which-runs-are-compared-identity-before-statistics). Fix: pass --mix_hosts to "
        f"combine them (the report then says they were trained on 2 host kinds), or another --out: they were "
        f"recorded before a run's bf16 path (AMX or AVX512-BF16) was, and nothing in the folder says which they "
        f"had, so no host now is of their kind (nothing was trained)")
    assert check_hosts(alone, "AMD EPYC (AVX512-BF16)", "bf16", mix_hosts=True) is True
    for path in ("AVX512-BF16", "AMX"):  # the folder's newer run of the model says which
        folder = tmp_path / path
        held(folder, old)
        held(folder, {"train_precision": "bf16", "host_kind": f"AMD EPYC ({path})"}, "NoQK")
        if path == "AVX512-BF16":
            check_hosts(folder, "AMD EPYC (AVX512-BF16)", "bf16", mix_hosts=False)
        else:
            with pytest.raises(ConfigError, match=r"holds runs trained on AMD EPYC \(AMX\) \(2 runs, "):
                check_hosts(folder, "AMD EPYC (AVX512-BF16)", "bf16", mix_hosts=False)
    avx2 = tmp_path / "avx2"
    held(avx2, {"train_precision": "bf16", "cpu": "AMD EPYC", "cpu_native_bf16": False})
    check_hosts(avx2, "AMD EPYC (no native bf16)", "bf16", mix_hosts=False)
    with pytest.raises(ConfigError, match=r"holds runs trained on AMD EPYC \(no native bf16\)"):
        check_hosts(avx2, "AMD EPYC (AVX512-BF16)", "bf16", mix_hosts=False)


def test_a_folder_made_with_mix_hosts_takes_another_host_kind_without_the_option(tmp_path):
    """study.json's mix_hosts is read before the check, not only when study.json is written again: a folder made
    with --mix_hosts and resumed without it on a host kind it does not hold yet is not refused, and stays so."""
    out = tmp_path / "study"
    held(out, {"train_precision": "bf16", "host_kind": OTHER})
    with pytest.raises(ConfigError, match="pass --mix_hosts"):  # study.json does not say so yet
        check_hosts(out, THIRD, "bf16", mix_hosts=False)
    write_study_index(out, name="qk_norm", kind="qk_norm", seeds=[0], preset="debug",
                      conditions={"QK": ["QK/results.json"]}, margin=0.05, loss_margin=0.01, mix_hosts=True)
    mixed = check_hosts(out, THIRD, "bf16", mix_hosts=False)
    assert mixed is True  # what study.json is written with again


@pytest.mark.slow
def test_a_study_made_with_mix_hosts_records_it_and_its_report_counts_the_host_kinds(corpus_file, cache_dir,
                                                                                    tmp_path):
    out = tmp_path / "study"
    run_study(QK_NORM, study_args(corpus_file, cache_dir, out, 2 * STEP_TOKENS, "--seeds", "0", "1", "--mix_hosts"))
    assert read_study_index(out)["mix_hosts"] is True
    assert f"host kind {HERE}." in (out / "report.md").read_text()  # one kind so far: named as the recipe's
    for cond in ("QK", "QK_frozen", "NoQK"):  # seeds 0 and 1 as if trained elsewhere, on two kinds but this one
        for seed, kind in ((0, THIRD), (1, OTHER)):
            path = out / cond / f"seed_{seed}" / "results.json"
            res = json.loads(path.read_text())
            res["provenance"]["host_kind"] = kind
            path.write_text(json.dumps(res))
    # resumed without the option on a host kind the folder does not hold: seed 2 trains here
    run_study(QK_NORM, study_args(corpus_file, cache_dir, out, 2 * STEP_TOKENS, "--seeds", "0", "1", "2"))
    assert read_study_index(out)["mix_hosts"] is True  # a folder made so stays so
    report = (out / "report.md").read_text()
    groups = sorted([(HERE, 2), (THIRD, 0), (OTHER, 1)])
    assert ("trained on 3 host kinds (" + "; ".join(f"{k}: QK (seed {s}), QK_frozen (seed {s}), NoQK (seed {s})"
                                                    for k, s in groups)
            + "), combined: the study was made with --mix_hosts.") in report


def test_a_study_keeps_to_the_thread_count_its_runs_record_or_says_it_mixes(tmp_path):
    """bf16 values move with the thread count: unasked, a study takes its folder's one recorded count; asked another,
    or where the folder holds several, it trains as asked and says the study mixes them."""
    busy = ThreadChoice(1, "free cores: 1 of 2 (others kept 1.0 busy)")
    assert study_threads(tmp_path / "new", busy, 0) == (0, None)  # nothing held: the host's choice
    out = tmp_path / "study"
    held(out, {"device": "cpu", "cpu_threads": 2})
    held(out, {"device": "cuda:0", "cpu_threads": 1}, cond="NoQK")  # a GPU run's threads are not counted
    assert study_threads(out, ThreadChoice(2, "free cores: 2 of 2"), 0) == (0, None)  # the same count
    threads, line = study_threads(out, busy, 0)
    assert threads == 2 and line == (f"threads: 2, as the runs in {out} were trained (CPU threads 2 (1 run, e.g. "
                                     f"QK/results.json)), not the 1 of this host now (free cores: 1 of 2 (others "
                                     f"kept 1.0 busy)): one count keeps a study's bf16 values comparable; --threads N "
                                     f"chooses")
    threads, line = study_threads(out, ThreadChoice(1, "asked (--threads)"), 1)
    assert threads == 1 and line.startswith(f"note: {out} holds runs trained on CPU threads 2 (1 run, e.g. "
                                            f"QK/results.json), and this command's runs train on 1 (asked "
                                            f"(--threads)): bf16 values move with the count")
    held(out, {"device": "cpu", "cpu_threads": 1}, cond="QK_frozen")
    threads, line = study_threads(out, busy, 0)  # several held already: no one count to keep to
    assert threads == 0 and line.startswith("note: ") and line.endswith("--threads 2 keeps to one")
