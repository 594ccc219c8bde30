"""The API layer: each endpoint family its own package over a shared base, as vLLM's entrypoints.

- `base/`: what every family builds on — the request and reply model bases (protocol.py), the sampling
  fields both generating endpoints take with vLLM's extras (sampling.py), OpenAI's error JSON (errors.py),
  the request's context from the server (context.py), the served model (served_model.py), the fan-in of
  engine outputs into replies or event streams (serving.py, streaming.py).
- `template/`: chat templates (the model's own, the built-in Gemma format, ones sent in requests).
- `chat/` (/v1/chat/completions, with its tools, tool parsers and reasoning split), `completions/`
  (/v1/completions), `infill/` (llama.cpp's /infill), `responses/` (OpenAI's Responses API), `messages/`
  (Anthropic's Messages API), `pooling/` (/v1/embeddings, /v1/rerank, /v1/score), `tokens/` (/tokenize,
  /detokenize, /apply-template, /tokenizer_info).

It is handed an engine and each request's context; it returns reply models or event streams, never bytes
framed for the wire, and never imports the server layer above it (tests/house/test_layers.py).
"""
