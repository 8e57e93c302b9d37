"""results.json and study folders: schema, vocabulary, reading, validating, atomic writing. No torch.

Everything that writes results (the probe callback, the study runner) and everything
that reads them (analysis, plots, split_panels) goes through this package.

Its names are taken from research.results.schema when first asked for (PEP 562), not when the package is imported,
so that `python -m research.results.schema` (a command: --json_schema) runs that module once, as the program,
not also as a module its package imported first (runpy warns of that).
"""
__all__ = ["ResultsError", "add_probe", "diverged_at", "load_results", "mark_diverged", "new_results", "save_results",
           "truncate", "validate"]


def __getattr__(name: str):
    if name in __all__:
        from research.results import schema
        return getattr(schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
