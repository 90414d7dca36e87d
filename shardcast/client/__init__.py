"""The SHARDCAST client side: download a version from several relays, verified, and keep versions on a node's disk.

The download engine (:mod:`shardcast.client.transfer`) is also what a relay mirrors its upstreams with.
"""
