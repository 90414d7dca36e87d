"""Tests of coordinator.processes."""
