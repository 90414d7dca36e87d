"""SHARDCAST: signed, sharded distribution of policy weights through untrusted HTTP relays."""
