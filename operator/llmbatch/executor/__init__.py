"""The shard runner and its engines."""
