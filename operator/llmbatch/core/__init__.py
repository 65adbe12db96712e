"""Pure logic, no I/O: validation, shard planning, ids, scheduling maths."""
