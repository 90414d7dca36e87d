"""Tests of worker."""
