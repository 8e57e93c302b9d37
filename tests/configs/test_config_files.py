"""--config FILE: JSON or YAML, nested like config.json or flat; the preset, then the file, then the options."""
import json
import re

import pytest

import train_llm
from configs import ConfigError, config_from_args
from configs.files import load_run_config, read_config_file, save_run_config
from research.studies import QK_NORM
from research.studies.runner import build_parser as study_parser
from research import qk_norm_25m_study
from tests.helpers import assert_same_run, stops


def _cfg(argv):
    return config_from_args(train_llm.build_parser(argv).parse_args(argv))


def _help_default(help_text: str, option: str) -> str:
    """The 'Default: X' of an option's help (configs.help.field_help; argparse may wrap it onto the next line)."""
    flat = " ".join(help_text.split())
    return flat.split(f"{option} ", 1)[1].split("Default: ", 1)[1].split(" --", 1)[0].strip()


@pytest.mark.slow
def test_a_saved_config_json_fed_back_reproduces_the_run_bit_for_bit(straight_run, tmp_path):
    again = tmp_path / "again"
    train_llm.main(["--config", str(straight_run / "config.json"), "--out", str(again), "--no_progress"])
    assert json.loads((again / "config.json").read_text()) == json.loads((straight_run / "config.json").read_text())
    assert_same_run(straight_run, again, 6)  # same losses, grad norms, probes and final weights


def test_the_preset_then_the_file_then_the_options(tmp_path):
    f = tmp_path / "run.yaml"  # YAML reads 1e-3 as text and `off` as false: both must arrive as meant
    f.write_text("preset: debug\nn_layers: 3\nmuon_lr: 1e-3\ncompile: off\npaths: [a.txt, b.txt]\n"
                 "train:\n  tokens: 2048\n")
    cfg = _cfg(["--config", str(f), "--out", "x"])
    assert (cfg.preset, cfg.model.vocab_size, cfg.model.d_model) == ("debug", 512, 128)  # the file's preset
    assert (cfg.model.n_layers, cfg.train.muon_lr, cfg.train.compile, cfg.train.tokens) == (3, 0.001, "off", 2048)
    assert cfg.data.paths == ["a.txt", "b.txt"]
    cfg = _cfg(["--config", str(f), "--out", "x", "--n_layers", "4", "--preset", "tiny"])
    assert (cfg.preset, cfg.model.vocab_size, cfg.model.n_layers, cfg.train.tokens) == ("tiny", 4096, 4, 2048)


def test_help_shows_the_file_values_over_the_preset(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"preset": "88m", "model": {"n_layers": 3}, "source": "files"}))  # --paths to come
    text = train_llm.build_parser(["--config", str(f)]).format_help()
    assert "Defaults below are those of the 88m preset with" in text
    assert _help_default(text, "--n_layers N") == "3 (from c.json)"
    assert _help_default(text, "--d_model N") == "512"  # 88m's
    study = study_parser(QK_NORM, argv=["--config", str(f), "--device", "cpu"]).format_help()
    assert _help_default(study, "--n_layers N") == "3 (from c.json)"
    assert _help_default(study, "--tokens N") == "8000000"


