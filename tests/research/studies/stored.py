"""Stored study folders of every kind, and what they drew when they were stored: what a refactor must not change.

    python -m tests.research.studies.stored --write [KIND ...]    # run the studies again and store them anew
    python -m tests.research.studies.stored --redraw [KIND ...]   # keep the stored inputs, store today's drawing

Each archive holds a study folder's inputs as the study wrote them (study.json and the runs' results.json, or the
study's own JSON file) and, under expected/, what rendering drew from them: report.md, the combined file, and
figures.txt (the figure files' names). tests/research/studies/test_stored.py renders every folder again and
compares. Redraw (or rebuild) only for a change meant to alter a report, read the diff of expected/report.md it
prints, and say so in the commit.
"""
from __future__ import annotations

import difflib
import gzip
import io
import sys
import tarfile
import tempfile
from pathlib import Path

STORED = Path(__file__).parent / "stored"
# The input files a render reads back, by name; everything else a study leaves (checkpoints, logs) is not stored.
INPUTS = ("study.json", "results.json", "combined_results.json", "pretrained_keys.json", "checkpoint_keys.json",
          "metrics.jsonl")  # the spike-warning study reads each run's per-step log
TEXT_OUTPUTS = ("report.md", "combined.json", "combined_results.json")
FIGURE_SUFFIX = ".png"


def _catalog(script: str, *extra: str):
    def build(out: Path) -> None:
        import importlib
        module = importlib.import_module(f"research.{script}")
        module.main(["--preset", "debug", "--seeds", "0", "1", "--no_progress", "--out", str(out), *extra])
    return build


def _finetune(out: Path) -> None:
    from research import finetune_keys_study
    from tests.research.inspection.builders import make_hf_model
    model = make_hf_model("qwen3", out.parent / "qwen3")
    assert finetune_keys_study.main(["--model", str(model), "--out", str(out), "--tokens", "256", "--batch_size",
                                     "2", "--seq_len", "16", "--seeds", "0", "1", "--no_progress"]) == 0


def _text(root: Path) -> Path:
    from tests.research.inspection.builders import SENTENCES
    text = root / "text.txt"
    text.write_text(" ".join(SENTENCES * 40))
    return text


def _pretrained(out: Path) -> None:
    from research import pretrained_keys_study
    from tests.research.inspection.builders import make_hf_model
    model = make_hf_model("llama", out.parent / "llama")
    assert pretrained_keys_study.main(["--models", str(model), "--text", str(_text(out.parent)), "--batches", "3",
                                       "--batch", "2", "--seq_len", "16", "--out", str(out), "--no_progress"]) == 0


def _checkpoints(out: Path) -> None:
    from research import checkpoint_keys_study, export_hf
    from tests.research.inspection.test_checkpoint_keys import STEPS, _train_run
    run = _train_run(out.parent / "run")
    exports = []
    for step in STEPS:
        assert export_hf.main([str(run), str(out.parent / f"hf-{step}"), "--step", str(step)]) == 0
        exports.append(str(out.parent / f"hf-{step}"))
    assert checkpoint_keys_study.main(["--checkpoints", *exports, "--text", str(_text(out.parent)), "--batches", "3",
                                       "--batch", "2", "--seq_len", "16", "--out", str(out), "--no_progress"]) == 0


STUDY_FILE = """name: variants
seeds: [0, 1]
baseline: QK
preset: debug
conditions:
  QK: {qk_norm: learned}
  NoQK: {qk_norm: none}
  NoQK_clip: {qk_norm: none, qk_clip: 5}
"""


def _study_file(out: Path) -> None:
    from research import study
    path = out.parent / "variants.yaml"
    path.write_text(STUDY_FILE)
    study.main([str(path), "--no_progress", "--out", str(out)])


# kind -> how its stored folder was made (a study run on a tiny budget)
BUILDERS = {
    "qk_norm": _catalog("qk_norm_25m_study"),
    "pilot": _catalog("qk_norm_500k_study"),
    "keys": _catalog("key_dynamics_study"),
    "heads": _catalog("head_specialization_study"),
    "lr": _catalog("lr_sensitivity_study", "--lr_multipliers", "1", "64"),
    "spikes": _catalog("spike_warning_study", "--lr_multipliers", "1"),
    "finetune": _finetune,
    "pretrained_keys": _pretrained,
    "checkpoint_keys": _checkpoints,
    "conditions": _study_file,
}


def drawn(folder: Path) -> dict[str, bytes]:
    """The outputs of a rendered folder: its text outputs' bytes, and figures.txt listing its figures' names."""
    out = {name: (folder / name).read_bytes() for name in TEXT_OUTPUTS if (folder / name).is_file()}
    figures = sorted(p.name for p in folder.iterdir() if p.suffix == FIGURE_SUFFIX)
    out["figures.txt"] = "".join(f"{name}\n" for name in figures).encode()
    return out


def _store(kind: str, folder: Path) -> Path:
    """Archive the inputs of the study in `folder` and what rendering drew there (drawn) as the stored `kind`."""
    expected = drawn(folder)
    archive = STORED / f"{kind}.tar.gz"
    archive.parent.mkdir(exist_ok=True)
    with gzip.GzipFile(archive, "wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:  # same bytes each time
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            if path.is_file() and path.name in INPUTS and (len(rel.parts) > 1 or path.name not in TEXT_OUTPUTS):
                add(f"study/{rel.as_posix()}", path.read_bytes())
        for name, data in expected.items():
            add(f"expected/{name}", data)
    return archive


def write(kind: str) -> Path:
    """Run the kind's study on its tiny budget again and store it."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "study"
        BUILDERS[kind](folder)
        return _store(kind, folder)


def redraw(kind: str) -> Path:
    """Draw the stored inputs with today's code and store that drawing as expected; print the report's diff."""
    from research.studies.render import render_study
    with tempfile.TemporaryDirectory() as tmp:
        folder, expected = unpack(kind, Path(tmp))
        render_study(folder)
        new = (folder / "report.md").read_text().splitlines(keepends=True)
        old = expected.get("report.md", b"").decode().splitlines(keepends=True)
        sys.stdout.writelines(difflib.unified_diff(old, new, f"{kind}/expected/report.md", f"{kind}/report.md"))
        return _store(kind, folder)


def unpack(kind: str, root: Path) -> tuple[Path, dict[str, bytes]]:
    """(the stored study folder unpacked under root, the expected outputs by name)."""
    with tarfile.open(STORED / f"{kind}.tar.gz") as tar:
        tar.extractall(root, filter="data")
    expected = {p.name: p.read_bytes() for p in (root / "expected").iterdir()}
    return root / "study", expected


if __name__ == "__main__":
    if sys.argv[1:2] not in (["--write"], ["--redraw"]):
        sys.exit(__doc__)
    for kind in sys.argv[2:] or BUILDERS:
        path = (write if sys.argv[1] == "--write" else redraw)(kind)
        print(f"{kind}: {path} ({path.stat().st_size:,} bytes)", flush=True)
