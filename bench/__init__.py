"""Benchmarks: ``python -m bench`` lists them, ``python -m bench NAME [ARGS...]`` runs one
(``make bench NAME=... ARGS=...``); results in RESULTS.md. Shared code is in bench/harness/."""