@pytest.mark.parametrize("content,name,message", [
    ({"train": {"n_layers": 3}}, "c.json", r"c.json: unknown key 'n_layers' in section 'train' \(it belongs to "
                                           r"section 'model'\)"),
    ({"train": {"lr": 0.1}}, "c.json", r"unknown key 'lr' in section 'train'; the fields of train are: tokens,"),
    ({"n_layer": 3}, "c.json", r"c.json: unknown key 'n_layer': not a config field nor a section"),
    ({"n_layers": "eight"}, "c.json", r"c.json: n_layers: expected a whole number, found 'eight'"),
    ({"model": {"n_layers": 2}, "n_layers": 3}, "c.json", r"n_layers given twice"),
    ({"preset": "huge"}, "c.json", r"c.json: preset 'huge' is not a named preset"),
    ('{"model": {"n_layers": 2}', "c.json", r"c.json: not valid JSON \(Expecting"),
    ("model: [1,\n", "c.yaml", r"c.yaml: not valid YAML"),
    ("- 1\n- 2\n", "c.yml", r"c.yml: expected a mapping of config fields"),
    # a value of the wrong shape is named where the file is read, with what was found and the fix
    ("preset: {name: debug}\n", "c.yaml", r"c.yaml: preset: expected the name of a preset \(tiny, 88m, 1b, debug\), "
                                          r"found \{'name': 'debug'\}. Fix: write it as a name \(preset: debug\), "
                                          r"or leave it out and pass --preset"),
    ({"preset": ["debug"]}, "c.json", r"c.json: preset: expected the name of a preset .*found \['debug'\]"),
    ({"preset": 1}, "c.json", r"c.json: preset: expected the name of a preset .*found 1\. Fix"),
    ("model: 3\n", "c.yaml", r"c.yaml: section 'model' must be a mapping of its fields, found 3"),
    ("n_layers: [2]\n", "c.yaml", r"c.yaml: n_layers: expected a whole number, found \[2\]"),
    ("model:\n  n_heads: {a: 1}\n", "c.yaml", r"c.yaml: \[model\] n_heads: expected a whole number, found \{'a': 1\}"),
    # a key given twice is refused, not read as its last value
    ('{"preset": "debug", "train": {"tokens": 1024, "tokens": 2048}}', "c.json",
     r"c.json: key 'tokens' appears twice in one mapping: a reader would keep only the last, silently. Fix: keep "
     r"one of them"),
    ('{"n_layers": 2, "n_layers": 2}', "c.json", r"c.json: key 'n_layers' appears twice"),
    ("preset: debug\nmodel:\n  n_layers: 2\n  n_layers: 3\n", "c.yaml",
     r"c.yaml: key 'n_layers' appears twice in one mapping \(line 4\): a reader would keep only the last, silently. "
     r"Fix: keep one of them"),
    ("preset: debug\npreset: tiny\n", "c.yml", r"c.yml: key 'preset' appears twice in one mapping \(line 2\)"),
])
def test_mistakes_in_a_file_get_one_clear_error_naming_it(tmp_path, content, name, message, capsys):
    f = tmp_path / name
    f.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ConfigError, match=message):
        read_config_file(f)
    assert re.match(f"error: .*{message}", stops(capsys, train_llm.main, ["--config", str(f), "--out",
                                                                           str(tmp_path / "run")]))
    assert not (tmp_path / "run").exists()


def test_a_missing_file_and_a_study_without_probes_are_refused(tmp_path, capsys):
    assert re.match(r"error: --config .*nope.yaml: no such file",
                    stops(capsys, train_llm.main, ["--config", str(tmp_path / "nope.yaml"), "--out",
                                                   str(tmp_path / "run")]))
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"probe": {"probe_every": 0}}))
    assert stops(capsys, qk_norm_25m_study.main, ["--config", str(f), "--out", str(tmp_path / "study")]
                 ).startswith("error: probe_every=0: a study probes its runs")
    assert not (tmp_path / "study").exists()


def test_a_saved_config_json_with_a_key_twice_is_refused(tmp_path):
    from configs import get_preset

    path = tmp_path / "config.json"
    save_run_config(get_preset("debug"), path)
    text = path.read_text()
    path.write_text(text.replace('"n_layers": ', '"n_layers": 9, "n_layers": ', 1))
    with pytest.raises(ConfigError, match=r"cannot read config .*config.json: key 'n_layers' appears twice in one "
                                          r"mapping.*; fix or restore config.json"):
        load_run_config(path)


def test_a_huge_value_is_refused_in_one_short_line(tmp_path, capsys):
    """An alias bomb (10**8 zeros through shared lists) as a field's value, and a whole number past 64 bits: one line
    that shows at most 200 characters of the value (issue 50)."""
    from tests.research.studies.test_study_file import BOMB_SHOWN, alias_bomb
    f = tmp_path / "c.yaml"
    for text, message in ((f"n_layers: {alias_bomb()}\n", f"c.yaml: n_layers: expected a whole number, found "
                                                          f"{BOMB_SHOWN}"),
                          (f"tokens: {10 ** 30}\n", f"tokens={10 ** 30} is beyond the 64-bit whole numbers a run "
                                                    f"computes with: give one below 2**63")):
        f.write_text(text)
        line = stops(capsys, train_llm.main, ["--config", str(f), "--out", str(tmp_path / "run")])
        assert message in line and len(line) < 600, line
    assert not (tmp_path / "run").exists()


