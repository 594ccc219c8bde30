"""One greedy request through an `_engine.Engine`, stepped to its end: what the prefix-cache tests compare."""
from __future__ import annotations

GREEDY = {"temperature": 0.0}


def greedy_run(eng, rid: str, tokens: list[int], salt: str = "", max_tokens: int = 4) -> tuple[list[int], int]:
    """Adds the request (its cache salt `salt`) and steps until the engine is idle -> (the tokens drawn, the
    prompt tokens the prefix cache served)."""
    eng.add(rid, tokens, GREEDY, max_tokens, True, cache_salt=salt)
    out, cached = [], None
    while eng.has_work():
        for o in eng.step():
            out += [o.token] if o.token >= 0 else []
            cached = o.n_cached
    return out, cached
