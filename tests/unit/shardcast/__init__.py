"""Tests of shardcast."""
