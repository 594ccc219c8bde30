"""The response store's bounds (count, bytes, age) and its background states, on the real store."""
import json

from pyserve.api.responses.store import ResponseStore


def _resp(rid: str, text: str = "x") -> dict:
    return {"id": rid, "object": "response", "status": "completed", "output": [{"text": text}]}


def _size(resp, messages, items) -> int:
    return sum(len(json.dumps(p)) for p in (resp, messages, items))


def test_bytes_bound_drops_the_oldest():
    one = _size(_resp("r0", "a" * 1000), [{"content": "q"}], [])
    store = ResponseStore(size=100, ttl=3600, max_bytes=int(2.5 * one))
    for i in range(4):
        store.put(None, _resp(f"r{i}", "a" * 1000), [{"content": "q"}], [])
    assert store.nbytes == 2 * one and store.nbytes <= store.max_bytes
    assert [store.get(None, f"r{i}").response["id"] for i in (2, 3)] == ["r2", "r3"]
    for i in (0, 1):
        try:
            store.get(None, f"r{i}")
        except Exception as e:  # noqa: BLE001 - the 404 OpenAIError
            assert getattr(e, "status", None) == 404
        else:
            raise AssertionError(f"r{i} kept past the byte bound")


def test_one_entry_larger_than_the_bound_is_still_kept_alone():
    store = ResponseStore(size=10, ttl=3600, max_bytes=10)
    store.put(None, _resp("big", "b" * 500), [], [])
    assert store.get(None, "big").response["id"] == "big" and len(store.get(None, "big").response["output"]) == 1


def test_replace_keeps_owner_and_accounts_bytes():
    store = ResponseStore(size=10, ttl=3600)
    store.put("owner-a", {**_resp("r"), "status": "queued", "output": []}, [{"content": "q"}], [{"id": "i"}],
              background=True)
    before = store.nbytes
    store.replace("r", _resp("r", "done" * 50), [{"content": "q"}, {"content": "done"}])
    entry = store.get("owner-a", "r")
    assert entry.background and entry.owner == "owner-a" and entry.response["status"] == "completed"
    assert entry.messages[-1] == {"content": "done"} and entry.input_items == [{"id": "i"}]
    assert store.nbytes == entry.nbytes > before
    store.delete("owner-a", "r")
    assert store.nbytes == 0
    store.replace("r", _resp("r"))  # gone: nothing comes back
    assert store.nbytes == 0
