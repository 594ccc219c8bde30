"""Results of the offline API (shaped like vLLM's RequestOutput / CompletionOutput)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    # One dict per generated token: {token_id: logprob} with the chosen token and the top-N alternatives.
    logprobs: Optional[list[dict[int, float]]] = None
    finish_reason: Optional[str] = None  # "stop", "length", "abort"


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    # SamplingParams.prompt_logprobs set: one entry per prompt token, None for the first (nothing precedes
    # it), else {prompt token: logprob, then its top alternatives}; shared by the n samples
    prompt_logprobs: Optional[list[Optional[dict[int, float]]]] = None
