"""Object store: one interface, S3 and filesystem implementations."""
