"""/v1/rerank and /v1/score: each query-document pair one prefill-only engine request with 'rank' pooling (the
last token's final-norm state through the model's classifier head, as llama.cpp's RANK pooling), the pairs
batched as embeddings are (embed_all). Only a reranker GGUF (one with cls.output.weight) serves them."""
from __future__ import annotations

import time

from ..base.context import RequestContext
from ..base.errors import bad_request, from_engine
from ..base.served_model import ServedModel
from .embeddings import embed_all
from .score_protocol import (RerankRequest, RerankResponse, RerankResult, RerankResultDocument, RerankUsage, ScoreData,
                             ScoreRequest, ScoreResponse, ScoreUsage)

RERANK_TEMPLATE_KEY = "tokenizer.chat_template.rerank"  # llama.cpp's: {query} and {document} filled in


class RerankServing:
    def __init__(self, model: ServedModel):
        self.model = model
        engine = model.engine
        self.is_reranker = engine.hparams.get("n_cls_out", 0) > 0
        template = engine.metadata.get(RERANK_TEMPLATE_KEY)
        self.template = template if isinstance(template, str) else None

    async def rerank(self, req: RerankRequest, ctx: RequestContext) -> RerankResponse:
        docs = req.texts
        scores, n = await self._scores(req.model, [(req.query, d) for d in docs], ctx, ("query", "documents"))
        order = sorted(range(len(docs)), key=lambda i: -scores[i])[:req.top_n or None]
        results = [RerankResult(index=i, relevance_score=scores[i],
                                **({"document": RerankResultDocument(text=docs[i])} if req.return_documents else {}))
                   for i in order]  # without return_documents no `document` at all (the wire drops unset fields)
        return RerankResponse(id=ctx.response_id("rerank"), object="list", model=self.model.name, results=results,
                              usage=RerankUsage(prompt_tokens=n, total_tokens=n))

    async def score(self, req: ScoreRequest, ctx: RequestContext) -> ScoreResponse:
        scores, n = await self._scores(req.model, req.pairs, ctx, ("text_1", "text_2"))
        return ScoreResponse(id=ctx.response_id("score"), object="list", created=int(time.time()),
                             model=self.model.name,
                             data=[ScoreData(index=i, object="score", score=s) for i, s in enumerate(scores)],
                             usage=ScoreUsage(prompt_tokens=n, total_tokens=n, completion_tokens=0))

    async def _scores(self, name, pairs: list[tuple[str, str]], ctx: RequestContext,
                      params: tuple[str, str]) -> tuple[list[float], int]:
        """Each pair's relevance score, and the prompt tokens they took; params: the query's and the documents'
        fields, for errors."""
        m = self.model
        m.check_name(name)
        if not self.is_reranker:
            raise bad_request(f"model {m.name!r} is not a reranker: its GGUF has no classifier head "
                              "(cls.output.weight, pooling_type rank); serve a reranker GGUF such as "
                              "Qwen3-Reranker converted by llama.cpp", param="model")
        inputs = [self.pair_ids(q, d, params) for q, d in pairs]
        vectors = await embed_all(m, ctx, inputs, ctx.response_id("rr"), "rank", False)
        return [float(v[0]) for v in vectors], sum(len(ids) for ids in inputs)

    def pair_ids(self, query: str, doc: str, params: tuple[str, str]) -> list[int]:
        """llama.cpp's format_prompt_rerank: the model's rerank template with {query} and {document} filled in
        (special tokens parsed, none added), else [BOS] query [EOS] document [EOS] as the vocabulary adds them."""
        m, tok = self.model, self.model.tokenizer
        m.check_text_size(len(query.encode()), params[0])
        m.check_text_size(len(query.encode()) + len(doc.encode()), params[1])
        if self.template is not None:
            text = self.template.replace("{query}", query).replace("{document}", doc)
            ids = tok.encode(text, add_special=False, parse_special=True)
        else:
            eos = [tok.eos_id] if tok.add_eos and tok.eos_id is not None else []
            ids = ([tok.bos_id] if tok.add_bos and tok.bos_id is not None else [])
            ids += tok.encode(query, add_special=False) + eos + tok.encode(doc, add_special=False) + eos
        try:
            m.engine.check_embed(ids, "rank", False)
        except ValueError as e:
            raise from_engine(e, params[1]) from None
        return ids
