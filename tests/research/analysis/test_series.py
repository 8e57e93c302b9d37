"""research/analysis/series.py: seeds are matched by token count, never by position."""
import math

import numpy as np

from research.analysis.series import aligned, left_out, on_shared_tokens, seed_mean, shared_tokens


def test_runs_meet_at_the_token_counts_all_of_them_have():
    """[n_probes, n_layers] arrays on grids 0/100/300 and 0/200/300/400: they share 0 and 300 only; a run with no
    series is a row of NaN and leaves the mean alone."""
    a = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    b = np.array([[3.0, 4.0], [9.0, 9.0], [7.0, 8.0], [0.0, 0.0]])
    tokens, y = on_shared_tokens([([0, 100, 300], a), ([0, 200, 300, 400], b), ([0, 300], None)])
    assert list(tokens) == [0, 300] and y.shape == (3, 2, 2)
    np.testing.assert_allclose(y[:2], [[[1, 2], [5, 6]], [[3, 4], [7, 8]]])
    assert np.isnan(y[2]).all()
    assert shared_tokens([[0, 100, 300], [0, 200, 300, 400]]) == [0, 300]
    assert left_out([[0, 100, 300], [0, 200, 300, 400]]) == [100, 200, 400]


def test_seed_mean_of_lists_with_gaps():
    """mean_pr 80, None, 50 at 100k, 200k, 500k and 70, 58, 40 at 100k, 300k, 500k: 75 at 100k, 45 at 500k."""
    runs = [{"tokens": [100_000, 200_000, 500_000], "mean_pr": [80.0, None, 50.0]},
            {"tokens": [100_000, 300_000, 500_000], "mean_pr": [70.0, 58.0, 40.0]}]
    tokens, mean = seed_mean(runs, lambda r: r["mean_pr"])
    assert list(tokens) == [100_000, 500_000] and list(mean) == [75.0, 45.0]
    runs[0]["mean_pr"][0] = None  # one seed's value missing: the other's alone
    assert list(seed_mean(runs, lambda r: r["mean_pr"])[1]) == [70.0, 45.0]
    tokens, y = aligned([], lambda r: r["mean_pr"])
    assert tokens.size == 0 and y.shape == (0, 0)
    assert math.isnan(seed_mean(runs, lambda r: [None] * 3)[1][0])
