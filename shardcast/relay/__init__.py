"""A SHARDCAST relay: mirror what the upstreams announce, verifying all of it, serve it, and join the gossip network."""
