"""/v1/rerank (Jina's and Cohere's shape, as llama.cpp's server and vLLM serve it) and vLLM's /v1/score: the
requests, in the APIs' documented field order, and their replies. Imported at the first such request (the
server's routes/pooling.py), not at start-up."""
from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, model_validator

from ..base.errors import bad_request
from ..base.protocol import ReplyModel, RequestModel

Text = Annotated[str, Field(min_length=1)]


class RerankDocument(RequestModel):
    text: Text


class RerankRequest(RequestModel):
    """/v1/rerank: Jina's fields (Cohere's are the same names)."""
    model: Optional[str] = None
    query: Text
    documents: Annotated[list[Union[Text, RerankDocument]], Field(min_length=1, max_length=1024)]
    top_n: Annotated[Optional[int], Field(ge=0)] = None  # None or 0: every document (vLLM's 0)
    return_documents: bool = True  # Jina's and vLLM's default (Cohere's is false)

    @property
    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


Texts = Union[Text, Annotated[list[Text], Field(min_length=1, max_length=1024)]]


class ScoreRequest(RequestModel):
    """vLLM's /v1/score: text_1 against text_2, 1:1, 1:N (one text_1 against each text_2) or N:N (pairwise)."""
    model: Optional[str] = None
    text_1: Texts
    text_2: Texts

    @model_validator(mode="after")
    def _pairable(self) -> "ScoreRequest":
        n1, n2 = len(self.firsts), len(self.seconds)
        if n1 != 1 and n1 != n2:
            raise bad_request(f"text_1 has {n1} texts and text_2 {n2}: send one text_1, or as many as text_2",
                              param="text_1")
        return self

    @property
    def firsts(self) -> list[str]:
        return [self.text_1] if isinstance(self.text_1, str) else list(self.text_1)

    @property
    def seconds(self) -> list[str]:
        return [self.text_2] if isinstance(self.text_2, str) else list(self.text_2)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        f = self.firsts
        return [(f[0] if len(f) == 1 else f[i], t) for i, t in enumerate(self.seconds)]


class RerankUsage(ReplyModel):
    prompt_tokens: int
    total_tokens: int


class ScoreUsage(RerankUsage):
    completion_tokens: int  # 0: vLLM's usage of a score


class RerankResultDocument(ReplyModel):
    text: str


class RerankResult(ReplyModel):
    index: int
    relevance_score: float
    document: Optional[RerankResultDocument] = None


class RerankResponse(ReplyModel):
    id: str
    object: Literal["list"] = "list"
    model: str
    results: list[RerankResult]
    usage: RerankUsage


class ScoreData(ReplyModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(ReplyModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: ScoreUsage
