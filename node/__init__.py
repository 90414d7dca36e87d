"""The node runtime shared by workers and validators: the process lifecycle, retries, start-up pinning, gossip, the live
display."""
