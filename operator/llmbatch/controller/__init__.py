"""kopf handlers and Kubernetes adapters."""
