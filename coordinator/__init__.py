"""The coordinator: task ledger (FastAPI), orchestrator, SHARDCAST origin and trainer driver."""
