"""The OpenAI layer: protocol models, the serving of each endpoint, chat templates, SSE framing. It is
handed an engine and the request's context; it never imports the server layer above it."""
