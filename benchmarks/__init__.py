"""Benchmarks: scripts that print tables. Run them as modules from the repository root,
e.g. `python -m benchmarks.scheduling_bench --help`."""
