"""What the command line and `--models-config FILE` say about the models: the Catalog `pyserve serve` serves.

`--model PATH` or `--model NAME=PATH` (repeatable), `--models-dir DIR`, and a config file of one table per
model (TOML; YAML when PyYAML is installed) whose keys are the engine flags' names (EngineOptions'
`Option.key`: every engine option can be set per model): a flag is the default of every model, a table's key
overrides it for its model.

    [chat]                        # served as "chat"
    path = "gemma-3-270m.gguf"    # relative to this file's folder; without a path the table sets up the
                                  # --models-dir file of its name (chat.gguf)
    aliases = ["gpt-4o-mini"]     # other names it answers to
    ctx_size = 4096
    kv_cache_memory = "256M"      # or num_kv_blocks
    threads = 2
    max_num_seqs = 16
    max_num_batched_tokens = 128
    speculative_ngram = 0         # drafted tokens per step at most (0: no speculative decoding)
    chat_template = "chat.jinja"  # a Jinja file, relative to this file's folder
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from typing import Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

from ..engine.options import BY_KEY, EngineOptions, parse_value
from .model_catalog import Catalog, ModelSpec

_KEYS = ("path", "aliases", "chat_template", *BY_KEY)


def file_stem(path: str) -> str:
    base = os.path.basename(path)
    return base[:-5] if base.lower().endswith(".gguf") else base


def model_arg(text: str) -> ModelSpec:
    """`--model PATH` (served under its file stem) or `--model NAME=PATH`."""
    name, sep, path = text.partition("=")
    if not sep or not name or os.path.exists(text):  # a path may hold "="
        path = text
        name = file_stem(path)
    return ModelSpec(name, os.path.expanduser(path))


def read_models_file(path: str) -> list[ModelSpec]:
    tables = _load(path)
    if not isinstance(tables, dict):
        raise ValueError(f"{path}: expected one table per model")
    base = os.path.dirname(os.path.abspath(path))
    return [_table_spec(str(name), table, base, path) for name, table in tables.items()]


def _load(path: str):
    with open(path, "rb") as f:
        data = f.read()
    if path.lower().endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise ValueError(f"{path}: reading YAML needs PyYAML (pip install pyyaml); or write it in TOML") from None
        try:
            return yaml.safe_load(data) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: {e}") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: {e}") from None


def _table_spec(name: str, table, base: str, path: str) -> ModelSpec:
    where = f"{path}: [{name}]"
    if not isinstance(table, dict):
        raise ValueError(f"{where} is not a table of settings")
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(_KEYS)})")
    engine = _table_engine(table, where)
    aliases = table.get("aliases", [])
    aliases = [aliases] if isinstance(aliases, str) else aliases
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise ValueError(f"{where}: aliases must be a list of names")
    template = None
    if "chat_template" in table:
        with open(os.path.join(base, os.path.expanduser(str(table["chat_template"]))), encoding="utf-8") as f:
            template = f.read()
    model_path = os.path.join(base, os.path.expanduser(str(table["path"]))) if table.get("path") else ""
    return ModelSpec(name, model_path, tuple(aliases), engine, template)


def _table_engine(table: dict, where: str) -> dict:
    """The engine options a table sets (EngineOptions fields), checked by EngineOptions' own rules."""
    try:
        engine = {f.name: parse_value(f, table[key]) for key, f in BY_KEY.items() if key in table}
        EngineOptions(**engine)
    except ValueError as e:  # the engine's message names the field: the table spells it as its key
        first, _, rest = str(e).partition(" ")
        field = first.rstrip(":")
        key = next((k for k, f in BY_KEY.items() if f.name == field), field)
        raise ValueError(f"{where}: {key}{first[len(field):]} {rest}") from None
    return engine


def build_catalog(models: list[str], models_dir: Optional[str], models_config: Optional[str],
                  served_names: list[str], engine: EngineOptions) -> Catalog:
    """The catalog, its files' headers read. Runs off the event loop: without any model given, the default
    model's file is assembled (and checked) from its package."""
    fixed = [model_arg(m) for m in models]
    config = read_models_file(models_config) if models_config else []
    fixed += [s for s in config if s.path]
    settings = {s.name: s for s in config if not s.path}
    if models_dir is not None and not os.path.isdir(models_dir):
        raise ValueError(f"--models-dir {models_dir}: not a folder")
    if settings and models_dir is None:
        raise ValueError(f"{models_config}: [{next(iter(settings))}] has no path, and there is no --models-dir")
    if not fixed and models_dir is None:
        from ..engine.model_source import resolve_model

        fixed = [model_arg(resolve_model(None))]
    if served_names:
        if len(fixed) != 1 or models_dir is not None or config:
            raise ValueError("--served-model-name names the one --model; with several models use --model "
                             "NAME=PATH, or aliases in --models-config")
        fixed[0] = replace(fixed[0], name=served_names[0], aliases=tuple(served_names[1:]))
    catalog = Catalog(fixed, models_dir, settings, engine)
    catalog.refresh()
    return catalog
