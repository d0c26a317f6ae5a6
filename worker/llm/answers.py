"""Answers already paid for: a model request answered once in a run is never sent again in that run.

A request's key is a digest of everything that shapes its answer (provider, model, endpoint, messages, system,
options). The `llm` node looks it up before it calls and keeps the answer right after, before the item's outcome
is recorded: so a chunk delivered again after its worker died, an item run again after a later failure, `resume`,
`redrive` and `repair` find the answer instead of paying for it twice. Answers live where the run's state lives
(the run context's `answers`: Redis on a cluster, worker/cluster/state/answers.py; the embedded store locally,
worker/runs/sqlite.py), for the run's TTL.

Across runs only on request: a node's `cache` ("7d") also keeps the answer outside the run for that long, and any
run asking the same request within it reuses it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Protocol

from ir.errors import LineRefused
from worker.llm.providers import Answer, Model, Request


class Answers(Protocol):
    """Where a run's answers live. `find`: this run's answer to `key`, else (with `shared`) one kept across runs;
    `keep`: the answer to `key` for this run, and across runs for `share_for` seconds when given."""

    def find(self, key: str, shared: bool) -> dict[str, Any] | None: ...

    def keep(self, key: str, answer: dict[str, Any], share_for: int | None) -> None: ...

    def known(self, keys: list[str]) -> set[str]:
        """Which of `keys` this run has answers to (one look for them all: a provider batch asks for thousands)."""
        ...


class MemoryAnswers:
    """The answers of a flow run with no record (`compile(...).run(shared)`): this process's, while it runs."""

    def __init__(self) -> None:
        self.kept: dict[str, dict[str, Any]] = {}

    def find(self, key: str, shared: bool) -> dict[str, Any] | None:
        return self.kept.get(key)

    def keep(self, key: str, answer: dict[str, Any], share_for: int | None) -> None:
        self.kept[key] = answer

    def known(self, keys: list[str]) -> set[str]:
        return set(keys) & set(self.kept)


def key_of(model: Model, request: Request) -> str:
    """The digest of what shapes the answer: the model, its provider and endpoint, and the request (its timeout,
    which shapes no answer, left out)."""
    shape = {"provider": model.provider, "model": model.name, **dataclasses.asdict(request)}
    shape.pop("timeout", None)
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()


def to_record(answer: Answer, index: int | None = None) -> dict[str, Any]:
    """What is kept of `answer`; a provider batch's names the item (`index`) whose line it answers."""
    return dataclasses.asdict(answer) | ({} if index is None else {"index": index})


def from_record(record: dict[str, Any], index: int | None = None) -> Answer:
    """A kept answer, as reused: it cost nothing this time; but a provider batch's answer, to the item whose line
    it was (`index`), is that item's call, billed at the batch's price. A line the provider refused (`error`)
    raises LineRefused with the provider's message: the item's error."""
    if "error" in record:
        raise LineRefused(record["error"])
    fields = {k: v for k, v in record.items() if k != "index"}
    if fields.get("batch") and record.get("index") == index:
        return Answer(**fields)
    return Answer(**{**fields, "input_tokens": 0, "output_tokens": 0, "cached": True, "batch": False})
