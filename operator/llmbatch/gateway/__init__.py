"""FastAPI app: the OpenAI Files / Batches / Models API onto custom resources."""
