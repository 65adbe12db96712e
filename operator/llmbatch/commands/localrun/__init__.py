"""The steps of ``llmbatch run``: check the input, plan the shards, run them, merge the results."""
