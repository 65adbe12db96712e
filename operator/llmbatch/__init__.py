"""llm-batch-operator: OpenAI-compatible batch inference on Kubernetes."""

__version__ = "0.1.0"
