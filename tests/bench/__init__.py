"""Benchmarks for nodegate (run with ``python -m tests.bench``; not collected by pytest)."""
