"""The node-type registry: IR `type` name -> PocketFlow node class, plus plugin loading."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from pocketflow import BaseNode

from ir.errors import NodeTypeError
from worker import settings

_REGISTRY: dict[str, type[BaseNode]] = {}
_loaded_plugins: set[str] = set()


def register(type_name: str) -> Callable[[type[BaseNode]], type[BaseNode]]:
    """Class decorator: make a PocketFlow node class available as IR node type `type_name`."""

    def decorate(cls: type[BaseNode]) -> type[BaseNode]:
        if not (isinstance(cls, type) and issubclass(cls, BaseNode)):
            raise TypeError(f"@register({type_name!r}) expects a pocketflow node class, got {cls!r}")
        cls.type_name = type_name
        _REGISTRY[type_name] = cls
        return cls

    return decorate


def load_plugins(spec: str | None = None) -> None:
    """Import the modules named in CHORDFLOW_PLUGINS (comma-separated) so their @register runs."""
    spec = settings.get("plugins") if spec is None else spec
    for name in (part.strip() for part in spec.split(",")):
        if name and name not in _loaded_plugins:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                raise NodeTypeError(f"CHORDFLOW_PLUGINS: cannot import plugin module '{name}': {exc}") from exc
            _loaded_plugins.add(name)


def get(type_name: str) -> type[BaseNode]:
    load_plugins()
    try:
        return _REGISTRY[type_name]
    except KeyError:
        raise NodeTypeError(f"unknown node type '{type_name}'") from None


def names() -> list[str]:
    load_plugins()
    return sorted(_REGISTRY)


def all_types() -> dict[str, type[BaseNode]]:
    load_plugins()
    return dict(sorted(_REGISTRY.items()))
