"""Chat templates: the model's own in Hugging Face's Jinja environment, the built-in Gemma format, and
templates sent in requests (only with --trust-request-chat-template)."""
