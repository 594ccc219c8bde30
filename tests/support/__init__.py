"""What tests share and are not tests themselves: random-weight model files (model_factory*), the NumPy
reference forward (numpy_ref*), llama.cpp's cases (llamacpp_cases), vocabularies (gguf_vocab), prompts, a
real server and its clients (live_server, sse_client, wire_servers), and helpers several test files use.
Importable as `support.<module>`: pytest puts tests/ on sys.path (pyproject.toml's pythonpath), and scripts/
that use them put it there themselves. Paths into the repository: support.paths."""
