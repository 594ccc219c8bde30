"""/v1/completions' models: the request (a prompt or several, as text or token ids; OpenAI's fields in its
order, then vLLM's extras) and its replies."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, model_validator

from ...engine.sampling_params import MAX_LOGPROBS
from ..base.errors import bad_request
from ..base.protocol import (MAX_CHOICES, MAX_PROMPTS, NChoices, Penalty, ReplyModel, RequestModel, Seed, Stop,
                             StreamOptions, Temperature, TokenIds, TopP)
from ..base.replies import CompletionLogprobs, PromptLogprobs, Usage
from ..base.sampling import ResponseFormat, SamplingRequest

Prompt = Union[str, Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)], TokenIds,
               Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]]


class _OpenAICompletionFields(RequestModel):
    """OpenAI's fields of a completion request, in its order."""
    model: Optional[str] = None
    prompt: Prompt
    best_of: Optional[int] = None
    echo: Optional[bool] = None
    frequency_penalty: Penalty = None
    logit_bias: Optional[dict[str, Any]] = None
    logprobs: Annotated[Optional[int], Field(ge=0, le=MAX_LOGPROBS)] = None
    max_tokens: Annotated[Optional[int], Field(ge=0)] = None  # 0: score the prompt alone (echo + logprobs)
    n: NChoices = None
    presence_penalty: Penalty = None
    seed: Seed = None
    stop: Stop = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    suffix: Optional[str] = None
    temperature: Temperature = None
    top_p: TopP = None
    user: Optional[str] = None
    metadata: Optional[dict] = None


class CompletionRequest(SamplingRequest, _OpenAICompletionFields):
    """A /v1/completions request: OpenAI's fields in its order, then vLLM's sampling extras and the
    structured-output forms chat and completions share, then response_format (chat's, which vLLM takes on
    completions too)."""
    # (pydantic lists a later base's fields first: _OpenAICompletionFields', then SamplingRequest's, then this)
    response_format: Optional[ResponseFormat] = None

    @model_validator(mode="after")
    def _choices(self):
        if self.suffix and self.echo:  # the prompt the model gets is the FIM layout, not the text sent
            raise bad_request("'echo' cannot be used with 'suffix' (fill-in-the-middle)", param="echo")
        if self.max_tokens == 0 and self.prompt_logprobs_wanted() is None:
            raise bad_request("'max_tokens' must be at least 1 (0 only scores the prompt: with 'echo' and "
                              "'logprobs', or 'prompt_logprobs')", param="max_tokens")
        if len(self.prompts) * self.n_choices > MAX_CHOICES:
            raise bad_request(f"prompts x n is at most {MAX_CHOICES}, got {len(self.prompts) * self.n_choices}",
                              param="n")
        return self

    @property
    def prompts(self) -> list[Union[str, list[int]]]:
        """Each prompt: a string or token ids."""
        p = self.prompt
        if isinstance(p, str) or isinstance(p[0], int):
            return [p]
        return list(p)

    def logprobs_wanted(self) -> Optional[int]:
        return self.logprobs

    def prompt_logprobs_wanted(self) -> Optional[int]:
        """Alternatives per prompt token: vLLM's prompt_logprobs, or the echoed prompt's logprobs (what
        lm-eval's log-likelihood requests ask: echo + logprobs)."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.logprobs if self.echo else None


# ---- the replies ----

class CompletionChoice(ReplyModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None
    prompt_logprobs: Optional[PromptLogprobs] = None  # vLLM's extra, when asked


class CompletionResponse(ReplyModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: Optional[str] = None
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None
    prompt_progress: Optional[dict] = None  # llama.cpp's, on a stream's chunks (return_progress)
