"""The response store: past Responses kept in memory so that `previous_response_id` can chain on them and
GET/DELETE /v1/responses/{id} can read them. Bounded by count and by bytes (the oldest goes first) and by age;
each entry belongs to an owner (a hash of the caller's API key, None on a server without keys) and no other owner can
see it: a lookup by another owner is the same 404 as an unknown id."""
from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

from ..base.errors import OpenAIError, bad_request


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
    nbytes: int = 0  # its size as JSON (what the byte bound counts)
    background: bool = False  # created with background=true: /cancel applies to it


def not_found(rid: str, param: Optional[str] = None, code: Optional[str] = None) -> OpenAIError:
    return OpenAIError(f"Response with id {rid!r} not found.", 404, "invalid_request_error", param, code)


def _json_size(*parts) -> int:
    return sum(len(json.dumps(p, default=str)) for p in parts)


class ResponseStore:
    def __init__(self, size: int = 1000, ttl: float = 3600.0, max_bytes: int = 256 << 20):
        self.size, self.ttl, self.max_bytes = size, ttl, max_bytes
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first
        self._bytes = 0  # the entries' nbytes summed

    @property
    def enabled(self) -> bool:
        return self.size > 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def put(self, owner: Optional[str], response: dict, messages: list, input_items: list,
            background: bool = False) -> None:
        """Stores (or replaces) a response; the oldest entries go while the count or the bytes are over."""
        if not self.enabled:
            return
        self._expire()
        self._drop(response["id"])
        entry = StoredResponse(owner, response, messages, input_items, time.monotonic(),
                               _json_size(response, messages, input_items), background)
        self._items[response["id"]] = entry
        self._bytes += entry.nbytes
        while len(self._items) > self.size or (self._bytes > self.max_bytes and len(self._items) > 1):
            self._drop(next(iter(self._items)))

    def replace(self, rid: str, response: dict, messages: Optional[list] = None) -> None:
        """A background response's new state (in_progress, completed, failed, cancelled) and, once it has an
        output, its conversation; nothing where it is no longer kept (deleted, evicted)."""
        entry = self._items.get(rid)
        if entry is not None:
            self.put(entry.owner, response, entry.messages if messages is None else messages, entry.input_items,
                     entry.background)

    def get(self, owner: Optional[str], rid: str, param: Optional[str] = None,
            code: Optional[str] = None) -> StoredResponse:
        self._expire()
        entry = self._items.get(rid)
        if entry is None or entry.owner != owner:
            raise not_found(rid, param, code)
        return entry

    def delete(self, owner: Optional[str], rid: str) -> dict:
        self.get(owner, rid)
        self._drop(rid)
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
            self._drop(rid)

    def _drop(self, rid: str) -> None:
        entry = self._items.pop(rid, None)
        if entry is not None:
            self._bytes -= entry.nbytes
