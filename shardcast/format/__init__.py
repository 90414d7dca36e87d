"""What a SHARDCAST version is, on the wire and on disk: signed manifests, value patches, the store layout."""
