"""Inputs that cannot work as given: a prompt longer than the model's context, options out of range, a
tokenizer with more ids than the model's embedding, damaged files, and Ctrl-C; each is cut with a note or
refused with one line naming the problem and the fix, never a traceback."""
from __future__ import annotations

import json

import pytest
import torch

from research import inspect_pretrained
from research.inspection import command as inspect_command
from research.access import InspectError, load_model
from research.inspection import inspect_model
from research import pretrained_keys_study as study
from research.studies import pretrained_keys
from research.inspection.dictionaries import word_ids
from research.inspection.key_study import measure_keys
from research.inspection.text import text_documents
from tests.research.inspection.builders import PROMPT, SENTENCES, make_tokenizer

LONG = " ".join([PROMPT] * 10)  # 160 word tokens: beyond the debug preset's 64 and the tiny HF models' 128


def _main(module, args: list[str]) -> int:
    """main(args)'s exit status (utils.cli.command raises SystemExit on a failure), failing the test (not the
    session) when a KeyboardInterrupt escapes it."""
    try:
        return module.main(args)
    except SystemExit as e:
        return e.code
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main()")


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(" ".join(SENTENCES * 40))
    return path


@pytest.fixture(scope="module")
def foreign_tokenizer(tmp_path_factory):
    """A Llama of 12 token rows and 8 positions saved with the builders' tokenizer of 31 tokens."""
    import transformers as tf
    d = tmp_path_factory.mktemp("foreign")
    cfg = tf.LlamaConfig(vocab_size=12, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8)
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    make_tokenizer(d)
    return d


# ---------------------------------------------------------------- the model's context
@pytest.mark.parametrize("family, context, field", [("own", 64, "max_seq_len of the run"),
                                                    ("gpt2", 128, "max_position_embeddings"),
                                                    ("llama", 128, "max_position_embeddings")])
@pytest.mark.slow
def test_a_prompt_beyond_the_context_is_cut_to_it_with_a_note(model_dirs, tmp_path, capsys, family, context, field):
    out = tmp_path / "out"
    assert _main(inspect_pretrained, ["--model", str(model_dirs[family]), "--prompt", LONG, "--out", str(out),
                                      "--top_k", "2"]) == 0
    err = capsys.readouterr().err
    assert (f"note: the prompt has 160 tokens, more than the model's context ({field} = {context}): inspecting "
            f"its first {context} tokens") in err
    r = json.loads((out / "inspect.json").read_text())
    assert r["n_tokens"] == context and r["context"] == {"limit": context, "field": field, "tokens_given": 160}
    assert (f"one prompt of {context} tokens (the prompt has 160 tokens: cut to the model's context, {field} = "
            f"{context})") in (out / "report.md").read_text()


@pytest.mark.slow
def test_default_text_windows_fit_the_context_of_a_debug_run(model_dirs, tmp_path, capsys, text_file):
    """No --prompt: windows of --seq_len 256 (the default) against the debug preset's max_seq_len 64."""
    out = tmp_path / "out"
    assert _main(inspect_pretrained, ["--model", str(model_dirs["own"]), "--text", str(text_file), "--batch", "2",
                                      "--out", str(out)]) == 0
    assert ("note: --seq_len 256 is more than the model's context (max_seq_len of the run = 64): windows of 64 "
            "tokens are used") in capsys.readouterr().err
    r = json.loads((out / "inspect.json").read_text())
    assert r["n_tokens"] == 64 and r["text"]["seq_len"] == 64 and r["batch"] == 2


def test_max_tokens_still_cuts_below_the_context_silently(model_dirs, capsys):
    _, tok, adapter = load_model(str(model_dirs["own"]))
    r = inspect_model(adapter, tok, LONG, max_tokens=10, top_k=2)
    assert r["n_tokens"] == 10 and "note" not in capsys.readouterr().err
    with pytest.raises(InspectError, match=r"--max_tokens 1: give at least 2"):
        inspect_model(adapter, tok, LONG, max_tokens=1)


# ---------------------------------------------------------------- numeric options
@pytest.mark.parametrize("module, args, message", [
    (inspect_command, ["--top_k", "0"], "--top_k 0: give 1..the model's vocabulary size"),
    (inspect_command, ["--top_k", "-3"], "--top_k -3: give 1..the model's vocabulary size"),
    (inspect_command, ["--max_tokens", "0"], "--max_tokens 0: give 2 or more"),
    (inspect_command, ["--max_tokens", "1"], "--max_tokens 1: give 2 or more"),
    (inspect_command, ["--batch", "0"], "--batch 0: give 1 or more"),
    (inspect_command, ["--seq_len", "1"], "--seq_len 1: give 2 or more"),
    (inspect_command, ["--dict_sample", "2"], "--dict_sample 2: give 3 or more"),
    (inspect_command, ["--head_layer", "-1"], "--head_layer -1: give 0..layers - 1"),
    (inspect_command, ["--layer", "-1"], "--layer -1: give 0..layers - 1"),
    (inspect_command, ["--seed", "-1"], "--seed -1: give 0 or more"),
    (pretrained_keys, ["--seed", "-1"], "--seed -1: give 0 or more"),
    (pretrained_keys, ["--batches", "0"], "--batches 0: give 1 or more"),
    (pretrained_keys, ["--batch", "-2"], "--batch -2: give 1 or more"),
    (pretrained_keys, ["--seq_len", "4"], "--seq_len 4: give 8 or more"),
    (pretrained_keys, ["--margin", "nan"], "--margin nan must be a share of the mean between 0 and 1"),
])
def test_numeric_options_that_cannot_work_are_refused_at_parse_time(capsys, module, args, message):
    with pytest.raises(SystemExit) as e:
        module.parse_args(["--model" if module is inspect_command else "--models", "m", *args])
    assert e.value.code == 2 and f"error: {message}" in capsys.readouterr().err


