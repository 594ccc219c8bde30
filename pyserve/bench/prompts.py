"""Prompts of a set length in the server's tokens: random English words, optionally behind a shared prefix.

Lengths are counted with the server's `POST /tokenize` (vLLM's format) when it has one, else estimated from
characters. Prompts are never reused within a run, so a prefix cache only ever sees the shared prefix."""
from __future__ import annotations

import math
import random
from typing import Optional

# Common English words: random sequences of them make prompts that tokenize at roughly 1-1.5 tokens a word.
WORDS = """
the of and to in is was for on that with as by at from his her he she it they we you this are be had have
not but or an which one all were there been their has when who will more no if out so said what up its about
into than them can only other new some could time these two may then do first any my now such like our over
man me even most made after also did many before must through back years where much your way well down should
because each just those people how too little state good very make world still own see men work long get here
between both life being under never day same another know while last might great old year off come since
against go came right used take three states himself few house use during without again place american around
however home small found thought went say part once general high upon school every does got united left number
course war until always away something fact though water less public put think almost hand enough far took head
yet government system better set told nothing night end why called didn find look going asked later point knew
city next program business give group toward young days let room president side social present given several
order national second possible rather per face among form important often things looked early white case john
become large big need four within felt along children saw best church ever least power development light thing
seemed family interest want members mind country area others done turned although open god service certain kind
problem began different door thus help sense means whole matter perhaps itself york times law human line above
name example action company hands local show whether five history gave today either act feet across taken past
quite anything seen having death experience body word half really field week car words already information
""".split()


class LengthCounter:
    """Counts prompt lengths in the server's tokens (POST /tokenize) or estimates them from characters."""

    def __init__(self, client=None, base_url: str = "", model: str = "", headers=None,
                 chars_per_token: float = 4.0):
        self.client, self.base_url, self.model, self.headers = client, base_url, model, headers or {}
        self.chars_per_token = chars_per_token
        self.use_tokenize = client is not None
        self.max_model_len: Optional[int] = None

    @property
    def unit(self) -> str:
        return "tokens (server /tokenize)" if self.use_tokenize else f"chars/{self.chars_per_token:g}"

    async def probe(self) -> None:
        """Keeps /tokenize only if the server answers it in vLLM's format."""
        if not self.use_tokenize:
            return
        try:
            n = await self._tokenize("Hello world")
            self.use_tokenize = n is not None
        except Exception:
            self.use_tokenize = False

    async def _tokenize(self, text: str) -> Optional[int]:
        resp = await self.client.post(self.base_url + "/tokenize", json={"model": self.model, "prompt": text},
                                      headers=self.headers)
        if resp.status_code != 200:
            return None
        obj = resp.json()
        if not isinstance(obj, dict):
            return None
        if isinstance(obj.get("max_model_len"), int):
            self.max_model_len = obj["max_model_len"]
        if isinstance(obj.get("count"), int):
            return obj["count"]
        if isinstance(obj.get("tokens"), list):
            return len(obj["tokens"])
        return None

    async def count(self, text: str) -> int:
        if self.use_tokenize:
            n = await self._tokenize(text)
            if n is not None:
                return n
            raise RuntimeError("POST /tokenize stopped answering")
        return max(1, math.ceil(len(text) / self.chars_per_token)) if text else 0


class PromptMaker:
    """Random-word prompts of a set length, optionally behind a shared prefix of a set length."""

    def __init__(self, counter: LengthCounter, input_len: int, shared_prefix_len: int = 0, seed: int = 0):
        self.counter, self.input_len, self.prefix_len = counter, input_len, shared_prefix_len
        self.rng = random.Random(seed)
        self.prefix = ""
        self.units_per_word = 1.5 if counter.use_tokenize else 6.0 / counter.chars_per_token
        self.lengths: list[int] = []  # of each prompt made, in the counter's unit

    def _words(self, n: int) -> list[str]:
        return [self.rng.choice(WORDS) for _ in range(n)]

    async def _fit(self, head: str, target: int) -> tuple[str, int]:
        """head + random words, counted as close to `target` as the words allow (never over, when it can)."""
        empty = await self.counter.count(head)
        if target - empty <= 0:
            return head, empty
        text, n = await self._search(head, empty, target)
        text, n = await self._top_up(text, n, target)
        self.units_per_word = max(0.3, (n - empty) / max(1, len(text[len(head):].split())))
        return text, n

    async def _search(self, head: str, empty: int, target: int) -> tuple[str, int]:
        """Up to 8 rounds of adding or cutting words by the count's error; the longest text not over `target`."""
        words = self._words(max(1, round((target - empty) / self.units_per_word)))
        sep = " " if head else ""
        best: Optional[tuple[str, int]] = None
        for _ in range(8):
            text = head + sep + " ".join(words)
            n = await self.counter.count(text)
            if n <= target and (best is None or n > best[1]):
                best = (text, n)
            if n == target:
                break
            per = max(0.5, (n - empty) / max(1, len(words)))
            step = round((target - n) / per) or (1 if n < target else -1)
            if step > 0:
                words += self._words(step)
            else:
                words = words[: max(1, len(words) + step)]
            if n > target and len(words) == 1:
                break
        if best is None:  # even one word is too long: take it anyway
            text = head + sep + words[0]
            best = (text, await self.counter.count(text))
        return best

    async def _top_up(self, text: str, n: int, target: int) -> tuple[str, int]:
        """Short words added one at a time (usually one token each) while the count stays within `target`."""
        for _ in range(4):
            if n >= target:
                break
            cand = text + " a"
            m = await self.counter.count(cand)
            if m > target:
                break
            text, n = cand, m
        return text, n

    async def setup(self) -> None:
        if self.prefix_len:
            self.prefix, _ = await self._fit("", self.prefix_len)

    async def make(self) -> str:
        text, n = await self._fit(self.prefix, self.input_len)
        self.lengths.append(n)
        return text


class PromptSource:
    """Hands out fresh prompts; `fill` makes them ahead of a level, `get` makes more if a level runs past."""

    def __init__(self, maker: PromptMaker):
        self.maker = maker
        self.ready: list[str] = []

    async def fill(self, n: int) -> None:
        while len(self.ready) < n:
            self.ready.append(await self.maker.make())

    async def get(self) -> str:
        if self.ready:
            return self.ready.pop(0)
        return await self.maker.make()
