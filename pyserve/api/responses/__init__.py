"""OpenAI's Responses API (/v1/responses): a request translated into a chat request and served by the chat
serving, the reply translated back; stored responses and background generation."""
