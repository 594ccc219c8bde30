"""ServerConfig: the app's settings (what `pyserve serve` turns its flags into)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class ServerConfig:
    served_model_name: Optional[str] = None
    chat_template: Optional[str] = None  # the template's source (from --chat-template FILE)
    api_key: Optional[str] = None  # one key (kept for callers of the first version); merged into api_keys
    api_keys: list = field(default_factory=list)
    metrics_require_key: bool = False
    allowed_origins: list = field(default_factory=list)  # CORS: off unless set ("*": any origin)
    rate_limit_rpm: int = 0  # per key; 0: off
    rate_limit_tpm: int = 0  # per key, prompt + max_tokens; 0: off
    default_completion_estimate: int = 256  # tokens counted for a request without max_tokens
    max_waiting: int = 0  # sequences waiting beyond the running capacity; 0: unbounded
    max_queue_wait: float = 0.0  # seconds a request may be expected to wait before it starts; 0: no bound
    max_body_size: int = 8 * 1024 * 1024  # bytes; larger bodies get 413
    body_timeout: float = 30.0  # seconds to receive a body; slower gets 408
    stalled_client_timeout: float = 30.0  # seconds a stream write may wait on a client that is not reading
    sse_keepalive: float = 10.0  # seconds of silence after which a stream gets an SSE comment line (0: never)
    shared_prefix_cache: bool = False  # API keys share one prefix cache (else each key's prompts are its own)
    trust_request_chat_template: bool = False  # render a template sent in a request (with CPU/memory limits)
    pooling: str = "last"  # /v1/embeddings: "last" (the last token's final-norm hidden state) or "mean"
    normalize_embeddings: bool = True
    tool_call_parser: Optional[str] = None  # the tool-call family (None: detected from the chat template)
    reasoning_parser: str = "auto"  # the reasoning format (auto: detected from the chat template; none: off)
    reasoning_budget: int = -1  # tokens a reasoning may take unless the request says (-1: no bound)
    response_store_size: int = 1000  # past /v1/responses kept for previous_response_id and GET (0: off)
    response_store_ttl: float = 3600.0  # seconds one is kept
    response_store_bytes: int = 256 << 20  # bytes they may take, as JSON (the oldest go first)
    aliases: list = field(default_factory=list)  # other names of the one model (--served-model-name A B)
    # several models (model_registry.py): loaded at once (0: no bound), bytes they may hold (0: no bound),
    # seconds one may stay loaded unused (0: for ever); max_queue_wait also bounds a wait for room
    max_loaded_models: int = 1
    models_memory: int = 0
    keep_alive: float = 0.0