def test_yaml_merge_keys_work_and_a_key_twice_or_a_python_tag_is_still_refused(tmp_path, capsys):
    """`<<: *base` (and `<<: [*a, *b]`, an inline mapping) merges as yaml.safe_load merges it: the keys the mapping
    writes itself override the merged ones; a key written twice, and a !!python tag, stay refused (issue 50)."""
    f = tmp_path / "c.yaml"
    f.write_text("preset: debug\nmodel: {<<: {n_layers: 3, n_heads: 4, d_model: 64}, n_heads: 2}\n"
                 "train: {<<: [{tokens: 2048, muon_lr: 0.01}, {tokens: 4096, adamw_lr: 0.002}], muon_lr: 0.02}\n")
    assert read_config_file(f).values == {"n_layers": 3, "n_heads": 2, "d_model": 64, "tokens": 2048,
                                          "muon_lr": 0.02, "adamw_lr": 0.002}  # the first merged mapping wins
    cfg = _cfg(["--config", str(f), "--out", "x"])
    assert (cfg.model.n_layers, cfg.model.n_heads, cfg.model.d_model, cfg.train.tokens) == (3, 2, 64, 2048)
    for text, message in (
            ("model: {<<: {n_heads: 4}, n_layers: 2, n_layers: 3}\n",
             "c.yaml: key 'n_layers' appears twice in one mapping (line 1): a reader would keep only the last"),
            ("model: {<<: 3}\n", "c.yaml: not valid YAML (while constructing a mapping"),
            ("n_layers: !!python/object/apply:os.system ['true']\n",
             "c.yaml: not valid YAML (could not determine a constructor for the tag "
             "'tag:yaml.org,2002:python/object/apply:os.system'")):
        f.write_text(text)
        line = stops(capsys, train_llm.main, ["--config", str(f), "--out", str(tmp_path / "run")])
        assert line.startswith(f"error: {f.parent / message}"), line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text, name, problem", [
    ("n_layers: " + "1" * 5000 + "\n", "c.yaml", "a whole number of over 4,300 digits, more than Python reads"),
    ('{"n_layers": ' + "1" * 5000 + "}", "c.json", "a whole number of over 4,300 digits, more than Python reads"),
    ("n_layers: " + "[" * 20000 + "]" * 20000 + "\n", "c.yaml", "lists or objects nested deeper than a reader follows"),
    ('{"n_layers": ' + "[" * 20000 + "]" * 20000 + "}", "c.json",
     "lists or objects nested deeper than a reader follows"),
    ("n_layers: 2020-13-45\n", "c.yaml", "month must be in 1..12"),  # YAML reads it as a date
])
def test_what_python_refuses_to_read_is_one_line(tmp_path, capsys, text, name, problem):
    """Python's readers raise these as ValueError or RecursionError, not as the reader's own error: each is one line
    naming the file (issue 50)."""
    f = tmp_path / name
    f.write_text(text)
    line = stops(capsys, train_llm.main, ["--config", str(f), "--out", str(tmp_path / "run")])
    assert line == f"error: {f}: not valid {'JSON' if name.endswith('json') else 'YAML'} ({problem})", line


def test_a_spike_alarm_or_paths_given_twice_is_refused_in_one_line(tmp_path, capsys):
    """Both would keep the last silently, where the second more likely means 'also' (issue 50), and say so; every
    other field given twice is refused too, with the reason of an option that takes one value (issue 65)."""
    out = str(tmp_path / "run")
    assert stops(capsys, train_llm.main, ["--preset", "debug", "--spike_alarm", "grad_norm:5", "--spike_alarm",
                                          "logit_max:30", "--out", out]) == (
        "error: --spike_alarm given twice (grad_norm:5, then logit_max:30): a run has one alarm; give the one to "
        "watch. Fix: give --spike_alarm once")
    assert stops(capsys, train_llm.main, ["--preset", "debug", "--paths", "a.txt,b.txt", "--paths", "c.txt", "--out",
                                          out]) == (
        "error: --paths given twice (a.txt,b.txt, then c.txt): every file goes in one --paths, comma-separated "
        "(a.txt,b.jsonl,folder). Fix: give --paths once")
    assert stops(capsys, train_llm.main, ["--preset", "debug", "--tokens", "512", "--kv_cache", "true", "--tokens",
                                          "1024", "--out", out]) == (
        "error: --tokens given twice (512, then 1024): it takes one value. Fix: give --tokens once")
    assert stops(capsys, train_llm.main, ["--kv_cache", "true", "--kv_cache", "false", "--out", out]) == (
        "error: --kv_cache given twice (true, then false): it takes one value. Fix: give --kv_cache once")
    assert not (tmp_path / "run").exists()


def test_a_config_file_one_may_not_read_gets_the_fix_of_a_read(tmp_path, capsys, monkeypatch):
    """Root reads any file, so the refusal is raised where the system would raise it (issue 50: read errors were given
    no fix, or a write's); a file that is not UTF-8 is named as such."""
    import errno
    from pathlib import Path
    f = tmp_path / "c.yaml"
    f.write_text("n_layers: 2\n")
    real = Path.read_text

    def refused(self, *args, **kwargs):
        if self == f:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Path, "read_text", refused)
    assert stops(capsys, train_llm.main, ["--config", str(f), "--out", str(tmp_path / "run")]) == (
        f"error: --config {f}: cannot read it: permission denied ({f}). Fix: make it readable to you (its "
        f"permissions, and those of the folders above it)")
    monkeypatch.setattr(Path, "read_text", real)
    f.write_bytes(b"n_layers: \xff\n")
    assert stops(capsys, train_llm.main, ["--config", str(f), "--out", str(tmp_path / "run")]) == (
        f"error: --config {f}: cannot read it: not UTF-8 text (invalid start byte at byte 10). Fix: save it as UTF-8")
    assert not (tmp_path / "run").exists()
