"""The golden run (tests/golden.py): 16 fp32 steps of the debug preset against the values stored in
tests/golden_debug_fp32.json by `python -m tests.golden --write`. A change that moves training (the model,
Muon, the data pipeline, the schedule) or the probe's metrics fails here first; if it is meant to, regenerate the
file and say so in the commit.

Tolerances (tests/tolerances.py): every value is fp32 on both sides, so another CPU may only reorder sums.
Losses: CURVE_REL_TOL["fp32"] (8 fp32 epsilons). The probe at init: each key goes through n_layers blocks of
fp32 matmuls over d_model terms, each adding at most sum_rel_tol("fp32", d_model) relative error, and the probe's
statistics are float64 on those keys; the same bound is used as an absolute one for the O(1) statistics that can
sit near 0 (cosine, sink mass). Measured against the stored file on the CPU that wrote it (AMD EPYC with
AVX512-BF16) with ATen and oneDNN forced down to AVX2 and to ATen's scalar kernels: losses within 1.1e-7 relative,
init metrics within 1.4e-7 relative; the loss falls from 6.24 to 2.34 over the 16 steps (0.26 nats a step on average).
"""
from __future__ import annotations

import json

import pytest

from configs import get_preset
from tests.golden import GOLDEN, golden_run, golden_text
from tests.tolerances import CURVE_REL_TOL, forward_rel_tol


def test_the_golden_corpus_is_the_same_bytes_everywhere():
    import hashlib
    stored = json.loads(GOLDEN.read_text())
    assert hashlib.sha256(golden_text().encode()).hexdigest() == stored["corpus_sha256"]


@pytest.mark.slow
def test_the_debug_preset_trains_and_probes_as_the_golden_run(tmp_path):
    stored = json.loads(GOLDEN.read_text())
    assert stored["precision"] == "fp32" and stored["command"] == "python -m tests.golden --write"
    got = golden_run(tmp_path)
    assert len(got["loss"]) == len(stored["loss"]) == 16
    assert got["loss"] == pytest.approx(stored["loss"], rel=CURVE_REL_TOL["fp32"])
    assert got["val_loss"] == pytest.approx(stored["val_loss"], rel=CURVE_REL_TOL["fp32"])
    model = get_preset("debug").model
    tol = forward_rel_tol(model.n_layers, model.d_model)  # 5.0e-6
    assert got["init_val_loss"] == pytest.approx(stored["init_val_loss"], rel=tol)
    assert got["init_mean_pr"] == pytest.approx(stored["init_mean_pr"], rel=tol)
    assert len(got["init_layers"]) == len(stored["init_layers"]) == model.n_layers
    for g, s in zip(got["init_layers"], stored["init_layers"]):
        assert g.keys() == s.keys()
        for k in s:
            assert g[k] == pytest.approx(s[k], rel=tol, abs=tol), k
