"""LLM: the offline API (shaped like vLLM's). Many prompts run through the engine's scheduler at once."""
from __future__ import annotations

import itertools
from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np

from .. import _engine
from .model_source import resolve_model
from .output_processor import RequestState
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams
from .speculative import draft_tokens
from .structured import GrammarCompiler
from .tokenizer import Tokenizer

PromptType = Union[str, dict]


class LLM:
    """A model loaded into the C++ engine, with its tokenizer.

    LLM(model=None) loads the default model; `model` is a GGUF path otherwise. Engine options: n_threads
    (default one per core), n_ctx, num_kv_blocks / kv_cache_memory, max_num_seqs, max_num_batched_tokens,
    enable_prefix_caching, target_itl (seconds > 0: each step beside running decodes takes only the prompt
    tokens that keep its predicted time under this; 0: max_num_batched_tokens alone), speculative_ngram (> 0:
    speculative decoding by prompt lookup, up to this many drafted tokens per step; outputs are unchanged; or
    vLLM's speculative_config={"method": "ngram", "num_speculative_tokens": K}).
    """

    def __init__(self, model: Optional[str] = None, *, n_threads: int = 0, n_ctx: int = 0, num_kv_blocks: int = 0,
                 kv_cache_memory: int = 0, block_size: int = 16, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 512, enable_prefix_caching: bool = True, target_itl: float = 0.0,
                 speculative_ngram: int = 0, speculative_config: Optional[dict] = None):
        self.model_path = resolve_model(model)
        self.engine = _engine.Engine(self.model_path, n_threads=n_threads, n_ctx=n_ctx, num_kv_blocks=num_kv_blocks,
                                     kv_cache_memory=kv_cache_memory, block_size=block_size,
                                     max_num_seqs=max_num_seqs, max_batched_tokens=max_num_batched_tokens,
                                     enable_prefix_caching=enable_prefix_caching, step_target=target_itl,
                                     speculative_ngram=draft_tokens(speculative_ngram, speculative_config))
        self.tokenizer = Tokenizer.from_gguf_metadata(self.engine.metadata)
        self.engine.eos_ids = list(self.tokenizer.eos_ids)
        self.grammars = GrammarCompiler(self.tokenizer, self.engine.hparams["n_vocab"])
        self._ids = itertools.count()

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special=skip_special)

    def prompt_logits(self, token_ids: Sequence[int], rows: Optional[Sequence[int]] = None) -> np.ndarray:
        """Logits [len(rows) or T, n_vocab] at positions `rows` (default all) of token_ids, as one fresh sequence."""
        return self.engine.prompt_logits(list(token_ids), list(rows or []))

    def generate(self, prompts: Union[PromptType, Iterable[PromptType]],
                 sampling_params: Optional[SamplingParams] = None) -> list[RequestOutput]:
        """Runs every prompt (a string, or {"prompt_token_ids": [...]}) to completion, all batched together."""
        params = sampling_params or SamplingParams()
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        outputs = [self._add(p, params) for p in prompts]
        live = {key: (out, state) for out, subs in outputs for key, state in subs}
        try:
            while live:
                for rid, token, logprob, top, reason, _, idx, _sched, _ts, _cached, _emb, plp in self.engine.step():
                    if plp is not None and (rid, idx) in live:
                        live[rid, idx][0].prompt_logprobs = plp
                    self._apply(live, (rid, idx), token, logprob, top, reason)
        finally:
            for rid, idx in live:
                self.engine.abort(rid, idx)
            while self.engine.has_work():
                self.engine.step()
        return [out for out, _ in outputs]

    def embed(self, prompts: Union[PromptType, Iterable[PromptType]], pooling: str = "last",
              normalize: bool = True) -> list[np.ndarray]:
        """The embedding of every prompt (a string, or {"prompt_token_ids": [...]}), all batched together: its
        final-norm hidden state (float32 [n_embd]) pooled over the prompt, "last" (the last token's) or "mean"
        (of every token's), L2-normalised if `normalize`. Raises ValueError, queueing nothing, if any is refused."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        ids = [self._prompt_ids(p)[1] for p in prompts]
        for i in ids:
            self.engine.check_embed(i, pooling, normalize)
        rids = [str(next(self._ids)) for _ in ids]
        for rid, i in zip(rids, ids):
            self.engine.add_embed(rid, i, pooling, normalize)
        vectors: dict[str, np.ndarray] = {}
        try:
            while len(vectors) < len(rids):
                for rid, _tok, _lp, _top, reason, _n, _idx, _sched, _ts, _cached, emb, _plp in self.engine.step():
                    if reason != "stop":  # an abort (this engine is not shared while embed runs)
                        raise RuntimeError(f"embedding request {rid} ended: {reason}")
                    vectors[rid] = emb
        finally:
            for rid in rids:
                if rid not in vectors:
                    self.engine.abort(rid)
            while self.engine.has_work():
                self.engine.step()
        return [vectors[rid] for rid in rids]

    def _add(self, prompt: PromptType, params: SamplingParams) -> tuple[RequestOutput, list]:
        text, ids = self._prompt_ids(prompt)
        out = RequestOutput(request_id=str(next(self._ids)), prompt=text, prompt_token_ids=ids, outputs=[])
        so = params.structured_outputs
        # One engine request for the n samples: the prompt is computed once, then forked (seed + i per sample).
        self.engine.add(out.request_id, ids, params.engine_sampling(0), params.max_tokens, params.ignore_eos,
                        list(params.stop_token_ids), n=params.n, prompt_logprobs=params.prompt_logprobs,
                        grammar=self.grammars.compile(so) if so else None)
        subs = []
        for i in range(params.n):
            out.outputs.append(CompletionOutput(index=i, logprobs=[] if params.logprobs is not None else None))
            subs.append(((out.request_id, i), RequestState.for_params(self.tokenizer, ids, params)))
        return out, subs

    def _prompt_ids(self, prompt: PromptType) -> tuple[Optional[str], list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenize(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
        raise TypeError(f"a prompt is a string or a dict with 'prompt_token_ids', got {type(prompt).__name__}")

    def _apply(self, live: dict, key: tuple[str, int], token: int, logprob: float, top: list, reason: str) -> None:
        entry = live.get(key)
        if entry is None:
            return
        out, state = entry
        rid, idx = key
        delta = state.process(token, logprob, top, reason)
        comp = out.outputs[idx]
        comp.text += delta.text
        comp.token_ids += delta.token_ids
        if delta.logprobs is not None:
            comp.logprobs += delta.logprobs
        if delta.finish_reason:
            comp.finish_reason = delta.finish_reason
            del live[key]
            if not reason:  # a stop string ended it: the engine still holds this sample
                self.engine.abort(rid, idx)
            out.finished = all(c.finish_reason for c in out.outputs)
