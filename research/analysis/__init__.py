"""Statistics and every decision of the studies, as pure functions of results dicts. No torch.

stats (confidence intervals, Welch's test), series (seed means and bands), and one module per
study kind whose `analyze(runs)` returns the frozen dataclasses its figures and report draw:
qk_norm (verdict, claims), pilot, keys (where layers ended), heads (taxonomy).
"""
