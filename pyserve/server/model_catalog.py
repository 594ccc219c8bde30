"""The models a server can serve, by name: the ones it was given (`--model`, `--models-config` tables with a
path) and every `*.gguf` of `--models-dir`, looked at again on each `refresh` (a file dropped into the folder
is served without a restart; one removed is gone).

Each model's facts come from its GGUF header (the engine's parser, no weights read), once per version of the
file (its size and mtime): the context it will serve, the memory it will hold at most, and, for a file the
engine cannot load, why. A split model (`NAME-00001-of-00003.gguf` …) is one entry, listed as unavailable:
the engine loads single files.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Optional

from ..engine.options import EngineOptions

SPLIT = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<total>\d{5})$")


@dataclass
class ModelSpec:
    name: str
    path: str  # the GGUF file ("" in a --models-config table without one: the --models-dir file of that name)
    aliases: tuple[str, ...] = ()
    engine: dict = field(default_factory=dict)  # EngineOptions fields over the flags' (n_ctx, n_threads, …)
    chat_template: Optional[str] = None  # the template's source; None: the server's default
    parts: int = 1  # files of a split model


@dataclass
class ModelFacts:
    signature: Optional[tuple] = None  # (size, mtime_ns) of the file they were read from; None: no file
    max_model_len: int = 0  # tokens a sequence may hold, as the engine will compute it
    memory: int = 0  # bytes it holds once loaded, at most: the file (the weights, resident once) + its KV pool
    created: int = 0  # the file's mtime (s)
    architecture: Optional[str] = None  # general.architecture, read with the geometry
    error: str = ""  # why it cannot be loaded; "" if it may be


class Catalog:
    """Names (and aliases) → ModelSpec and ModelFacts. `refresh` runs off the event loop (it reads headers);
    lookups read the maps it last swapped in."""

    def __init__(self, fixed: list[ModelSpec], models_dir: Optional[str] = None,
                 settings: Optional[dict[str, ModelSpec]] = None, engine: Optional[EngineOptions] = None):
        self.models_dir = models_dir
        self.engine = engine or EngineOptions.serving()  # the flags' engine options, the default of every model's
        self._fixed = fixed
        self._settings = settings or {}  # --models-config tables without a path, by the folder file they set up
        self._specs: dict[str, ModelSpec]
        self._names: dict[str, str]  # every name and alias → the model's name
        self._specs, self._names = self._index(fixed, strict=True)
        self._facts: dict[str, ModelFacts] = {}  # by model name

    def refresh(self) -> None:
        """Reads the folder again, and the header of every file that is new or changed."""
        specs, names = self._index(self._fixed + self._folder(), strict=False)
        old = self._facts
        facts = {}
        for name, spec in specs.items():
            facts[name] = self._read(spec, old.get(name))
        self._specs, self._names, self._facts = specs, names, facts

    def _index(self, specs: list[ModelSpec], strict: bool) -> tuple[dict, dict]:
        """The specs by name and their names; a name given twice is an error among the given models
        (`strict`), and a folder file whose name is taken is not served."""
        by_name, names = {}, {}
        for spec in specs:
            taken = [n for n in (spec.name, *spec.aliases) if n in names]
            if taken and strict:
                raise ValueError(f"two models answer to {taken[0]!r} ({by_name[names[taken[0]]].path} and "
                                 f"{spec.path}): name them with NAME=PATH or aliases")
            if not taken:
                by_name[spec.name] = spec
                names.update((n, spec.name) for n in (spec.name, *spec.aliases))
        return by_name, names

    def _folder(self) -> list[ModelSpec]:
        """A spec per model file of the folder (a split model's first file stands for it)."""
        if self.models_dir is None:
            return []
        stems: dict[str, list[str]] = {}
        for entry in sorted(os.listdir(self.models_dir)):
            if entry.startswith(".") or not entry.lower().endswith(".gguf"):
                continue
            m = SPLIT.match(entry[:-5])
            stems.setdefault(m.group("stem") if m else entry[:-5], []).append(entry)
        out = []
        for stem, files in stems.items():
            given = self._settings.get(stem)
            spec = ModelSpec(stem, os.path.join(self.models_dir, files[0]), given.aliases if given else (),
                             given.engine if given else {}, given.chat_template if given else None, len(files))
            out.append(spec)
        return out

    def _read(self, spec: ModelSpec, known: Optional[ModelFacts]) -> ModelFacts:
        try:
            st = os.stat(spec.path)
        except OSError:
            return ModelFacts(error=f"model file not found: {spec.path}")
        signature = (st.st_size, st.st_mtime_ns)
        if known is not None and known.signature == signature:
            return known
        if spec.parts > 1:
            return ModelFacts(signature, error=f"a split GGUF ({spec.parts} files) cannot be loaded: merge it into "
                                               f"one file (llama-gguf-split --merge)")
        try:
            kv = self.options(spec).kv_geometry(spec.path)  # the engine's own rule, from the header
        except (ValueError, TypeError, OSError) as e:  # GGUFError and ModelError are ValueErrors
            return ModelFacts(signature, error=str(e) or type(e).__name__)
        return ModelFacts(signature, kv["max_model_len"], st.st_size + kv["num_kv_blocks"] * kv["bytes_per_block"],
                          int(st.st_mtime), architecture=kv["hparams"]["arch"])

    # ---- lookups ----

    @property
    def dynamic(self) -> bool:
        """Whether a name unknown now may be known after a refresh."""
        return self.models_dir is not None

    def resolve(self, name: str) -> Optional[str]:
        """The name of the model answering to `name` (itself or an alias), or None."""
        return self._names.get(name)

    def names(self) -> list[str]:
        return list(self._specs)

    def spec(self, name: str) -> Optional[ModelSpec]:
        return self._specs.get(name)

    def facts(self, name: str) -> ModelFacts:
        return self._facts.get(name) or ModelFacts(error="not read yet")

    def options(self, spec: ModelSpec) -> EngineOptions:
        """The engine options it is loaded with: the flags', its table's over them."""
        return self.engine.replace(**spec.engine)
