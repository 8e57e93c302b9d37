"""The probe's share and cost (python -m research.speed.probe_share) on the debug preset: the form of its output."""
import json
import re

from research.speed import probe_share
from tests.helpers import STEP_TOKENS

FINAL = re.compile(r"probe: (\d+\.\d\d) forward passes, (\d+\.\d)% of the run")


def test_the_output_ends_with_the_probes_forward_passes_and_share(debug_cfg, monkeypatch, capsys):
    # 2 steps probed at 0, 1 and 2, the gain ablation after the last (learned gains): every part of the QK run
    cfg = debug_cfg(tokens=2 * STEP_TOKENS, probe_every=1)
    monkeypatch.setattr(probe_share, "study_run_config", lambda *a, **k: cfg)
    probe_share.main([])
    out = capsys.readouterr().out
    lines = out.rstrip("\n").split("\n")
    last = FINAL.fullmatch(lines[-1])
    assert last, lines[-1]
    report = json.loads(out[:out.index("\n}\n") + 2])
    cost, share = report["probe_cost"], report["probe_share"]["median"]
    # the line says the JSON's figures: X = the probe's median over the plain forward's, Y = the median share
    assert cost["forward_passes"] == cost["probe_s"] / cost["forward_s"]
    assert last.groups() == (f"{cost['forward_passes']:.2f}", f"{100 * share:.1f}")
    assert len(cost["times_s"]["forward"]) == len(cost["times_s"]["probe"]) == 5
    # the breakdown names each metric function the probe called, and the rest (the hooked forward, the glue)
    assert {"key_metrics", "key_moments", "attention_metrics", "attention_record", "lists_and_means",
            probe_share.REST} <= set(cost["by_metric_s"])
    assert sum(cost["by_metric_s"].values()) > 0
    assert [line.split()[0] for line in lines[-len(cost["by_metric_s"]) - 1:-1]] == [
        name.split()[0] for name in cost["by_metric_s"]]
    assert report["runs"]["probe"][0]["probes"] == 3 and "cost" not in report["runs"]["probe"][0]
    # the probe's cost in plain forwards at 1 and at 2 threads, said in one line before the breakdown
    assert set(cost["by_threads"]) == {"1", "2"}
    assert all(c["forward_passes"] > 0 and c["forward_passes_cpu"] > 0 for c in cost["by_threads"].values())
    assert re.fullmatch(r"probe cost: 1 thread \d+\.\d\d forward passes \(CPU time \d+\.\d\d\); 2 threads .*\)",
                        lines[-len(cost["by_metric_s"]) - 3])
