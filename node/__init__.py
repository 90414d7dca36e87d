"""The node runtime shared by workers and validators: retries, start-up pinning, gossip, the live display."""
