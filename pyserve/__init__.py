"""pyserve: a local LLM server with a C++ GGUF engine and an OpenAI-compatible API."""
