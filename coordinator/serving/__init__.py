"""What the coordinator serves: the ledger's HTTP API (FastAPI app, middleware, authentication, error
mapping, rate limits, metrics), the dashboard, its gossip node, and the uvicorn service that runs them."""
