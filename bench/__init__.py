"""Benchmarks: run with ``make bench`` (``python -m bench.overhead``); results in RESULTS.md."""
