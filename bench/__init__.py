"""Benchmarks: programs that print one JSON object of figures (see docs/benchmarks.md)."""
