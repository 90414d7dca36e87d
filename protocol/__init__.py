"""The wire contract, the bottom of the package ladder: versioned schemas, route paths, node identities and
signatures, gossip announcements, the ledger client and the one error hierarchy. It imports nothing of
prime-network's own above it.
"""