def test_options_beyond_the_model_are_refused_once_it_is_known(model_dirs, tmp_path, capsys, monkeypatch):
    from research.inspection import tour

    def no_forward(*args, **kwargs):
        raise AssertionError("the forward ran")
    monkeypatch.setattr(tour._Collector, "__init__", no_forward)  # every check comes before the forward
    model = str(model_dirs["llama"])
    for args, message in ((["--top_k", "301"], "error: --top_k 301: give 1..300 (the model's vocabulary has 300 "
                                               "tokens)"),
                          (["--layer", "3"], "error: heatmap layer 3 (--layer) is outside 0..2: the model has 3 "
                                             "layers"),
                          (["--positions", "40"], "error: logit-lens position 40 is outside the prompt's 16 tokens: "
                                                  "give --positions in -16..15")):
        assert _main(inspect_pretrained, ["--model", model, "--prompt", PROMPT, "--out", str(tmp_path / "o"),
                                          *args]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_the_key_study_refuses_windows_beyond_the_context_and_training_folders(model_dirs, capsys):
    _, tok, adapter = load_model(str(model_dirs["gpt2"]))
    with pytest.raises(InspectError, match=r"windows of 130 tokens \(--seq_len\) are longer than the context of .* "
                                           r"\(max_position_embeddings = 128\): pass --seq_len 128 or less"):
        measure_keys(adapter, torch.randint(3, 30, (2, 130)), 2, show_progress=False)
    with pytest.raises(SystemExit):
        pretrained_keys.parse_args(["--models", str(model_dirs["own"])])
    assert "a training folder of this project, which this study does not read; export it first (python " \
           "research/export_hf.py" in capsys.readouterr().err


# ---------------------------------------------------------------- a tokenizer that is not the model's
def test_a_tokenizer_with_more_ids_than_the_embedding_is_named(foreign_tokenizer, tmp_path, capsys):
    assert _main(inspect_pretrained, ["--model", str(foreign_tokenizer), "--prompt", "the cat ran over the old",
                                      "--top_k", "2", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert ("error: the prompt holds token id 23 but the model's embedding has 12 rows (ids 0..11) and the tokenizer "
            "has 31 tokens: the tokenizer and the model likely come from different checkpoints") in err
    assert "Traceback" not in err and err.count("error:") == 1
    _, tok, adapter = load_model(str(foreign_tokenizer))
    with pytest.raises(InspectError, match="the text holds token id 20 but the model's embedding has 12 rows"):
        measure_keys(adapter, torch.tensor([[3, 20, 4, 5]]), 1, show_progress=False)
    # dictionary words whose id has no row are skipped, not looked up
    kept, ids, skipped = word_ids(tok, ["the", "cat", "dog"], vocab=12)
    assert all(i < 12 for i in ids) and set(kept) | set(skipped) == {"the", "cat", "dog"} and skipped


# ---------------------------------------------------------------- damaged inputs
def test_a_config_json_that_is_not_utf8_is_an_inspect_error(tmp_path):
    (tmp_path / "config.json").write_bytes(b"\xff\xfe{\x00")
    with pytest.raises(InspectError, match="cannot read the config of"):
        load_model(str(tmp_path))


def test_a_binary_or_non_utf8_text_is_named_with_its_cause(tmp_path):
    (tmp_path / "bin.txt").write_bytes(b"words\x00\x01\x02")
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9 au lait")
    with pytest.raises(InspectError, match=r"--text .*bin.txt: a binary file, not text \(a NUL byte at offset 5\)\. "
                                           r"Fix: pass 'english' or another text file"):
        text_documents(str(tmp_path / "bin.txt"))
    with pytest.raises(InspectError, match=r"latin.txt: not UTF-8: byte 0xe9 at offset 3 \(line 1\)\. Fix: convert"):
        text_documents(str(tmp_path / "latin.txt"))


# ---------------------------------------------------------------- Ctrl-C
def test_ctrl_c_prints_one_line_and_exits_130(model_dirs, tmp_path, capsys, monkeypatch):
    from research.plots import inspection as figures

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt
    out = tmp_path / "out"
    args = ["--model", str(model_dirs["qwen3"]), "--prompt", PROMPT, "--out", str(out), "--top_k", "2"]
    monkeypatch.setattr(inspect_command, "load_model", interrupt)
    assert _main(inspect_pretrained, args) == 130
    assert capsys.readouterr().err == "interrupted; nothing was written\n" and not out.exists()
    monkeypatch.undo()
    monkeypatch.setattr(figures, "figures", interrupt)  # after inspect.json, before the figures
    assert _main(inspect_pretrained, args) == 130
    assert capsys.readouterr().err.endswith(f"\ninterrupted; kept {out / 'inspect.json'}; the figures and report.md "
                                            f"may be missing: run again\n")  # after transformers' loading bar
    monkeypatch.setattr(pretrained_keys, "text_documents", interrupt)
    assert _main(study, ["--models", "m", "--out", str(tmp_path / "study"), "--no_progress"]) == 130
    assert capsys.readouterr().err == "interrupted; nothing was written\n"
