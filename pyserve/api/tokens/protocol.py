"""/apply-template, /tokenize, /detokenize and /tokenizer_info: the requests (a chat request's prompt fields,
with chat's types, rules and order) and their replies."""
from __future__ import annotations

from typing import Optional

from pydantic import model_validator

from ..base.errors import bad_request
from ..base.protocol import ReplyModel, RequestModel, TokenId
from ..chat.protocol import ChatPrompt, Messages, ToolChoice, Tools


class TemplateRequest(ChatPrompt):
    """/apply-template: a chat request's prompt fields (chat's types, rules and order), rendered as chat
    renders them."""
    messages: Messages
    model: Optional[str] = None
    parallel_tool_calls: Optional[bool] = None
    tool_choice: ToolChoice = None
    tools: Tools = None
    # vLLM's extras
    chat_template: Optional[str] = None
    chat_template_kwargs: Optional[dict] = None
    add_generation_prompt: bool = True
    continue_final_message: Optional[bool] = None
    add_special_tokens: Optional[bool] = None  # /tokenize: False adds no BOS beyond what the template writes


class TokenizeRequest(TemplateRequest):
    """/tokenize: `prompt` (or llama.cpp's `content`) text, or `messages` (with /apply-template's fields)
    rendered as chat renders them; add_special_tokens applies to both."""
    messages: Optional[Messages] = None
    prompt: Optional[str] = None
    content: Optional[str] = None
    return_token_strs: Optional[bool] = None

    @model_validator(mode="after")
    def _one_input(self):
        if self.messages is None and self.text is None:
            raise bad_request("'prompt' (a string) or 'messages' is required", param="prompt")
        return self

    @property
    def text(self) -> Optional[str]:
        return self.prompt if self.prompt is not None else self.content


class DetokenizeRequest(RequestModel):
    model: Optional[str] = None
    tokens: list[TokenId]


# ---- the replies ----

class TokenizeResponse(ReplyModel):
    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: Optional[list[str]] = None


class DetokenizeResponse(ReplyModel):
    prompt: str


class TemplateResponse(ReplyModel):
    prompt: str


class TokenizerInfo(ReplyModel):
    """vLLM's GET /tokenizer_info (what lm-eval's `tokenizer_backend=remote` reads)."""
    tokenizer_class: str
    bos_token: Optional[str]
    eos_token: Optional[str]
    pad_token: Optional[str]
    add_bos_token: bool
    model_max_length: int
    chat_template: Optional[str]
