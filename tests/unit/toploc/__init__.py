"""Tests of toploc."""
