"""EngineRequest: a prompt and its SamplingParams as the engine takes them, built once per request — the one
builder behind `LLM.generate` and `AsyncLLM.generate`, so the offline and async APIs give the same tokens for
the same prompt.

The tokenization rule: a text prompt is encoded with control tokens written in it parsed as those tokens
(`"<start_of_turn>user"` is the turn marker, not its letters) and BOS added as the vocabulary asks (not twice
when the text already starts with it): how vLLM's and llama.cpp's servers read a prompt, and what a rendered
chat template needs. Token ids are taken as given.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from .output_processor import RequestState
from .sampling_params import SamplingParams
from .tokenizer import Tokenizer

_INT32_MAX = 2**31 - 1  # the engine's token counts

# a text, token ids, or vLLM's {"prompt_token_ids": [...]} (with an optional "prompt" text it stands for)
PromptType = Union[str, list, dict]


def prompt_ids(tokenizer: Tokenizer, prompt: PromptType, add_special: bool = True) -> tuple[Optional[str], list[int]]:
    """(its text if known, its token ids) under the rule above; TypeError for any other kind of prompt."""
    if isinstance(prompt, str):
        return prompt, tokenizer.encode(prompt, add_special=add_special, parse_special=True)
    if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
        return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
    if isinstance(prompt, (list, tuple)):
        return None, [int(t) for t in prompt]
    raise TypeError(f"a prompt is a string, a list of token ids or a dict with 'prompt_token_ids', got "
                    f"{type(prompt).__name__}")


@dataclass
class EngineRequest:
    prompt: Optional[str]
    prompt_token_ids: list[int]
    params: SamplingParams
    grammar: object = None  # the compiled constraint of params.structured_outputs, or None

    @classmethod
    def build(cls, tokenizer: Tokenizer, prompt: PromptType, params: SamplingParams, grammar=None) -> "EngineRequest":
        text, ids = prompt_ids(tokenizer, prompt)
        return cls(text, ids, params, grammar)

    def submit(self, engine, engine_id: str) -> None:
        """Queues it on an Engine or an EngineLoop (one request for its n samples: the prompt computed once,
        then forked, seed + i per sample); ValueError, nothing queued, for one the engine refuses."""
        args, kwargs = self._args()
        engine.add(engine_id, *args, **kwargs, grammar=self.grammar)

    def check(self, engine) -> None:
        """Raises the ValueError `submit` would raise (a live id aside), queueing nothing."""
        args, kwargs = self._args()
        engine.check_request("check", *args, **kwargs)

    def _args(self) -> tuple[tuple, dict]:
        """Engine.add's arguments after the id, the grammar aside (check_request takes the same)."""
        p = self.params
        max_tokens = min(p.max_tokens, _INT32_MAX)  # more is refused as too long all the same, not a TypeError
        return ((self.prompt_token_ids, p.engine_config(), max_tokens, p.ignore_eos, list(p.stop_token_ids)),
                {"n": p.n, "prompt_logprobs": p.prompt_logprobs, "cache_salt": p.cache_salt or "",
                 "priority": p.priority, "return_progress": p.return_progress, "write_through": p.write_through})

    def sample_states(self, tokenizer: Tokenizer) -> list[RequestState]:
        """Each sample's text state (detokenizer, stop strings, logprobs), in index order."""
        return [RequestState.for_params(tokenizer, self.prompt_token_ids, self.params) for _ in range(self.params.n)]
