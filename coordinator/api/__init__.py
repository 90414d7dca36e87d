"""The ledger's HTTP API: FastAPI app, middleware, authentication and error mapping."""
