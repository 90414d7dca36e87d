"""The HTTP face of SHARDCAST, shared by the origin and every relay: the ASGI app, its server, ranges and metrics."""
