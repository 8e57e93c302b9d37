"""results.json and study folders: schema, vocabulary, reading, validating, atomic writing. No torch.

Everything that writes results (the probe callback, the study runner) and everything
that reads them (analysis, plots, split_panels) goes through this package.
"""
from research.results.schema import (ResultsError, add_probe, diverged_at, load_results, mark_diverged, new_results,
                                     save_results, truncate, validate)

__all__ = ["ResultsError", "add_probe", "diverged_at", "load_results", "mark_diverged", "new_results", "save_results",
           "truncate", "validate"]
