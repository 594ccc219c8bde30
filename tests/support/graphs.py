"""Cycles in a dependency graph, for the house tests of csrc/'s folders and pyserve/'s packages."""
from __future__ import annotations


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The nodes that reach each other around a loop: the strongly connected components of more than one
    node (Tarjan's algorithm), each sorted, in the order they close."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out
