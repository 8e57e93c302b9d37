"""The tests' corpus (tests/conftest.py `corpus_file`) is the shipped file, the same bytes on every Python: the
figures tests derive from it by hand (train blocks, the validation set's size) hold on each."""
import hashlib

from tests.conftest import CORPUS
from tests.fixtures.corpus.make_corpus import SHA256


def test_the_corpus_the_tests_train_on_is_the_shipped_file_whatever_the_python(corpus_file):
    data = corpus_file.read_bytes()
    assert data == CORPUS.read_bytes() and hashlib.sha256(data).hexdigest() == SHA256
    assert len(data.decode("utf-8")) == 110_958  # as make_corpus.py says
    assert all(word in data for word in (b"import", b"return", b"def"))  # words test_hostile_training.py edits
