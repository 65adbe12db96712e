"""Pydantic models: OpenAI wire types and the custom resources (the source of crds/)."""
