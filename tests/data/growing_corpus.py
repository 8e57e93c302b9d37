"""Text whose vocabulary keeps growing with its length, to measure data preparation (docs/data.md, "Memory").

    python -m tests.data.growing_corpus OUT.txt --mb 100

Words are pseudo-words made of syllables: the word of rank r spells r in base 90 with one consonant-vowel syllable
per digit, so frequent words are short and rare ones long. Ranks follow a Zipf-Mandelbrot law, P(rank > x) =
((x + Q) / Q) ** -(A - 1) with A = 1.5, Q = 3: the most frequent word is about 13% of the words, and the distinct
words of n words grow about as n ** (1 / A) = n ** 0.67 (Heaps' law, as in real text), so a 100 MB file has about
4.6 times the words of a 10 MB one rather than the same ones (`distinct_words` counts them). Words are joined by
spaces, commas and full stops, lines hold about 12 words, paragraphs about 5 lines. The same (size, seed) gives
the same bytes on every machine. Not a test: the tests use it on small sizes; the measurements in docs/data.md use
it at 10 MB, 100 MB and 1 GB.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

CONSONANTS = "bcdfghjklmnprstvwz"  # 18
VOWELS = "aeiou"  # 5
SYLLABLES = [c + v for c in CONSONANTS for v in VOWELS]  # 90
A, Q = 1.5, 3.0
WORDS_PER_CHUNK = 1 << 20
# After each word: a space mostly, else a comma, a full stop, a line break or a paragraph break.
SEPARATORS = np.array([" ", ", ", ". ", "\n", ".\n\n"], dtype=object)
SEPARATOR_P = [0.80, 0.05, 0.06, 0.075, 0.015]


def word(rank: int) -> str:
    """The pseudo-word of `rank` (1, 2, ...): rank - 1 in base 90, one syllable per digit."""
    n, out = rank - 1, []
    while True:
        n, d = divmod(n, len(SYLLABLES))
        out.append(SYLLABLES[d])
        if n == 0:
            return "".join(reversed(out))
        n -= 1  # bijective: "ba" and "baba" are different words


def ranks(rng: np.random.Generator, n: int) -> np.ndarray:
    """n word ranks (>= 1) from the Zipf-Mandelbrot law above."""
    u = 1.0 - rng.random(n)  # in (0, 1]
    return np.floor(Q * (u ** (-1.0 / (A - 1.0)) - 1.0)).astype(np.int64) + 1


def chunks(seed: int = 0):
    """Successive pieces of the text, each about 6 MB."""
    for i in range(1 << 40):
        rng = np.random.default_rng([seed, i])
        r = ranks(rng, WORDS_PER_CHUNK)
        uniq, inverse = np.unique(r, return_inverse=True)
        words = np.array([word(int(x)) for x in uniq], dtype=object)[inverse]
        seps = SEPARATORS[rng.choice(len(SEPARATORS), size=WORDS_PER_CHUNK, p=SEPARATOR_P)]
        yield "".join((words + seps).tolist())


def write(path: Path, n_bytes: int, seed: int = 0) -> None:
    """The first n_bytes of the text (ASCII, so bytes are characters), ending with a line break."""
    left = n_bytes
    with open(path, "w", encoding="ascii", newline="") as f:
        for text in chunks(seed):
            if len(text) >= left:
                f.write(text[:left - 1] + "\n")
                return
            f.write(text)
            left -= len(text)


def text(n_bytes: int, seed: int = 0) -> str:
    """The first n_bytes as one string (small sizes: tests)."""
    out, left = [], n_bytes
    for t in chunks(seed):
        out.append(t[:left])
        left -= len(out[-1])
        if left <= 0:
            return "".join(out)


def distinct_words(s: str) -> int:
    return len(set(s.replace(",", " ").replace(".", " ").split()))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--mb", type=float, required=True, help="size in MB (10**6 bytes)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    write(a.out, int(a.mb * 1e6), a.seed)
    print(f"{a.out}: {a.out.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
