"""/v1/embeddings: each input a prefill-only engine request (pooled final-norm hidden state), all of a
request's inputs in one nursery; `float` or `base64` (little-endian float32, what the openai SDK asks for)."""
from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Union

import trio

from ..base.context import Demand, RequestContext
from ..base.errors import bad_request, from_engine
from ..base.served_model import ServedModel
from .protocol import EmbeddingData, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage

if TYPE_CHECKING:  # numpy is imported where a vector is made: a server that makes none does not pay 35 ms
    import numpy as np


class EmbeddingServing:
    def __init__(self, model: ServedModel):
        self.model = model

    async def create(self, req: EmbeddingRequest, ctx: RequestContext) -> EmbeddingResponse:
        m = self.model
        m.check_name(req.model)
        if req.dimensions is not None and req.dimensions != m.n_embd:
            raise bad_request(f"this model's embeddings have {m.n_embd} dimensions; it cannot return "
                              f"{req.dimensions}", param="dimensions")
        inputs = [self._ids(x, req.add_special_tokens is not False) for x in req.inputs]
        vectors = await embed_all(m, ctx, inputs, ctx.response_id("embd"), m.pooling, m.normalize_embeddings)
        data = [EmbeddingData.model_construct(object="embedding", index=i, embedding=_encode(v, req.encoding_format))
                for i, v in enumerate(vectors)]
        n = sum(len(ids) for ids in inputs)
        return EmbeddingResponse.model_construct(object="list", data=data, model=m.name,
                                                 usage=EmbeddingUsage.model_construct(prompt_tokens=n, total_tokens=n))

    def _ids(self, x: Union[str, list[int]], add_special: bool) -> list[int]:
        m = self.model
        if isinstance(x, str):
            m.check_text_size(len(x.encode()), "input")
            x = m.tokenizer.encode(x, add_special=add_special, parse_special=True)
        try:
            m.engine.check_embed(x, m.pooling)
        except ValueError as e:
            raise from_engine(e, "input") from None
        return x


async def embed_all(m: ServedModel, ctx: RequestContext, inputs: list[list[int]], rid: str, pooling: str,
                    normalize: bool) -> list[np.ndarray]:
    """One prefill-only engine request per input (ids), all in one nursery, admitted together: their pooled
    vectors, in order (a 'rank' one: [1] its relevance score)."""
    out: list = [None] * len(inputs)

    async def one(i: int) -> None:
        out[i] = await m.engine.embed(inputs[i], pooling=pooling, normalize=normalize, request_id=f"{rid}-{i}",
                                      cache_salt=ctx.cache_salt(None))

    ticket = ctx.admit(Demand([(len(ids), 0) for ids in inputs], 0))
    try:
        async with trio.open_nursery() as nursery:
            for i in range(len(inputs)):
                nursery.start_soon(one, i)
    finally:
        ticket.release()
    return out


def _encode(v: np.ndarray, fmt: str) -> Union[list[float], str]:
    import numpy as np

    v = np.asarray(v, dtype="<f4")
    return base64.b64encode(v.tobytes()).decode() if fmt == "base64" else v.tolist()
