"""Tests of validator."""
