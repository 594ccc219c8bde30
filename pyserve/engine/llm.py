"""LLM: the offline API (shaped like vLLM's). Many prompts run through the engine's scheduler at once."""
from __future__ import annotations

import itertools
import time
from types import MappingProxyType
from typing import TYPE_CHECKING, Iterable, Mapping, Optional, Sequence, Union

from .engine_request import EngineRequest, PromptType, prompt_ids
from .model_load import load_model
from .model_source import resolve_model
from .options import EngineOptions
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams
from .speculative import speculation
from .structured import GrammarCompiler

if TYPE_CHECKING:  # numpy is imported where a vector is made: a server that makes none does not pay 35 ms
    import numpy as np


class LLM:
    """A model loaded into the C++ engine, with its tokenizer.

    LLM(model=None) loads the default model; `model` is a GGUF path otherwise. Engine options: an
    EngineOptions (`options`), and/or its fields as keywords over it (pyserve/engine/options.py: n_threads,
    n_ctx, num_kv_blocks / kv_cache_memory, block_size, max_num_seqs, max_num_batched_tokens,
    enable_prefix_caching, target_itl, speculative_ngram, speculative_method, …); vLLM's
    speculative_config={"method": "ngram" | "mtp", "num_speculative_tokens": K} sets the last two. Unknown names: TypeError; bad values: ValueError.
    """

    def __init__(self, model: Optional[str] = None, *, options: Optional[EngineOptions] = None,
                 speculative_config: Optional[dict] = None, **engine_options):
        options = (options or EngineOptions()).replace(**engine_options)
        if speculative_config is not None:
            options = options.replace(**speculation(speculative_config))
        t0 = time.perf_counter()
        self.model_path = resolve_model(model)
        t_resolve = time.perf_counter() - t0
        loaded = load_model(self.model_path, options.as_dict())  # the engine and the tokenizer side by side
        self.engine = loaded.engine
        # the file's header, converted once, without the vocabulary's arrays (~260k strings); read-only
        self._metadata = MappingProxyType(loaded.metadata)
        self._hparams = MappingProxyType(self.engine.hparams)
        self.tokenizer = loaded.tokenizer
        self.engine.eos_ids = list(self.tokenizer.eos_ids)
        # phase -> seconds of this load (model_load.py), and where the tokenizer came from; logged by the server
        self.load_times = {"resolve": t_resolve, **loaded.times, "total": time.perf_counter() - t0}
        self.tokenizer_source = loaded.tokenizer_source
        self.calibration_source = loaded.calibration_source
        self.weights_source = loaded.weights_source
        self.grammars = GrammarCompiler(self.tokenizer, self._hparams["n_vocab"])
        self._ids = itertools.count()

    def load_summary(self) -> str:
        """This load's phases for a log line: "resolve 0.00 s, header 0.05 s, engine 0.28 s (weights mapped) |
        tokenizer 0.61 s (cached), calibrate 0.90 s (measured), total 1.60 s" (the engine's
        weights and the tokenizer load side by side, then the engine calibrates: model_load.py)."""
        t = self.load_times
        return (f"resolve {t['resolve']:.2f} s, header {t['header']:.2f} s, engine {t['engine']:.2f} s "
                f"(weights {self.weights_source}) | "
                f"tokenizer {t['tokenizer']:.2f} s ({self.tokenizer_source}), calibrate {t['calibrate']:.2f} s "
                f"({self.calibration_source}), total {t['total']:.2f} s" +
                (f", begun at start-up (waited {t['waited']:.2f} s)" if "waited" in t else ""))

    # What the layers above read of the loaded model (they never reach into the native engine).
    @property
    def config(self) -> dict:
        """The engine's options as it resolved them (n_threads, n_ctx, num_kv_blocks filled in)."""
        return self.engine.config

    @property
    def options(self) -> EngineOptions:
        return EngineOptions.from_config(self.engine.config)

    @property
    def hparams(self) -> Mapping:
        return self._hparams

    @property
    def metadata(self) -> Mapping:
        """The GGUF header's key-value pairs (read-only), but for arrays of more than 4096 elements (the
        vocabulary's tokens, scores, types and merges: the tokenizer has them)."""
        return self._metadata

    @property
    def max_model_len(self) -> int:
        """Tokens one sequence can reach: min(context, the KV pool)."""
        return self.engine.max_model_len

    def stats(self) -> dict:
        return self.engine.stats()

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """The ids `generate` runs for this text (engine_request.py's rule: control tokens written in it are
        parsed) unless parse_special=False (then they are their letters)."""
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
                for o in self.engine.step():
                    key = (o.request_id, o.index)
                    if key in live and o.prompt_logprobs is not None:
                        live[key][0].prompt_logprobs = o.prompt_logprobs
                    self._apply(live, key, o)
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
        (of every token's), L2-normalised if `normalize`; "rank": [1] a reranker's relevance score. Raises
        ValueError, queueing nothing, if any is refused."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        ids = [prompt_ids(self.tokenizer, p)[1] for p in prompts]
        for i in ids:
            self.engine.check_embed(i, pooling, normalize)
        rids = [str(next(self._ids)) for _ in ids]
        for rid, i in zip(rids, ids):
            self.engine.add_embed(rid, i, pooling, normalize)
        vectors: dict[str, np.ndarray] = {}
        try:
            while len(vectors) < len(rids):
                for o in self.engine.step():
                    if o.finish_reason != "stop":  # an abort (this engine is not shared while embed runs)
                        raise RuntimeError(f"embedding request {o.request_id} ended: {o.finish_reason}")
                    vectors[o.request_id] = o.embedding
        finally:
            for rid in rids:
                if rid not in vectors:
                    self.engine.abort(rid)
            while self.engine.has_work():
                self.engine.step()
        return [vectors[rid] for rid in rids]

    def _add(self, prompt: PromptType, params: SamplingParams) -> tuple[RequestOutput, list]:
        so = params.structured_outputs
        req = EngineRequest.build(self.tokenizer, prompt, params, self.grammars.compile(so) if so else None)
        out = RequestOutput(request_id=str(next(self._ids)), prompt=req.prompt, prompt_token_ids=req.prompt_token_ids,
                            outputs=[])
        req.submit(self.engine, out.request_id)
        subs = []
        for i, state in enumerate(req.sample_states(self.tokenizer)):
            out.outputs.append(CompletionOutput(index=i, logprobs=[] if params.logprobs is not None else None))
            subs.append(((out.request_id, i), state))
        return out, subs

    def _apply(self, live: dict, key: tuple[str, int], o) -> None:
        entry = live.get(key)
        if entry is None:
            return
        out, state = entry
        rid, idx = key
        reason = o.finish_reason
        delta = state.process(o.token, o.logprob, o.top, reason)
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
