"""llama.cpp's /infill: its request (llama.cpp's field names, with pyserve's bounds on the sampling fields) and
its /completion-style response (`content`, `stop`, `tokens_predicted`, ...; a stream sends one such object
per step with `stop: false`, then the final one with `stop: true`, and no `[DONE]`)."""
from __future__ import annotations

from typing import Annotated, Optional, Union

from pydantic import Field, field_validator, model_validator

from ...engine.sampling_params import MAX_LOGPROBS
from ..base.errors import bad_request, unsupported
from ..base.protocol import MinP, Penalty, RepetitionPenalty, RequestModel, Seed, Stop, Temperature, TopK, TopP
from ..completions.protocol import CompletionRequest


class InfillChunk(RequestModel):
    """One extra file put before the prefix (a file of the project the model should see)."""
    filename: Optional[str] = None  # llama.cpp's default name: "tmp"
    text: str


class InfillRequest(RequestModel):
    model: Optional[str] = None
    prompt: Optional[str] = None  # continues the prefix (after it, before the suffix)
    input_prefix: str
    input_suffix: str
    input_extra: Optional[list[InfillChunk]] = None
    temperature: Temperature = None
    top_k: TopK = None
    top_p: TopP = None
    min_p: MinP = None
    n_predict: Annotated[Optional[int], Field(ge=-1)] = None  # -1: up to the context's end
    max_tokens: Annotated[Optional[int], Field(ge=1)] = None  # llama.cpp's alias of n_predict
    stream: Optional[bool] = None
    stop: Stop = None
    repeat_penalty: RepetitionPenalty = None
    presence_penalty: Penalty = None
    frequency_penalty: Penalty = None
    json_schema: Optional[Union[dict, bool]] = None
    grammar: Optional[str] = None
    seed: Seed = None
    ignore_eos: Optional[bool] = None
    n_probs: Annotated[Optional[int], Field(ge=0, le=MAX_LOGPROBS)] = None  # completion_probabilities' top-N
    post_sampling_probs: Optional[bool] = None
    cache_prompt: Optional[bool] = None  # accepted: pyserve's prefix cache is always on
    return_tokens: Optional[bool] = None  # `tokens`: the generated token ids
    return_progress: Optional[bool] = None  # a stream's steps carry `prompt_progress` while the prompt is computed

    @field_validator("post_sampling_probs")
    @classmethod
    def _no_post_sampling(cls, v):
        if v:
            raise unsupported("'post_sampling_probs' (probabilities after the samplers) on /infill",
                              "post_sampling_probs")
        return v

    @model_validator(mode="after")
    def _rules(self):
        if self.n_predict == 0:
            raise bad_request("'n_predict' must be -1 (no bound) or at least 1", param="n_predict")
        return self

    def bound(self) -> Optional[int]:
        """The completion bound asked (None: up to the context's end)."""
        n = self.n_predict if self.n_predict is not None else self.max_tokens
        return None if n is None or n < 0 else n

    def extra_files(self) -> list[tuple[str, str]]:
        return [(c.filename if c.filename is not None else "tmp", c.text) for c in self.input_extra or ()]

    def completion_request(self, prompt_ids: list[int]) -> CompletionRequest:
        """The same sampling as a /v1/completions request for the laid-out prompt (the serving code is
        completions'); every field was checked here, under llama.cpp's names."""
        return CompletionRequest.model_construct(
            model=self.model, prompt=prompt_ids, max_tokens=self.bound(), temperature=self.temperature,
            top_k=self.top_k, top_p=self.top_p, min_p=self.min_p, stream=self.stream, stop=self.stop,
            return_progress=self.return_progress,
            repetition_penalty=self.repeat_penalty, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, json_schema=self.json_schema, grammar=self.grammar,
            seed=self.seed, ignore_eos=self.ignore_eos, logprobs=self.n_probs or None)


class InfillTimings(RequestModel):
    cache_n: int
    prompt_n: int
    predicted_n: int


class InfillResponse(RequestModel):
    """The final object (`stop: true`); a streamed step has index, content, tokens, stop (false), id_slot,
    tokens_predicted and tokens_evaluated."""
    index: int
    content: str
    tokens: list[int]
    id_slot: int
    stop: bool
    model: str
    tokens_predicted: int
    tokens_evaluated: int
    generation_settings: dict
    prompt: str
    has_new_line: bool
    truncated: bool
    stop_type: str  # "eos", "word" (a stop string), "limit" (the bound)
    stopping_word: str
    tokens_cached: int
    timings: InfillTimings
    completion_probabilities: Optional[list[dict]] = None  # n_probs: each token's logprob and the top ones
