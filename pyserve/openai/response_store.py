"""The response store: past Responses kept in memory so that `previous_response_id` can chain on them and
GET/DELETE /v1/responses/{id} can read them. Bounded by count (the oldest goes first) and by age; each entry
belongs to an owner (a hash of the caller's API key, None on a server without keys) and no other owner can
see it: a lookup by another owner is the same 404 as an unknown id."""
from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

from .errors import OpenAIError, bad_request


def owner_of(key: Optional[str]) -> Optional[str]:
    """The owner a key stands for: its SHA-256 (the key itself is never kept)."""
    return None if key is None else hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class StoredResponse:
    owner: Optional[str]
    response: dict  # the Response object as returned
    messages: list  # the conversation as chat messages (prior turns, this input, the output), no system prompt
    input_items: list  # this request's input as Responses items (for /input_items)
    stored_at: float  # time.monotonic()


def not_found(rid: str, param: Optional[str] = None, code: Optional[str] = None) -> OpenAIError:
    return OpenAIError(f"Response with id {rid!r} not found.", 404, "invalid_request_error", param, code)


class ResponseStore:
    def __init__(self, size: int = 1000, ttl: float = 3600.0):
        self.size, self.ttl = size, ttl
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def put(self, owner: Optional[str], response: dict, messages: list, input_items: list) -> None:
        if not self.enabled:
            return
        self._expire()
        self._items[response["id"]] = StoredResponse(owner, response, messages, input_items, time.monotonic())
        self._items.move_to_end(response["id"])
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def get(self, owner: Optional[str], rid: str, param: Optional[str] = None,
            code: Optional[str] = None) -> StoredResponse:
        self._expire()
        entry = self._items.get(rid)
        if entry is None or entry.owner != owner:
            raise not_found(rid, param, code)
        return entry

    def delete(self, owner: Optional[str], rid: str) -> dict:
        self.get(owner, rid)
        del self._items[rid]
        return {"id": rid, "object": "response.deleted", "deleted": True}

    def input_list(self, owner: Optional[str], rid: str, order: str = "desc") -> dict:
        """/v1/responses/{id}/input_items: the stored input items, newest first unless order=asc."""
        if order not in ("asc", "desc"):
            raise bad_request("order must be 'asc' or 'desc'", param="order")
        items = list(self.get(owner, rid).input_items)
        if order == "desc":
            items.reverse()
        return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
                "last_id": items[-1]["id"] if items else None, "has_more": False}

    def previous(self, owner: Optional[str], rid: str) -> list:
        """The stored conversation `previous_response_id` names (400 with the store off, 404 unknown)."""
        if not self.enabled:
            raise bad_request("previous_response_id needs the response store, which this server runs without "
                              "(--response-store-size 0)", param="previous_response_id")
        return self.get(owner, rid, "previous_response_id", "previous_response_not_found").messages

    def _expire(self) -> None:
        limit = time.monotonic() - self.ttl
        while self._items:
            rid, entry = next(iter(self._items.items()))
            if entry.stored_at >= limit:
                return
            del self._items[rid]
