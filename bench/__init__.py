"""Benchmarks: scripts run from the repository root (``python bench/research.py``)."""
