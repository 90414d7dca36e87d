"""Tests of coordinator.loop."""
