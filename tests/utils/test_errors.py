"""Every exception class of the project pickles whole (utils.errors.PicklesWhole): a run's error raised in a Ray
worker reaches the driver with its message and every field, as the in-process study would have it."""
import importlib
import pickle
import pkgutil
import time

from configs.files import DuplicateKey
from research.results.schema import ResultsError
from tests.helpers import REPO
from training.checkpoint import CheckpointError
from training.errors import NonFiniteLossError, RunInterrupted
from utils.errors import ConfigError, PicklesWhole, shown
from utils.formats import FormatError

PACKAGES = ("configs", "data", "models", "optimizers", "research", "training", "utils")


def _project_exceptions() -> set[type]:
    found = set()
    for package in PACKAGES:
        for info in pkgutil.walk_packages([str(REPO / package)], prefix=f"{package}."):
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == info.name:
                    found.add(value)
    return found


def test_every_exception_class_of_the_project_pickles_whole():
    found = _project_exceptions()
    assert {FormatError, DuplicateKey, RunInterrupted, ResultsError} <= found  # the walk sees the project
    assert sorted(c.__qualname__ for c in found if not issubclass(c, PicklesWhole)) == []


def test_an_error_comes_back_from_pickling_with_its_message_and_fields():
    for e in (RunInterrupted("/tmp/run", step=3, checkpoint=2, resumable=True, stage="training"),
              NonFiniteLossError("the loss became nan at step 4", step=4),
              CheckpointError("disk full", disk_full=True),
              FormatError("results.json: steps[2].loss", "a number", "'x'"),
              DuplicateKey("lr", " in study.yaml"),
              ConfigError("--lr -1: give a positive learning rate")):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and str(back) == str(e) and back.args == e.args and back.__dict__ == e.__dict__
    assert str(pickle.loads(pickle.dumps(DuplicateKey("lr")))).startswith("key 'lr' appears twice in one mapping:")
    assert pickle.loads(pickle.dumps(NonFiniteLossError("nan", step=4))).step == 4


def test_a_value_is_shown_in_at_most_200_characters_without_being_walked_whole():
    bomb = [0] * 10
    for _ in range(8):
        bomb = [bomb] * 10  # 10**9 zeros through 9 shared lists: a whole repr would need 3 GB
    start = time.perf_counter()
    text = shown(bomb)  # three levels of at most six items each, then cut to 200 around '...'
    assert len(text) == 200 and text.startswith("[[[[...], [...], [...], [...], [...], [...], ...], [[...], ")
    assert text.endswith("[[...], [...], [...], [...], [...], [...], ...], ...], ...]") and ".... ..." in text
    assert time.perf_counter() - start < 1
    # a repr of 200 characters: the quote and 130 of its first letters, '...', 65 of its last and the quote
    assert shown("a" + "x" * 1_000_000 + "z") == f"'a{'x' * 129}...{'x' * 64}z'"
    assert shown("abcdefghij" * 3, 20) == "'abcdefghij...fghij'"  # 20: its first 10 and last 5 letters
    assert shown(10 ** 5000) == "<a whole number of about 5,001 digits>"  # Python refuses to write it
    assert shown({i: i for i in range(10)}) == "{0: 0, 1: 1, 2: 2, 3: 3, ...}"  # four items, in their order
    assert (shown("ab"), shown([1, 2]), shown({"a": None}), shown(1e39), shown(-3)) == \
        ("'ab'", "[1, 2]", "{'a': None}", "1e+39", "-3")  # a short value as its repr
