"""Speed and memory measurements behind research/benchmark.py."""
