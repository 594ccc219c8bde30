"""Anthropic's Messages API (/v1/messages), served by translating to and from the chat serving."""
