"""Ledger storage: SQLAlchemy engine set-up, versioned migrations and table definitions."""
