"""Prefill-only endpoints: /v1/embeddings, and /v1/rerank (Jina / Cohere) and vLLM's /v1/score on a
reranker GGUF."""
