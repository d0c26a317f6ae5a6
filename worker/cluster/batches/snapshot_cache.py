"""A worker process's decoded snapshots, bounded by their size rather than their number.

A snapshot stored by reference (above the inline threshold) is fetched and decoded once per process and
shared by every chunk of its batch that the process runs. Eight 200 MB snapshots would hold gigabytes;
the budget counts each snapshot's encoded bytes (a stand-in for its decoded size, which Python cannot
measure cheaply) and drops the least recently used first. A snapshot bigger than the whole budget is
decoded for its chunk and not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class SnapshotCache:
    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self.used = 0
        self._entries: OrderedDict[str, tuple[int, Any]] = OrderedDict()

    def get(self, key: str, fetch: Callable[[], bytes], decode: Callable[[bytes], Any]) -> Any:
        """The decoded snapshot under `key`, fetching and decoding it on a miss."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry[1]
        blob = fetch()
        value = decode(blob)
        if len(blob) <= self.budget:
            self._entries[key] = (len(blob), value)
            self.used += len(blob)
            while self.used > self.budget:
                size, _ = self._entries.popitem(last=False)[1]
                self.used -= size
        return value

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
