"""research.decide.readers: each format read into Runs whose fields are known by hand (long and wide CSV, TSV, a W&B
runs-table export, JSON lines, TensorBoard folders written by SummaryWriter, a trackio store written by trackio), and
each bad input's one-line ReadError."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from research.decide import readers
from research.decide.readers import Columns, ReadError, Run, read_runs
from utils.errors import UserError

TB_NAMES = r"(?P<condition>[^/]+)/seed(?P<seed>\d+)"


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def fields(run: Run) -> tuple:
    """A run as a tuple that compares NaN equal to NaN (written "nan")."""
    values = {k: "nan" if math.isnan(v) else v for k, v in run.values.items()}
    return run.condition, run.seed, values, run.step, run.source


def test_a_long_csv_is_one_run_per_row_with_its_row_named(tmp_path):
    path = write(tmp_path, "runs.csv", "condition,seed,step,bpb,loss\nA,0,100,1.25,2.5\nA,1,100,1.5,2.75\n"
                                       "B,0,100,1.125,2.25\n\nB,1,100,1.0,2.0\n")
    assert [fields(r) for r in read_runs([path])] == [
        ("A", 0, {"bpb": 1.25, "loss": 2.5}, 100, f"{path} row 2"),
        ("A", 1, {"bpb": 1.5, "loss": 2.75}, 100, f"{path} row 3"),
        ("B", 0, {"bpb": 1.125, "loss": 2.25}, 100, f"{path} row 4"),
        ("B", 1, {"bpb": 1.0, "loss": 2.0}, 100, f"{path} row 6")]  # a blank line is skipped, its number kept
    only = read_runs([path], Columns(metrics=("loss",), step=None))
    assert [(r.values, r.step) for r in only[:1]] == [({"loss": 2.5}, None)]


def test_a_tsv_is_read_with_tabs_and_named_columns(tmp_path):
    path = write(tmp_path, "runs.tsv", "arm\trun seed\tval loss\nqk norm\t7\t3.5\nplain\t7\t3.75\n")
    runs = read_runs([str(path)], Columns(condition="arm", seed="run seed"))
    assert [fields(r) for r in runs] == [("qk norm", 7, {"val loss": 3.5}, None, f"{path} row 2"),
                                         ("plain", 7, {"val loss": 3.75}, None, f"{path} row 3")]


WANDB = """Name,State,Notes,User,Tags,Created,Runtime,Sweep,qk_gain,seed,_step,val/bpb,train/loss
gain1.0-seed0,finished,,alice,,2024-05-01T10:00:00,3600,,1.0,0,1000,1.25,2.5
gain1.0-seed1,finished,,alice,"a,b",2024-05-01T11:00:00,3700,,1.0,1,1000,1.5,2.75
gain2.0-seed0,finished,a note,alice,,2024-05-01T12:00:00,3650,sw1,2.0,0,1000,1.125,
"""


def test_a_wandb_export_reads_named_columns_and_leaves_its_bookkeeping_out(tmp_path):
    path = write(tmp_path, "wandb_export.csv", WANDB)
    runs = read_runs([path], Columns(condition="qk_gain", seed="seed", step="_step"))
    assert [fields(r) for r in runs] == [  # Runtime is numeric but bookkeeping; an empty cell is NaN
        ("1.0", 0, {"val/bpb": 1.25, "train/loss": 2.5}, 1000, f"{path} row 2"),
        ("1.0", 1, {"val/bpb": 1.5, "train/loss": 2.75}, 1000, f"{path} row 3"),
        ("2.0", 0, {"val/bpb": 1.125, "train/loss": "nan"}, 1000, f"{path} row 4")]
    named = read_runs([path], Columns(run_name=r"gain(?P<condition>[\d.]+)-seed(?P<seed>\d+)", step="_step"))
    assert [(r.condition, r.seed, sorted(r.values)) for r in named] == [  # qk_gain is no condition here: a metric
        ("1.0", 0, ["qk_gain", "train/loss", "val/bpb"]), ("1.0", 1, ["qk_gain", "train/loss", "val/bpb"]),
        ("2.0", 0, ["qk_gain", "train/loss", "val/bpb"])]
    runtime = read_runs([path], Columns(condition="qk_gain", metrics=("Runtime",)))
    assert [r.values for r in runtime] == [{"Runtime": 3600.0}, {"Runtime": 3700.0}, {"Runtime": 3650.0}]


def test_a_wide_csv_is_one_run_per_filled_cell(tmp_path):
    path = write(tmp_path, "wide.csv", "seed,step,qk_norm,plain\n0,500,1.25,1.5\n1,500,1.125,\n2,500,,1.75\n")
    runs = read_runs([path], Columns(wide="bpb"))
    assert [fields(r) for r in runs] == [
        ("qk_norm", 0, {"bpb": 1.25}, 500, f"{path} row 2 column 'qk_norm'"),
        ("plain", 0, {"bpb": 1.5}, 500, f"{path} row 2 column 'plain'"),
        ("qk_norm", 1, {"bpb": 1.125}, 500, f"{path} row 3 column 'qk_norm'"),
        ("plain", 2, {"bpb": 1.75}, 500, f"{path} row 4 column 'plain'")]


def test_jsonl_flattens_nested_objects_and_skips_blank_lines(tmp_path):
    path = write(tmp_path, "runs.jsonl", '{"condition": "A", "seed": 3, "step": 9, "val": {"loss": 2.5, "bpb": 1.5}, '
                                         '"note": "ok"}\n\n{"condition": "B", "seed": "s1", "val": {"loss": null}, '
                                         '"lr": 0.5}\n')
    runs = read_runs([path])
    assert [fields(r) for r in runs] == [  # "note" is text: no metric; a null or absent metric is NaN
        ("A", 3, {"val/loss": 2.5, "val/bpb": 1.5, "lr": "nan"}, 9, f"{path} line 1"),
        ("B", "s1", {"val/loss": "nan", "val/bpb": "nan", "lr": 0.5}, None, f"{path} line 3")]
    assert readers.flatten({"a": {"b": {"c": 1}}, "d": {}}) == {"a/b/c": 1, "d": {}}


def test_empty_cells_are_nan_and_nan_inf_cells_are_read_as_written(tmp_path):
    path = write(tmp_path, "runs.csv", "condition,seed,loss,bpb\nA,42,,nan\nB,42.0,inf,-inf\nC,seed42,1e-3,NaN\n"
                                       "D,,2,3\n")
    runs = read_runs([path])
    assert [fields(r)[:3] for r in runs] == [("A", 42, {"loss": "nan", "bpb": "nan"}),
                                             ("B", 42, {"loss": math.inf, "bpb": -math.inf}),
                                             ("C", "seed42", {"loss": 0.001, "bpb": "nan"}),
                                             ("D", None, {"loss": 2.0, "bpb": 3.0})]  # an empty seed: unknown


def test_at_step_keeps_a_tables_rows_of_that_step(tmp_path):
    path = write(tmp_path, "history.jsonl", "".join(f'{{"condition": "A", "seed": 0, "step": {s}, "loss": {s / 4}}}\n'
                                                    for s in (1, 2, 3)))
    assert [fields(r)[2:4] for r in read_runs([path], Columns(at_step=2))] == [({"loss": 0.5}, 2)]
    with pytest.raises(ReadError, match=r"history.jsonl: no run at step 5 \(its steps: 1, 2, 3\)"):
        read_runs([path], Columns(at_step=5))


BAD = [  # (file, its text or None for no file, Columns, the message's end after the path)
    ("nope.csv", None, Columns(), "nope.csv: no such file or folder. Fix: check the path"),
    ("runs.xlsx", "x", Columns(), "runs.xlsx: qk-decide does not read .xlsx. Fix: give a .csv"),
    ("runs.csv", "", Columns(), "runs.csv is empty. Fix: give a table with a header row"),
    ("runs.jsonl", "\n  \n", Columns(), "runs.jsonl is empty. Fix: give one JSON object per run"),
    ("runs.csv", "cond,seed_id,bpb\nA,0,1\n", Columns(),
     "runs.csv has no column 'condition' (its columns: cond, seed_id, bpb). Fix: name the condition and seed"),
    ("runs.csv", "condition,seed,bpb\nA,0,1.5\nB,0,oops\n", Columns(metrics=("bpb",)),
     "runs.csv row 3, 'bpb': 'oops' is not a number. Fix: correct it, leave it empty"),
    ("runs.csv", "condition,seed,bpb\nA,0,1.5\n", Columns(metrics=("ppl",)),
     "runs.csv has no column 'ppl' (its columns: condition, seed, bpb). Fix: name metrics the table has"),
    ("runs.csv", "condition,seed,bpb\nA,0\n", Columns(), "runs.csv row 2 has 2 cells, the header 3. Fix:"),
    ("runs.csv", "condition,seed,bpb,bpb\nA,0,1,2\n", Columns(), "column 'bpb' appears twice in the header."),
    ("runs.csv", "condition,seed,bpb\n", Columns(), "runs.csv has a header but no rows. Fix:"),
    ("runs.csv", "condition,seed,step,bpb\nA,0,1.5,2\n", Columns(), "row 2: step '1.5' is not a whole number. Fix:"),
    ("runs.csv", "condition,seed,bpb\n ,0,2\n", Columns(), "row 2: no condition (column 'condition' is empty). Fix:"),
    ("wide.csv", "run,A,B\n0,1,2\n", Columns(wide="bpb"), "wide.csv has no column 'seed' (its columns: run, A, B)."),
    ("runs.jsonl", '{"condition": "A", "seed": 0}\n[1, 2]\n', Columns(),
     "runs.jsonl line 2 is a JSON list, not an object. Fix: one JSON object per line"),
    ("runs.jsonl", '{"condition": "A"\n', Columns(), "runs.jsonl line 1 is not JSON (Expecting ',' delimiter"),
    ("runs.jsonl", '{"cond": "A", "seed": 0}\n', Columns(),
     "runs.jsonl: no line has the key 'condition' (its keys: cond, seed). Fix: name the condition"),
    ("runs.csv", "condition,seed,bpb\nA,0,1\n", Columns(run_name="("), "--run_name '(' is not a regular expression"),
    ("runs.csv", "condition,seed,bpb\nA,0,1\n", Columns(run_name="seed"), "--run_name 'seed' has no group"),
    ("runs.csv", "Name,bpb\nA-0,1\nzzz,2\n", Columns(run_name=r"(?P<condition>\w)-(?P<seed>\d)"),
     r"runs.csv row 3: --run_name '(?P<condition>\\w)-(?P<seed>\\d)' does not match its name 'zzz'. Fix:"),
    ("store.db", "not sqlite", Columns(), "store.db: not a trackio store (file is not a database). Fix:"),
]


@pytest.mark.parametrize("name, text, columns, end", BAD, ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD)])
def test_each_bad_input_is_one_line_naming_the_problem_and_the_fix(tmp_path, name, text, columns, end):
    path = tmp_path / name if text is None else write(tmp_path, name, text)
    with pytest.raises(ReadError) as caught:
        read_runs([path], columns)
    message = str(caught.value)
    assert end in message and "\n" not in message and "Fix: " in message, message
    assert message.startswith(str(path)) or message.startswith("--run_name"), message
    assert isinstance(caught.value, UserError) and isinstance(caught.value, ValueError)


def test_a_file_that_is_not_utf8_and_a_folder_of_nothing_known(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_bytes(b"condition,seed\n\xff\xfe,0\n")
    with pytest.raises(ReadError, match=r"runs.csv is not UTF-8 text \(byte 15\). Fix: save it as UTF-8"):
        read_runs([path])
    write(tmp_path, "other/notes.txt", "x")
    with pytest.raises(ReadError, match="other: a folder without TensorBoard event files"):
        read_runs([tmp_path / "other"])


def write_tensorboard(root: Path) -> None:
    """2 conditions x 2 seeds, steps 0-2: val/loss = 4 - step + (1 for B) + seed / 4 (plain scalars), val/bpb its
    half (the scalars plugin's tensors, add_scalar(new_style=True)); every value exact in float32."""
    from torch.utils.tensorboard import SummaryWriter
    for condition, offset in (("A", 0.0), ("B", 1.0)):
        for seed in (0, 1):
            writer = SummaryWriter(str(root / condition / f"seed{seed}"))
            for step in range(3):
                loss = 4.0 - step + offset + seed / 4
                writer.add_scalar("val/loss", loss, step)
                writer.add_scalar("val/bpb", loss / 2, step, new_style=True)
            writer.close()


def test_tensorboard_runs_by_folder_name_last_value_and_at_step(tmp_path):
    pytest.importorskip("tensorboard")
    write_tensorboard(tmp_path / "tb")
    runs = read_runs([tmp_path / "tb"], Columns(run_name=TB_NAMES))
    tb = tmp_path / "tb"
    assert [fields(r) for r in runs] == [
        ("A", 0, {"val/loss": 2.0, "val/bpb": 1.0}, 2, str(tb / "A" / "seed0")),
        ("A", 1, {"val/loss": 2.25, "val/bpb": 1.125}, 2, str(tb / "A" / "seed1")),
        ("B", 0, {"val/loss": 3.0, "val/bpb": 1.5}, 2, str(tb / "B" / "seed0")),
        ("B", 1, {"val/loss": 3.25, "val/bpb": 1.625}, 2, str(tb / "B" / "seed1"))]
    at = read_runs([tmp_path / "tb"], Columns(run_name=TB_NAMES, at_step=1, metrics=("val/loss", "train/loss")))
    assert [fields(r)[:4] for r in at] == [("A", 0, {"val/loss": 3.0, "train/loss": "nan"}, 1),
                                           ("A", 1, {"val/loss": 3.25, "train/loss": "nan"}, 1),
                                           ("B", 0, {"val/loss": 4.0, "train/loss": "nan"}, 1),
                                           ("B", 1, {"val/loss": 4.25, "train/loss": "nan"}, 1)]
    with pytest.raises(ReadError, match="is a TensorBoard folder: its runs' conditions and seeds come from their "):
        read_runs([tmp_path / "tb"])
    with pytest.raises(ReadError, match=r"A/seed0: 'val/loss' has no value at step 5 \(nearest steps: 2\). Fix:"):
        read_runs([tmp_path / "tb"], Columns(run_name=TB_NAMES, at_step=5))


def test_tensorboard_metrics_that_end_at_different_steps(tmp_path):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(str(tmp_path / "tb" / "A" / "seed0"))
    for step in range(3):
        writer.add_scalar("val/loss", 3.5 - step, step)
        if step < 2:
            writer.add_scalar("lr", 0.25 * (step + 1), step)
    writer.close()
    everything = read_runs([tmp_path / "tb"], Columns(run_name=TB_NAMES))
    assert [fields(r)[:4] for r in everything] == [("A", 0, {"val/loss": 1.5, "lr": 0.5}, 2)]  # the last step of any
    with pytest.raises(ReadError, match=r"seed0: its metrics end at different steps \(val/loss at 2, lr at 1\)"):
        read_runs([tmp_path / "tb"], Columns(run_name=TB_NAMES, metrics=("val/loss", "lr")))


def trackio_globals() -> dict:
    """trackio's folder globals in every module of it now imported: (module, name) -> path."""
    return {(name, attr): vars(module)[attr] for name, module in list(sys.modules.items())
            if module is not None and (name == "trackio" or name.startswith("trackio."))
            for attr in ("TRACKIO_DIR", "MEDIA_DIR", "ARTIFACTS_DIR") if isinstance(vars(module).get(attr), Path)}


def test_a_trackio_store_written_by_trackio_reads_its_configs_and_last_values(tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    from trackio.utils import _get_trackio_dir

    from training.tracking import TrackioBackend
    default = _get_trackio_dir()
    before = sorted(default.iterdir()) if default.is_dir() else None
    originals = trackio_globals()
    for (module, attr), path in originals.items():  # TrackioBackend points them at tmp_path: put back after
        monkeypatch.setattr(sys.modules[module], attr, path)
    for condition in ("A", "B"):
        for seed in (0, 1):
            backend = TrackioBackend(tmp_path / "store", f"study/{condition}/seed{seed}",
                                     {"condition": condition, "train": {"seed": seed}})
            backend.log(1, {"val/loss": 3.0 + seed, "train/loss": 4.0})
            backend.log(2, {"val/loss": 2.5 + seed + (condition == "B"), "train/loss": float("nan")})
            backend.close()
    folder = tmp_path / "store" / "trackio"
    for (module, attr), path in originals.items():
        setattr(sys.modules[module], attr, path)
    runs = read_runs([folder], Columns(seed="train/seed"))
    assert {key: trackio_globals()[key] for key in originals} == originals  # the reader put them back
    assert [fields(r) for r in runs] == [
        (c, s, {"val/loss": 2.5 + s + (c == "B"), "train/loss": "nan"}, 2,
         f"trackio project qk-keys run study/{c}/seed{s} in {folder}") for c in "AB" for s in (0, 1)]
    by_name = read_runs([folder / "qk-keys.db"], Columns(condition="arm", run_name=r"/(?P<condition>\w)/seed(?P<seed>"
                                                                                    r"\d)", at_step=1))
    assert [fields(r)[:4] for r in by_name] == [(c, s, {"val/loss": 3.0 + s, "train/loss": 4.0}, 1)
                                                for c in "AB" for s in (0, 1)]
    with pytest.raises(ReadError, match=r"run study/A/seed0 in .*: its config has no key 'arm' \(its keys: "):
        read_runs([folder], Columns(condition="arm"))
    assert (sorted(default.iterdir()) if default.is_dir() else None) == before  # nothing in trackio's own folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def test_a_run_folder_of_this_project_goes_to_the_own_reader(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "A" / "seed0"
    write(run, "config.json", "{}")
    write(run, "metrics.jsonl", '{"step": 1, "loss": 2.5}\n')
    write(run, "tensorboard/events.out.tfevents.1.host", "")  # its own TensorBoard logs do not make it one
    monkeypatch.setattr(readers, "OWN_READER", None)
    with pytest.raises(ReadError, match=r"seed0 is a run folder of this project \(or holds some\), whose reader is"):
        read_runs([run])
    calls = []
    monkeypatch.setattr(readers, "OWN_READER", lambda path, columns: calls.append((path, columns)) or
                        [Run("A", 0, {"loss": 2.5}, 1, str(path))])
    columns = Columns(metrics=("loss",))
    assert read_runs([run], columns) == [Run("A", 0, {"loss": 2.5}, 1, str(run))]
    (run / "tensorboard" / "events.out.tfevents.1.host").unlink()
    read_runs([tmp_path / "runs"], columns)  # a folder of run folders
    assert calls == [(run, columns), (tmp_path / "runs", columns)]
