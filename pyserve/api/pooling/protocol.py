"""/v1/embeddings' models (OpenAI's fields, in its order): the request and its replies. The reranker's are
score_protocol.py's."""
from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field

from ..base.protocol import MAX_PROMPTS, ReplyModel, RequestModel, TokenIds

EmbeddingInput = Union[Annotated[str, Field(min_length=1)], Annotated[list[Annotated[str, Field(min_length=1)]],
                       Field(min_length=1, max_length=MAX_PROMPTS)], TokenIds,
                       Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]]


class EmbeddingRequest(RequestModel):
    """/v1/embeddings (OpenAI's fields, in its order)."""
    input: EmbeddingInput
    model: Optional[str] = None
    dimensions: Annotated[Optional[int], Field(ge=1)] = None
    encoding_format: Literal["float", "base64"] = "float"
    user: Optional[str] = None
    # vLLM's extras
    add_special_tokens: Optional[bool] = None

    @property
    def inputs(self) -> list[Union[str, list[int]]]:
        """Each input: a string or token ids."""
        x = self.input
        if isinstance(x, str) or isinstance(x[0], int):
            return [x]
        return list(x)


class EmbeddingData(ReplyModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Union[list[float], str]  # base64: little-endian float32


class EmbeddingUsage(ReplyModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(ReplyModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
