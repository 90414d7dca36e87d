"""Benchmarks: programs that print one JSON object of figures (see DESIGN.md, Benchmarks)."""
