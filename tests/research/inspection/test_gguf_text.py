"""GGUF resolution and its errors, real-text windows, token labels the font can draw (no real weights)."""
from __future__ import annotations

import warnings

import pytest
import torch

from research.access import InspectError, load_model
from research.access.gguf import find_gguf, packaged_gguf, quantization_note
from research.inspection.text import Documents, text_windows
from research.inspection.tour import excluding_query0
from research.plots.common import drawable, subplots


def _word_tokenizer(bos: bool):
    """Words w0..w999 are tokens 3..1002; with bos, every text starts with <s> (id 1), as Gemma's does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, **{f"w{i}": 3 + i for i in range(1000)}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    if bos:
        t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def tok():
    return _word_tokenizer(bos=True)


def _words(n, start=0):
    return " ".join(f"w{i}" for i in range(start, start + n))


def test_gguf_specs_and_their_errors(tmp_path):
    (tmp_path / "two").mkdir()
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / "two" / name).write_bytes(b"x")
    with pytest.raises(InspectError, match="holds 2 GGUF files"):
        find_gguf(str(tmp_path / "two"), tmp_path)
    with pytest.raises(InspectError, match="no such file"):
        find_gguf(str(tmp_path / "missing.gguf"), tmp_path)
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "m.gguf").write_bytes(b"x")
    assert find_gguf(str(tmp_path / "one"), tmp_path)[0] == (tmp_path / "one" / "m.gguf").resolve()
    assert find_gguf(str(tmp_path), tmp_path) is None  # no GGUF here: the other loaders decide
    # a file that is not GGUF: one error naming it, nothing cached
    with pytest.raises(InspectError, match="not a readable GGUF file"):
        load_model(str(tmp_path / "one" / "m.gguf"), cache_dir=tmp_path / "cache", log=lambda s: None)
    converted = tmp_path / "cache" / "hf-from-gguf"
    assert not converted.exists() or not any(converted.iterdir())
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(InspectError, match="not a GGUF file"):
        load_model(str(tmp_path / "weights.bin"))


def test_an_architecture_transformers_cannot_read_is_one_clear_error(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(path), "rwkv-alien")
    w.add_tensor("token_embd.weight", torch.zeros(4, 2).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(InspectError, match="architecture 'rwkv-alien' cannot be read"):
        load_model(str(path), cache_dir=tmp_path / "cache", log=lambda s: None)


def test_parts_are_joined_and_checked(tmp_path, monkeypatch):
    from research.access import gguf as g
    pkg = tmp_path / "pkg"
    (pkg / "data").mkdir(parents=True)
    parts = []
    for i, chunk in enumerate((b"hello ", b"world")):
        d = tmp_path / f"part{i}"
        (d / "data").mkdir(parents=True)
        (d / "data" / f"m.gguf.part{i:02d}").write_bytes(chunk)
        parts.append(d)
    import hashlib
    (pkg / "data" / "SHA256SUMS").write_text(f"{hashlib.sha256(b'hello world').hexdigest()}  m.gguf\n")
    dirs = {"pkg": pkg, "p0": parts[0], "p1": parts[1]}
    monkeypatch.setattr(g, "_package_dir", lambda m: dirs.get(m))
    monkeypatch.setitem(g.PACKAGED, "toy", g.Packaged("toy", "m.gguf", "pkg", parts=("p0", "p1")))
    out = packaged_gguf("toy", tmp_path / "cache", log=lambda s: None)[0]
    assert out.read_bytes() == b"hello world"
    (pkg / "data" / "SHA256SUMS").write_text("0" * 64 + "  m.gguf\n")  # another version's sum
    with pytest.raises(InspectError, match="not 000000000000"):
        packaged_gguf("toy", tmp_path / "cache2", log=lambda s: None)
    dirs.pop("p1")
    with pytest.raises(InspectError, match="part 2 of 2 .* is not installed"):
        packaged_gguf("toy", tmp_path / "cache3", log=lambda s: None)


def test_quantization_note_names_the_types():
    note = quantization_note({"gguf_file": "m.gguf", "tensor_types": {"Q4_1": 75, "F32": 25}})
    assert "m.gguf: Q4_1 75%, F32 25%" in note and "exact" in note
    assert quantization_note(None) is None


def test_windows_one_per_document_seeded_with_bos(tok):
    docs = Documents([_words(30, 100 * d) for d in range(6)], "toy", "0" * 64, "toy")
    a = text_windows(tok, docs, n=4, seq_len=9, seed=3)
    assert a.shape == (4, 9) and (a[:, 0] == tok.bos_token_id).all()  # the toy tokenizer puts <s> first
    assert len(set(docs.picked)) == 4  # four different documents
    for row, d in zip(a, docs.picked):  # each window is 8 consecutive words of its document
        words = tok.decode(row[1:]).split()
        first = int(words[0][1:])
        assert first // 100 == d and words == [f"w{first + j}" for j in range(8)]
    assert torch.equal(a, text_windows(tok, docs, n=4, seq_len=9, seed=3))
    plain = text_windows(_word_tokenizer(bos=False), docs, n=4, seq_len=9, seed=3)  # no BOS: 9 words
    assert (plain[:, 0] != 1).all() and len(set(plain.flatten().tolist())) == 36
    assert not torch.equal(a, text_windows(tok, docs, n=4, seq_len=9, seed=4))


def test_windows_fall_back_to_cutting_one_text_and_say_when_it_is_too_short(tok):
    one = Documents([_words(40)], "file", "0" * 64, "a file")
    ids = text_windows(tok, one, n=4, seq_len=11, seed=0)  # 10 words per window: exactly 4 disjoint windows
    starts = sorted(int(tok.decode(r[1:]).split()[0][1:]) for r in ids)
    assert starts == [0, 10, 20, 30]
    with pytest.raises(InspectError, match="4 windows of 11 tokens, 5 needed"):
        text_windows(tok, one, n=5, seq_len=11)


def test_first_token_attention_without_query_0():
    # T = 4: query 0 gives 1, the others 0.2 each -> mean 0.4 over all, 0.2 without query 0
    assert excluding_query0(0.4, 4) == pytest.approx(0.2)
    assert excluding_query0(1.0, 7) == pytest.approx(1.0)


def test_drawable_labels_draw_without_warnings():
    assert drawable(" the") == " the"
    assert drawable("\n") == "\\n"
    assert drawable("日本") == "\\u65e5\\u672c"
    assert drawable("a$b$") == "a\\$b\\$"
    assert drawable("abcdef", 3) == "abc"
    fig, ax = subplots()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in ("日本", "ক", "த", "\u200b", "$x$y", "🜁"):
            ax.text(0.5, 0.5, drawable(t))
        fig.canvas.draw()
