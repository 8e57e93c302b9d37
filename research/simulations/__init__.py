"""Error rates of the decisions, measured by simulation: studies drawn from a known truth, decided by the same
functions the reports use (research.analysis), and counted. No torch; each module runs as a script that prints
its rates (`python -m research.simulations.<module> --help`), with a seeded smoke test of a few seconds in tests/."""
