"""--ray: a worker killed with SIGKILL mid-run is retried by Ray and resumes from its checkpoint; the study ends equal
to an uninterrupted one. Its own local cluster, whose workers carry the test-only kill hook (utils/testhook.py)."""
import pytest

from research.studies import HEAD_SPECIALIZATION
from research.studies.runner import run_study
from tests.helpers import STEP_TOKENS, comparable_results
from tests.research.studies.test_ray import local_ray
from tests.research.studies.test_runner import study_args
from utils.testhook import ENV

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def killing_cluster(user_cache):
    """Every worker SIGKILLs itself after its 3rd optimizer step (a retry, resumed from step 2, never gets there)."""
    with local_ray(**{ENV: "kill:step:3"}):
        yield


@pytest.mark.slow
def test_a_killed_worker_is_retried_and_the_study_ends_as_an_uninterrupted_one(corpus_file, cache_dir, tmp_path,
                                                                               killing_cluster, capsys):
    argv = ["--seed", "0", "--ckpt_every", "2"]
    run_study(HEAD_SPECIALIZATION, study_args(corpus_file, cache_dir, tmp_path / "seq", 4 * STEP_TOKENS, *argv))
    capsys.readouterr()
    run_study(HEAD_SPECIALIZATION, study_args(corpus_file, cache_dir, tmp_path / "ray", 4 * STEP_TOKENS, *argv,
                                              "--ray"))
    out = capsys.readouterr().out
    assert ": started again (try 2: its worker was lost, resuming from its newest checkpoint) on " in out, out
    assert ": finished on " in out, out
    seq, on_ray = comparable_results(tmp_path / "seq"), comparable_results(tmp_path / "ray")
    assert len(seq) == 1 and seq == on_ray
