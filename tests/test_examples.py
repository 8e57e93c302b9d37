"""docs/examples/: the Ray cluster configuration and the SkyPilot task parse (the cluster's against Ray's own schema of
`ray up` files, where Ray is installed), and every study command they hold parses with the study's own option
parser (research.studies.runner.build_parser), with --ray and --storage as the example means them."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from research.studies import STUDIES
from research.studies.runner import build_parser
from research.studies.study_file import read_study_file

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "docs" / "examples"


def study_commands(path: Path, env: dict) -> list[list[str]]:
    """Every `python research/...` command in the file (its comments too), split as a shell would, with the
    file's own variables ($NAME, ${NAME}) put in."""
    commands = []
    for line in path.read_text().splitlines():
        found = re.search(r"python (research/\S+\.py.*?)(?:'|$)", line)
        if found:
            text = re.sub(r"\$\{?(\w+)\}?", lambda m: str(env.get(m.group(1), m.group(0))), found.group(1))
            commands.append(shlex.split(text))
    return commands


def parse(command: list[str]):
    """The command's options parsed by its study's own parser: a study file's (research/study.py FILE), else the
    catalog study's."""
    script, *argv = command
    if script == "research/study.py":
        study = read_study_file(REPO / argv[0])
        argv = argv[1:]
    else:
        study = STUDIES[Path(script).stem]
    return build_parser(study, argv=argv).parse_args(argv)


def test_the_ray_cluster_configuration_has_a_cpu_head_and_autoscaling_gpu_workers():
    config = yaml.safe_load((EXAMPLES / "ray_cluster.yaml").read_text())
    types = config["available_node_types"]
    head, workers = types[config["head_node_type"]], [t for n, t in types.items() if n != config["head_node_type"]]
    assert "InstanceMarketOptions" not in head["node_config"]  # the driver's node is not preemptible
    assert len(workers) == 1 and workers[0]["max_workers"] > workers[0]["min_workers"] >= 1
    assert workers[0]["node_config"]["InstanceType"].startswith("g5.")  # a GPU instance
    [command] = study_commands(EXAMPLES / "ray_cluster.yaml", {})
    args = parse(command)
    assert (args.ray, args.gpus_per_run, args.storage) == ("auto", 0.25, "s3://my-qk-keys-bucket/storage/"
                                                                         "attention_variants")
    ray = pytest.importorskip("ray")
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)  # what `ray up` checks first


def test_the_skypilot_task_mounts_a_bucket_and_runs_a_study_file_with_storage():
    task = yaml.safe_load((EXAMPLES / "skypilot_study.yaml").read_text())
    assert set(task) <= {"name", "resources", "workdir", "file_mounts", "envs", "setup", "run", "num_nodes"}
    [mount] = task["file_mounts"].values()
    assert mount["mode"] == "MOUNT" and mount["source"].startswith("s3://")
    assert task["resources"]["accelerators"] and task["resources"]["use_spot"] is True
    [command] = study_commands(EXAMPLES / "skypilot_study.yaml", task["envs"])
    assert command[:2] == ["research/study.py", "configs/studies/attention_variants.yaml"]
    args = parse(command)
    assert (args.ray, args.gpus_per_run, args.storage, args.out) == (
        "local", 0.25, "s3://my-qk-keys-bucket/storage/attention_variants", "~/runs/attention_variants")


def test_a_command_the_parser_refuses_fails_this_test():
    with pytest.raises(SystemExit):
        parse(["research/study.py", "configs/studies/attention_variants.yaml", "--storage"])  # no URI
