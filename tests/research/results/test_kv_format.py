"""results.json's key cache fields declared (research.results.checks): a layer record's pair_share, a probe record's
rotary and kv_cache, the run's kv_cache; optional for reading, so that files written before them still load."""
from __future__ import annotations

import copy
import json

import pytest

from research.results import ResultsError, load_results, validate
from research.results.published import json_schemas
from tests.helpers import REFERENCE
from tests.research.analysis.test_kv_quantities import kv_run


def _with_probe_fields(run: dict) -> dict:
    layer = run["probes"][-1]["layers"][0]
    layer["pair_share"] = {"k_norm": [[0.75, 0.25]], "q_norm": [[0.5, 0.5], [1.0, 0.0]], "logit": [[1.5, None]] * 2}
    run["probes"][-1]["rotary"] = {"pairing": "half", "context": 128}
    run["probes"][-1]["kv_cache"] = {k: v for k, v in run["kv_cache"].items() if k != "step"}
    return run


def test_the_key_cache_fields_validate_and_a_wrong_one_is_named():
    run = _with_probe_fields(kv_run("QK", 0))
    validate(copy.deepcopy(run))
    breaks = [
        (lambda r: r["kv_cache"]["layers"][0]["quantized"]["pre_rope"].update({"per_tok": {}}),
         r"kv_cache.layers\[0\].quantized\['pre_rope'\] should be keyed by a scheme \(per_channel, per_token, "
         r"per_token_hadamard\), found the key 'per_tok'"),
        (lambda r: r["kv_cache"]["loss"]["by_bits"].update({"four": 4.0}),
         r"kv_cache.loss.by_bits should be keyed by bits \('16', '8', ...\), found the key 'four'"),
        (lambda r: r["kv_cache"].update({"usable_k_bits": 0}), "kv_cache.usable_k_bits should be a number of bits"),
        (lambda r: r["kv_cache"].pop("layers"), "kv_cache should hold layers"),
        (lambda r: r["probes"][-1]["layers"][0]["pair_share"].update({"k_norm": [0.75, 0.25]}),
         r"probes\[1\].layers\[0\].pair_share.k_norm\[0\] should be a list"),
        (lambda r: r["probes"][-1]["rotary"].update({"pairing": "zigzag"}),
         r"probes\[1\].rotary.pairing should be one of half, interleaved"),
    ]
    for change, message in breaks:
        bad = copy.deepcopy(run)
        change(bad)
        with pytest.raises(ResultsError, match=message):
            validate(bad)


def test_files_written_before_them_still_load():
    for cond in ("QK", "QK_frozen", "NoQK"):
        res = load_results(REFERENCE / cond / "results.json")
        assert "kv_cache" not in res


def test_the_json_schema_says_them():
    schema = json.loads(json_schemas()["results.schema.json"])
    kv = schema["properties"]["kv_cache"]
    assert kv["required"] == ["sequences", "layers"] and "kv_cache" not in schema.get("required", [])
    layer = kv["properties"]["layers"]["items"]
    assert layer["properties"]["quantized"]["propertyNames"] == {"pattern": "^(?:pre_rope|post_rope)$"}
