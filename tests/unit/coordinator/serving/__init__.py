"""Tests of coordinator.serving."""
