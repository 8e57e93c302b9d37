"""Statistics and every decision of the studies, as pure functions of results dicts. No torch.

stats (confidence intervals, t-tests, seeds that would settle a difference), series (seed means and
bands), rules (the decision procedure), and one module per study kind whose `analyze(runs)` returns
the frozen dataclasses its figures and report draw: qk_norm (verdict, claims), pilot, keys (where
layers ended), heads (taxonomy).
"""
