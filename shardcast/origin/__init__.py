"""The SHARDCAST origin: where a version starts, published from a checkpoint, signed by the coordinator, and served."""
