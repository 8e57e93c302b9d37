"""The qk-audit command: exit 0 where every check is as declared, 1 where one differs (its report printed, a --json
record that its declared format accepts), 2 with one line for a bad input; the two shipped real models give no
finding."""
from __future__ import annotations

import json

import pytest

from research import qk_audit
from research.results.file_formats import AUDIT
from tests.helpers import stops
from tests.research.inspection.builders import make_hf_model
from tests.research.inspection.test_real_models import _installed
from utils.formats import check

FACTORY = '''
from transformers import AutoModelForCausalLM

def ones(path):  # a port whose loader drops layer 1's k norm gains
    model = AutoModelForCausalLM.from_pretrained(path)
    model.model.layers[1].self_attn.k_norm.weight.data.fill_(1.0)
    return model

def plain(path):
    return AutoModelForCausalLM.from_pretrained(path)

def nothing(path):
    return 3
'''


def audit_cli(capsys, argv) -> tuple[int, str]:
    capsys.readouterr()
    code = qk_audit.main(argv)
    return code, capsys.readouterr().out


def test_a_clean_folder_exits_0_and_a_planted_bug_exits_1_with_its_record(tmp_path, capsys):
    folder = make_hf_model("qwen3", tmp_path / "qwen3")
    code, out = audit_cli(capsys, [str(folder), "--seq_len", "24", "--json", str(tmp_path / "clean.json")])
    assert code == 0 and "12 checks: 12 as declared, 0 differ, 0 not measurable" in out
    (tmp_path / "port.py").write_text(FACTORY)
    code, out = audit_cli(capsys, [str(folder), "--factory", f"{tmp_path / 'port.py'}:ones", "--seq_len", "24",
                                   "--json", str(tmp_path / "bug.json")])
    assert code == 1
    assert "layer   1  k_norm   differs: runs gain all ones, the checkpoint holds" in out
    record = json.loads((tmp_path / "bug.json").read_text())
    check(AUDIT, record)
    assert record["summary"] == {"as declared": 11, "differs": 1, "not measurable": 0}
    assert [f["check"] for f in record["findings"] if f["status"] == "differs"] == ["k_norm"]
    code, _ = audit_cli(capsys, [str(folder), "--factory", f"{tmp_path / 'port.py'}:plain", "--seq_len", "24"])
    assert code == 0


def test_bad_inputs_stop_with_one_line(tmp_path, capsys):
    (tmp_path / "port.py").write_text(FACTORY)
    assert stops(capsys, qk_audit.main, []) == "error: give MODEL, or --factory FILE.py:FUNCTION"
    assert stops(capsys, qk_audit.main, ["--factory", "nope.py:x"]).startswith("error: --factory nope.py:x: give")
    assert stops(capsys, qk_audit.main, ["--factory", f"{tmp_path / 'port.py'}:missing"]).endswith(
        "has no function 'missing'. Fix: name a function defined there")
    assert stops(capsys, qk_audit.main, [str(tmp_path), "--factory", f"{tmp_path / 'port.py'}:nothing"]).endswith(
        "returned int, not a torch model. Fix: return the model")
    assert "absent' not found: no such folder or file" in stops(capsys, qk_audit.main, [str(tmp_path / "absent")])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_the_shipped_real_models_give_no_finding(name, model_cache, capsys):
    if not _installed(name):
        pytest.skip(f"{name} is not installed (requirements-data.txt)")
    code, out = audit_cli(capsys, [name, "--cache_dir", str(model_cache), "--batch", "1", "--seq_len", "48"])
    assert code == 0 and " 0 differ, 0 not measurable" in out, out[-3000:]


PORT = '''
from transformers import AutoModelForCausalLM

def scaled(path):  # a port whose layer 1 attention scales its logits by 1, not 1/sqrt(16)
    model = AutoModelForCausalLM.from_pretrained(path)
    model.model.layers[1].self_attn.scaling = 1.0
    return model
'''


def test_a_port_against_its_reference_parts_where_its_check_differs(tmp_path, capsys):
    folder = make_hf_model("llama", tmp_path / "llama")
    (tmp_path / "port.py").write_text(PORT)
    code, out = audit_cli(capsys, [str(folder), "--reference", str(folder), "--seq_len", "24"])
    assert code == 0 and "against the reference: the models agree on every layer's q, k, v and attention output" \
        in out
    code, out = audit_cli(capsys, [str(folder), "--factory", f"{tmp_path / 'port.py'}:scaled", "--reference",
                                   str(folder), "--seq_len", "24", "--json", str(tmp_path / "a.json")])
    assert code == 1
    assert ("against the reference: they part at layer 1: out differs by" in out and "; explained by that layer's "
            "scale (differs: runs scale 1, config says 0.25 (1/sqrt(16)))" in out), out
    record = json.loads((tmp_path / "a.json").read_text())
    check(AUDIT, record)
    assert record["comparison"]["parting"]["layer"] == 1 and record["reference"]["summary"]["differs"] == 0


GEMMA4_PORT = '''
from transformers import AutoModelForCausalLM

def scaled(path):  # a Gemma 4 port that scales layer 3's logits by 1/sqrt(d) where the model uses 1 (mlc-llm #3485)
    model = AutoModelForCausalLM.from_pretrained(path)
    model.model.layers[3].self_attn.scaling = 32 ** -0.5
    return model
'''


def test_a_gemma4_folder_and_its_port_against_it(tmp_path, capsys):
    """Gemma 4's per-layer head sizes through the whole command: its saved gains compared, --reference of the same
    per-layer shape, the port's scale named where they part. The test tokenizer reads most words of the text as
    [UNK], id 0, which is Gemma's pad id, whose embedding row is zero: zero keys at those positions leave RoPE
    measurable, and layer 0's values (one zero vector for every [UNK]) leave its weights unsolvable, said so."""
    folder = make_hf_model("gemma4", tmp_path / "gemma4")
    code, out = audit_cli(capsys, [str(folder), "--seq_len", "24"])
    assert code == 0 and "32 checks: 31 as declared, 0 differ, 1 not measurable" in out, out
    assert "layer   0  scale    not measurable here: too few positions to solve weights" in out
    assert "gain the checkpoint's" in out
    (tmp_path / "port.py").write_text(GEMMA4_PORT)
    code, out = audit_cli(capsys, [str(folder), "--factory", f"{tmp_path / 'port.py'}:scaled", "--reference",
                                   str(folder), "--seq_len", "24"])
    assert code == 1 and "they part at layer 3: out differs by" in out and "runs scale 0.1768 (1/sqrt(32)), " \
        "config says 1" in out, out
