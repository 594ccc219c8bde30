"""/tokenize, /detokenize and /apply-template (vLLM's shapes; llama.cpp's `content` accepted for `prompt`).
Messages go through chat's own rendering (ChatServing.render: tools, template kwargs, the generation prompt
or the open final message), so what these show is what a chat request with the same fields sends the model."""
from __future__ import annotations

from ..base.errors import bad_request
from ..base.served_model import ServedModel
from ..chat.serving import ChatServing
from .protocol import (DetokenizeRequest, DetokenizeResponse, TemplateRequest, TemplateResponse, TokenizeRequest,
                       TokenizeResponse, TokenizerInfo)


class TokenServing:
    def __init__(self, model: ServedModel, chat: ChatServing):
        self.model, self.chat = model, chat

    async def tokenize(self, req: TokenizeRequest) -> TokenizeResponse:
        if req.messages is not None:
            self.model.check_text_size(req.text_bytes(), "messages", factor=4)  # tokenized on the event loop
            ids = await self.chat.prompt_ids(req, self.chat.tool_plan(req))
        else:
            self.model.check_text_size(len(req.text.encode()), "prompt", factor=4)
            ids = self.model.tokenizer.encode(req.text, add_special=req.add_special_tokens is not False,
                                              parse_special=True)
        strs = [self.model.token_text(t)[0] for t in ids] if req.return_token_strs else None
        return TokenizeResponse.model_construct(tokens=ids, count=len(ids), max_model_len=self.model.max_model_len,
                                                **({"token_strs": strs} if strs is not None else {}))

    def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse:
        # The ids never reach the engine (which checks the ids of what it runs), so they are checked here.
        n_vocab = self.model.engine.hparams["n_vocab"]
        for t in req.tokens:
            if not 0 <= t < n_vocab:
                raise bad_request(f"token id {t} is outside the vocabulary [0, {n_vocab})", param="tokens")
        return DetokenizeResponse.model_construct(prompt=self.model.tokenizer.decode(req.tokens, skip_special=False))

    def tokenizer_info(self) -> TokenizerInfo:
        tok, m = self.model.tokenizer, self.model
        special = tok.special_texts()
        pad = m.engine.metadata.get("tokenizer.ggml.padding_token_id")
        pad_text = m.token_text(pad)[0] if isinstance(pad, int) and 0 <= pad < tok.vocab_size else None
        return TokenizerInfo.model_construct(
            tokenizer_class=f"GGUF:{tok.model}", bos_token=special["bos_token"] or None,
            eos_token=special["eos_token"] or None, pad_token=pad_text, add_bos_token=bool(tok.add_bos),
            model_max_length=m.max_model_len, chat_template=m.chat_template)

    async def apply_template(self, req: TemplateRequest) -> TemplateResponse:
        return TemplateResponse.model_construct(prompt=await self.chat.render(req, self.chat.tool_plan(req)))
