"""Expert shards past one machine: the shard map, a shard replica and its parts and postings, the
serving side's client, and their Ray Serve deployments (the `ray` extra)."""
