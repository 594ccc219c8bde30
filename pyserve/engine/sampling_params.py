"""SamplingParams: what a request asks of the sampler and of the stop conditions (shaped like vLLM's)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .structured import StructuredOutputsParams

MAX_LOGPROBS = 20


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # <= 0: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: Optional[int] = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    max_tokens: int = 16
    min_tokens: int = 0  # EOS, stop ids and stop strings cannot end a sample before this many tokens
    logprobs: Optional[int] = None  # number of alternatives besides the chosen token
    # Score the prompt too: per position, the prompt token's logprob and this many alternatives (vLLM's
    # prompt_logprobs); then max_tokens may be 0 (the prompt alone)
    prompt_logprobs: Optional[int] = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    skip_special_tokens: bool = True
    # Constrain the text (JSON schema, regex, choice, grammar): every sample draws only what it allows, and
    # ends ("stop") when the grammar is complete. Reported logprobs stay the model's raw distribution.
    structured_outputs: Optional[StructuredOutputsParams] = None
    # What the request asks of the scheduler, carried here so that one object bridges the API to the engine
    # (vLLM takes priority as a generate() argument and cache_salt in the prompt): lower priority values are
    # served first (admission, the step's tokens, preemption); requests with different cache salts never share
    # cached KV blocks (None: the shared cache); return_progress: the stream reports the prompt's progress;
    # write_through: with a disk tier, the prompt's blocks are saved as soon as they are computed.
    priority: int = 0
    cache_salt: Optional[str] = None
    return_progress: bool = False
    write_through: bool = False  # with a disk tier: the prompt's blocks go to disk once computed (a reused prefix)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.logit_bias = self.logit_bias or {}  # its ids and values are converted (and checked) once, by the engine
        self._check()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_config"}  # a copy or a pickle rebuilds it

    def _check(self) -> None:
        """The sampler's rules are the engine's (its SamplingConfig's check, run as it is built, here once);
        n and max_tokens are checked where the engine takes the request (they depend on its limits); what
        only this layer uses is checked here."""
        checks = [
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
             f"must be in [0, {MAX_LOGPROBS}]"),
            ("prompt_logprobs", self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS,
             f"must be in [0, {MAX_LOGPROBS}]"),
            ("stop", all(isinstance(s, str) and s for s in self.stop), "must be non-empty strings"),
            ("priority", isinstance(self.priority, int) and -2**31 <= self.priority < 2**31,
             "must be an integer in [-2^31, 2^31)"),
            ("cache_salt", self.cache_salt is None or (isinstance(self.cache_salt, str) and self.cache_salt),
             "must be a non-empty string if given"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"{name} {why}, got {getattr(self, name)!r}")
        self.engine_config()

    def engine_config(self):
        """The C++ sampler's parameters of the request (an _engine.SamplingConfig, built once; its n samples
        draw with seed + 0 … n-1: the engine's fork). ValueError naming the parameter the engine refuses."""
        made = self.__dict__.get("_config")
        values = self._engine_values()
        if made is not None and made[0] == values:  # (a field changed since: made, and checked, again)
            return made[1]
        from .. import _engine  # here, not at import: `import pyserve` does not load the extension

        config = _engine.SamplingConfig(**dict(zip(_SAMPLER_FIELDS, values)))
        bias = _SAMPLER_FIELDS.index("logit_bias")  # kept as a copy: a change made in place is seen too
        self.__dict__["_config"] = (values[:bias] + (dict(values[bias]),) + values[bias + 1:], config)
        return config

    def _engine_values(self) -> tuple:
        return (self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty, self.presence_penalty,
                self.frequency_penalty, self.seed, self.logit_bias, self.min_tokens,
                -1 if self.logprobs is None else self.logprobs)

    def engine_sampling(self) -> dict:
        """engine_config's keys and values, as a dict (the native API's `sampling`)."""
        return dict(zip(_SAMPLER_FIELDS, self._engine_values()))


# The engine sampler's parameters, in _engine_values' order
_SAMPLER_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                   "frequency_penalty", "seed", "logit_bias", "min_tokens", "logprobs")
