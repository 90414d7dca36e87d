"""Tests of coordinator.ledger.ledger."""
