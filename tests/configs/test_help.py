"""--help of every entry point: each option says what it does, its choices and its default; the choices a
config option lists are exactly those its validation accepts; lists of outputs match the code that writes them."""
from __future__ import annotations

import argparse
import dataclasses
import re
import typing

import pytest

from configs.config import FIELD_PARSERS, ORTHOGONALIZERS, SECTIONS, ConfigError, field_choices
from configs.fields import literal_choices
from tests.helpers import REPO, pyproject

FIELDS = {f.name: (section, cls, f) for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
FIELD_HELP = {name: f.metadata["help"] for name, (_, _, f) in FIELDS.items()}
FIELD_CHOICES = field_choices()
UNCHOSEN = "no-such-value"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _option_help(parser: argparse.ArgumentParser, option: str) -> str:
    """The help text of one option, %(default)s expanded, on one line."""
    action = next(a for a in parser._actions if option in a.option_strings or a.dest == option)
    return _flat(parser._get_formatter()._expand_help(action))


# ----------------------------------------------------------------------------- config fields

def test_every_config_field_has_a_help_sentence():
    for name, text in FIELD_HELP.items():
        assert text.endswith(".") and len(re.findall(r"[A-Za-z]{2,}", text)) >= 3, (name, text)
        assert "default" not in text.lower(), f"{name}: the default is added from the config, never written by hand"


def _section_with(name: str, value):
    """The field's section built with `value` (other fields at their defaults)."""
    section, cls, _ = FIELDS[name]
    return cls(**{name: value})


TEXT_FIELDS = [n for n, (_, cls, f) in FIELDS.items()
               if typing.get_type_hints(cls)[n] is str or literal_choices(typing.get_type_hints(cls)[n])]


@pytest.mark.parametrize("name", TEXT_FIELDS)
def test_a_text_field_is_validated_against_its_declared_choices_or_not_at_all(name):
    """Every choice its Literal declares passes the field's validation and an unlisted value fails it; a text field
    declared `str` takes any value (a literal list in its validation would leave --help without the choices)."""
    if name in FIELD_PARSERS:  # a syntax of its own: its parser refuses what it cannot read
        with pytest.raises(ConfigError, match=f"{UNCHOSEN}"):
            _section_with(name, UNCHOSEN)
        return
    if name not in FIELD_CHOICES:
        _section_with(name, UNCHOSEN)  # no ConfigError: the field has no fixed set of values
        return
    for choice in FIELD_CHOICES[name]:
        try:
            _section_with(name, choice)
        except ConfigError as e:  # refused for another reason (source=files needs --paths), never as a choice
            assert "choose one of" not in str(e), e
    with pytest.raises(ConfigError, match=f"{name}='{UNCHOSEN}': choose one of {', '.join(FIELD_CHOICES[name])}"):
        _section_with(name, UNCHOSEN)


def test_help_lists_each_fields_choices_exactly():
    import train_llm
    parser = train_llm.build_parser([])
    for name in FIELDS:
        text = _option_help(parser, f"--{name}")
        listed = re.findall(r"Choices: (.*?)\. Default:", text)
        assert listed == ([", ".join(FIELD_CHOICES[name])] if name in FIELD_CHOICES else []), (name, text)


def test_muon_implements_every_orthogonalizer_the_config_accepts():
    from optimizers import muon
    assert tuple(muon.ORTHOGONALIZERS) == ORTHOGONALIZERS


def test_config_help_shows_the_chosen_presets_values():
    import train_llm
    big = train_llm.build_parser(["--preset", "88m"])
    assert _option_help(big, "--n_layers") == f"[model] {FIELD_HELP['n_layers']} Default: 22"
    assert _option_help(big, "--source").endswith("Choices: english, stdlib, files, hub. Default: hub")
    tiny = train_llm.build_parser([])
    assert _option_help(tiny, "--n_layers").endswith("Default: 6")
    assert _option_help(tiny, "--nesterov").endswith("Default: true")  # as the command line spells it
    assert _option_help(tiny, "--offline_note").endswith("Default: empty")


# ----------------------------------------------------------------------------- every entry point

def _description(script) -> str:
    """What a script passes its parser as the description: its DESCRIPTION where its docstring is only the start."""
    return getattr(script, "DESCRIPTION", script.__doc__)


def _study_parser(module: str):
    def build():
        import importlib

        from research.studies.runner import build_parser
        script = importlib.import_module(module)
        study = next(v for v in vars(script).values() if type(v).__name__ == "Study")
        return build_parser(study, _description(script), argv=["--device", "cpu"])
    return build


def _file_study_parser():
    """research/study.py's parser for a study file (written to a temporary folder) of two conditions."""
    import tempfile
    from pathlib import Path

    from research import study as script
    from research.studies.runner import build_parser
    from research.studies.study_file import read_study_file
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.yaml"
        path.write_text("name: s\nseeds: [0, 1]\nbaseline: A\nconditions: {A: {}, B: {qk_norm: none}}\n")
        study = read_study_file(path)
    return build_parser(study, _description(script), argv=["--device", "cpu"])


def _module_parser(module: str, *args):
    def build():
        import importlib
        return importlib.import_module(module).build_parser(*args)
    return build


# module -> its parser; test_every_entry_point_is_checked keeps this list complete
ENTRY_POINTS = {
    "train_llm": _module_parser("train_llm", []),
    "research.qk_norm_25m_study": _study_parser("research.qk_norm_25m_study"),
    "research.qk_norm_500k_study": _study_parser("research.qk_norm_500k_study"),
    "research.key_dynamics_study": _study_parser("research.key_dynamics_study"),
    "research.head_specialization_study": _study_parser("research.head_specialization_study"),
    "research.lr_sensitivity_study": _study_parser("research.lr_sensitivity_study"),
    "research.spike_warning_study": _study_parser("research.spike_warning_study"),
    "research.study": _file_study_parser,
    "research.split_panels": _module_parser("research.split_panels"),
    "research.inspect_pretrained": _module_parser("research.inspect_pretrained"),
    "research.pretrained_keys_study": _module_parser("research.pretrained_keys_study"),
    "research.checkpoint_keys_study": _module_parser("research.checkpoint_keys_study"),
    "research.finetune_keys_study": _module_parser("research.finetune_keys_study"),
    "research.qk_audit": _module_parser("research.qk_audit"),
    "research.qk_decide": _module_parser("research.qk_decide"),
    "research.export_hf": _module_parser("research.export_hf"),
    "research.benchmark": _module_parser("research.benchmark"),
    "research.speed.gpu": _module_parser("research.speed.gpu", []),
    "research.speed.measure": _module_parser("research.speed.measure"),
    "research.speed.hf_probe": _module_parser("research.speed.hf_probe"),
    "research.speed.probe_share": _module_parser("research.speed.probe_share"),
    "research.speed.gpu_session": _module_parser("research.speed.gpu_session"),
    "research.speed.side_by_side": _module_parser("research.speed.side_by_side"),
    "research.speed.busy_host": _module_parser("research.speed.busy_host"),
    "research.simulations.conditions": _module_parser("research.simulations.conditions"),
    "research.simulations.decide_looks": _module_parser("research.simulations.decide_looks"),
    "research.simulations.spikes": _module_parser("research.simulations.spikes"),
    "research.simulations.sequential": _module_parser("research.simulations.sequential"),
    "research.simulations.ratios": _module_parser("research.simulations.ratios"),
    "research.results.schema": _module_parser("research.results.schema"),
}


def test_every_entry_point_is_checked():
    """Each module of the project with a __main__ block and each console command of pyproject.toml has its
    parser in ENTRY_POINTS."""
    scripts = [p for p in REPO.rglob("*.py") if not {"tests", "research_results"} & set(p.relative_to(REPO).parts)
               and not any(part.startswith(".") for part in p.relative_to(REPO).parts)]
    mains = {".".join(p.relative_to(REPO).with_suffix("").parts) for p in scripts
             if '__name__ == "__main__"' in p.read_text(encoding="utf-8")}
    commands = pyproject().get("project", {}).get("scripts", {})
    modules = {target.split(":")[0] for target in commands.values()}
    assert mains | modules <= set(ENTRY_POINTS)
    assert mains, "no scripts found: the search above is wrong"


def _sentence(text: str) -> str:
    """The help without its section tag and its stated default."""
    text = re.sub(r"^\[\w+\] ", "", text)
    return re.split(r"\bDefault: |\(default", text, maxsplit=1)[0]


@pytest.mark.parametrize("module", list(ENTRY_POINTS))
def test_every_option_explains_itself(module):
    """Each option's help is a sentence of its own (not only a default), states its default where it has one,
    and names its choices where argparse does not show them."""
    parser = ENTRY_POINTS[module]()
    formatter = parser._get_formatter()
    checked = 0
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = (action.option_strings or [action.dest])[0]
        assert action.help, f"{module} {name}: no help"
        text = _flat(formatter._expand_help(action))
        words = re.findall(r"[A-Za-z]{2,}", _sentence(text))
        assert len(words) >= 3, f"{module} {name}: not a sentence: {text!r}"
        flag = isinstance(action, argparse._StoreTrueAction)
        has_default = action.dest.startswith("cfg__") or (not flag and action.default not in (None, argparse.SUPPRESS))
        if has_default or action.required:
            assert "Default: " in text or "Required" in text, f"{module} {name}: no default stated: {text!r}"
        if action.choices and action.metavar is not None:  # argparse prints choices only without a metavar
            assert all(str(c) in text for c in action.choices), f"{module} {name}: choices missing: {text!r}"
        checked += 1
    assert checked >= 1


# ----------------------------------------------------------------------------- outputs a help or docstring lists

def _kind_runs(study) -> dict:
    """Hand-built results for each of the study's runs, of the shape its kind reads."""
    from research.results import validate
    from tests.research.synthetic import make_results, qk_runs
    if study.kind == "qk_norm":
        return qk_runs((50, 40, 40), (3.6, 3.6, 3.6))
    if study.kind == "lr":  # two probes and a final loss per run of the grid
        def run(seed: int) -> dict:
            probe = lambda t: {"step": t, "tokens": t, "layers": [  # noqa: E731
                {"layer": 0, "means": {"k_norm.norm_mean": 8.0}, "attn": {"logit_max": [10.0, 5.0]}}]}
            return validate({"tag": "x", "seed": seed, "tokens": [0, 1000], "loss": [None, 3.0],
                             "val_loss": [None, 3.0], "mean_pr": [30.0, 20.0], "layer_pr": {"0": [30.0, 20.0]},
                             "init_val_loss": 8.0, "probes": [probe(0), probe(1000)]})
        return {name: [run(0), run(1)] for name, _ in study.runs()}
    return {c: [make_results(c, qk_norm=o.get("qk_norm", "learned"))] for c, o in study.conditions.items()}


@pytest.mark.parametrize("name", ["qk_norm_50m_study", "qk_norm_500k_study", "key_dynamics_study",
                                  "head_specialization_study", "lr_sensitivity_study"])
def test_a_studys_listed_outputs_are_what_its_render_draws(name):
    """Study.outputs (which the study's --help and split_panels' --help print) against the files the study's
    kind draws from results of the study's own conditions."""
    from matplotlib.figure import Figure

    from research.results.vocabulary import REPORT, REPORT_PAGE, STUDY_INDEX
    from research.studies import STUDIES
    from research.studies.kinds import KINDS
    study = STUDIES[name]
    runs = _kind_runs(study)
    kind = KINDS[study.kind]
    drawn = kind.draw(kind.analyze(runs, None, None))
    for item in drawn.values():
        if isinstance(item, Figure):
            item.clear()
    written = [x for name in drawn for x in ((name, REPORT_PAGE) if name == REPORT else (name,))]  # write_outputs
    assert study.outputs() == [STUDY_INDEX, *written]


def _listed(description: str, lead: str) -> list[str]:
    """The comma-separated files after `lead` in a help description, up to the full stop (file names hold no ". ")."""
    return (_flat(description) + " ").split(lead, 1)[1].split(". ", 1)[0].split(", ")


_FILE = r"(?<![\w/.-])[\w-]+\.(?:png|json|md)\b"  # a file name, not a path such as docs/decisions.md
_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


@pytest.mark.parametrize("module", [m for m in ENTRY_POINTS if m.endswith("_study")
                                    and not any(w in m for w in ("pretrained", "checkpoint", "finetune"))])
def test_a_study_scripts_help_and_docstring_agree_with_the_catalog(module):
    """The help lists Study.outputs; every file, folder and count of conditions its docstring names is the
    study's own."""
    import importlib

    from research.results.vocabulary import RESULTS_FILE
    script = importlib.import_module(module)
    study = next(v for v in vars(script).values() if type(v).__name__ == "Study")
    description = ENTRY_POINTS[module]().description
    assert _listed(description, "Then the study writes into --out: ") == study.outputs()
    doc = _description(script)
    named = set(re.findall(_FILE, doc))
    assert named <= {*study.outputs(), RESULTS_FILE}, module
    figures = {f for f in study.outputs() if f.endswith(".png")}
    assert not named & figures or figures <= named, f"{module}: a docstring listing figures must list them all"
    assert set(re.findall(r"research_results/(\w+)", doc)) <= {study.name}, module
    for word in re.findall(r"\b(\w+) conditions?\b", doc, flags=re.I):
        if word.lower() in _NUMBERS:
            assert _NUMBERS[word.lower()] == len(study.conditions), (module, word)


def test_inspection_and_pretrained_keys_help_list_what_they_write():
    """The files a docstring names are the ones written, or the ones read (the step files of a checkpoint)."""
    from research import checkpoint_keys_study, finetune_keys_study, inspect_pretrained, pretrained_keys_study
    from research.access.checkpoints import EXPORT_INFO, TRAINER_STATE
    from research.plots import finetune, inspection, pretrained, trajectory
    from research.results import trajectory as trajectory_file
    from research.results.pretrained import FILE
    report = ["report.md", "report.html"]
    for script, files, read in ((inspect_pretrained, ["inspect.json", *inspection.FIGURES, *report], ()),
                                (pretrained_keys_study, [FILE, *pretrained.FIGURES, *report], ()),
                                (checkpoint_keys_study, [trajectory_file.FILE, *trajectory.FIGURES, *report],
                                 (EXPORT_INFO, TRAINER_STATE)),
                                (finetune_keys_study, ["study.json", "<condition>/seed_<s>/results.json",
                                                       *finetune.FIGURES, *report], ())):
        assert _listed(script.build_parser().description, "Writes into --out: ") == files
        named = set(re.findall(_FILE, _description(script))) - set(read)
        figures = {f for f in files if f.endswith(".png")}
        assert named <= set(files) and (not named & figures or figures <= named), script.__name__


def test_split_panels_help_lists_every_studys_drawings():
    from research import split_panels
    from research.studies import STUDIES
    description = _flat(split_panels.build_parser().description)
    for name, study in STUDIES.items():
        assert f"{name}: {', '.join(study.outputs()[1:])}" in description


def test_study_help_names_the_defaults_each_condition_sets():
    """A field the study's conditions set shows each condition's value, not the base config's."""
    from research.studies import KEY_DYNAMICS, LR_SENSITIVITY
    from research.studies.runner import build_parser
    keys = build_parser(KEY_DYNAMICS, argv=["--device", "cpu"])
    assert _option_help(keys, "--wd_on_gains").endswith("Default: per condition: QK true, QK_no_gain_wd false")
    lr = build_parser(LR_SENSITIVITY, argv=["--device", "cpu"])
    assert _option_help(lr, "--muon_lr").endswith("Default: 0.024 times each --lr_multipliers rate")
    assert _option_help(lr, "--seed").endswith("Default: each of --seeds (0 1)")


def test_train_llm_out_help_names_every_file_a_run_writes():
    import train_llm
    from utils.run_names import RUN_FILES
    out = next(a for a in train_llm.build_parser([])._actions if "--out" in a.option_strings)
    assert all(name in out.help for name in RUN_FILES), out.help


@pytest.mark.parametrize("module", list(ENTRY_POINTS))
def test_every_option_of_every_command_is_refused_when_given_twice(module):
    """Each option that stores a value, a list or a switch refuses a second use on one command line (argparse keeps
    the last without a word); only an appending option may repeat (issue 65)."""
    from utils.errors import ConfigError
    parser = ENTRY_POINTS[module]()
    checked = 0
    for action in parser._actions:
        if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._AppendAction,
                                                             argparse._CountAction)):
            continue
        option, namespace = action.option_strings[0], argparse.Namespace()
        parser.given_options = {}  # a parse begins (ArgumentParser.parse_known_args)
        action(parser, namespace, "1", option)
        with pytest.raises(ConfigError, match=rf"^{re.escape(option)} given twice\b.*\. Fix: give {option} once$"):
            action(parser, namespace, "2", option)
        checked += 1
    assert checked >= 1


@pytest.mark.parametrize("argv, message", [
    (["--logger", "tensorboard", "--logger", "wandb"], "--logger given twice (tensorboard, then wandb)"),
    (["--until_decided", "8", "--until_decided", "6"], "--until_decided given twice (8, then 6)"),
    (["--kv_cache", "true", "--kv_cache", "false"], "--kv_cache given twice (true, then false)"),
])
def test_a_study_refuses_an_option_given_twice_before_anything_is_written(argv, message, tmp_path, capsys):
    from research import qk_norm_500k_study
    from tests.helpers import stops
    out = tmp_path / "study"
    line = stops(capsys, qk_norm_500k_study.main, ["--device", "cpu", "--out", str(out), *argv])
    assert line == f"error: {message}: it takes one value. Fix: give {argv[0]} once"
    assert not out.exists()
