"""JSON null <-> NaN: the one place where missing values change representation.

results.json stores a missing or undefined number (no loss at step 0, a cosine of a
one-token sequence) as null, because JSON has no NaN. Readers turn null into NaN with
`as_float` / `as_array`; writers turn NaN and infinities back into null with `json_safe`.
"""
from __future__ import annotations

import math

import numpy as np

from utils.formats import loads_json


def as_float(v) -> float:
    """A number, or NaN for None."""
    return math.nan if v is None else float(v)


def as_array(values) -> np.ndarray:
    """A list of numbers (None allowed; None or [] for no list) as a float array, None -> NaN."""
    return np.array([as_float(v) for v in (values or [])], dtype=float)


def present(values) -> np.ndarray:
    """The values that are not missing (None or NaN dropped), as a flat float array."""
    a = np.array([math.nan if v is None else v for v in values], dtype=float).ravel()
    return a[~np.isnan(a)]


def parse_json(text: str):
    """JSON text as Python values, NaN and +-Infinity (which JSON lacks, but Python's json writes) read as null:
    every reader of the project's files parses with this, so a missing number is None whoever wrote it."""
    return loads_json(text, parse_constant=lambda name: None)


def json_safe(x):
    """A copy of x with NaN and +-inf floats replaced by None (recursively through dicts and lists)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x
