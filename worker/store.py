"""NamespacedStore: a node's view of the shared store.

Writes go to `shared[node_id][key]` (dunder keys `__x__` go to the root); reads look in the node's
namespace first, then the root. This keeps nodes from clobbering each other's keys.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any


def is_dunder(key: Any) -> bool:
    return isinstance(key, str) and len(key) > 4 and key.startswith("__") and key.endswith("__")


class NamespacedStore(MutableMapping):
    __slots__ = ("namespace", "node_id", "root")

    def __init__(self, root: MutableMapping, node_id: str):
        self.root = root
        self.node_id = node_id
        namespace = root.get(node_id)
        if namespace.__class__ is not dict and not isinstance(namespace, dict):
            namespace = root[node_id] = {}
        self.namespace = namespace

    def __getitem__(self, key: Any) -> Any:
        if key in self.namespace:
            return self.namespace[key]
        return self.root[key]

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self.namespace:
            return self.namespace[key]
        return self.root.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.namespace or key in self.root

    def __setitem__(self, key: Any, value: Any) -> None:
        if key.__class__ is str and key[:2] != "__":  # most writes: a plain key, no is_dunder call
            self.namespace[key] = value
        elif is_dunder(key):
            self.root[key] = value
        else:
            self.namespace[key] = value

    def __delitem__(self, key: Any) -> None:
        if key in self.namespace:
            del self.namespace[key]
        else:
            del self.root[key]

    def __iter__(self) -> Iterator[Any]:
        yield from self.namespace
        yield from (k for k in self.root if k not in self.namespace)

    def __len__(self) -> int:
        return sum(1 for _ in self)
