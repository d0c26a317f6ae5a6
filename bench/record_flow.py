"""The dataset bench's workflow as a user writes it with PocketFlow alone: two nodes, one edge
(bench/stock_group.py: the stock Celery group's tasks run it per record).

`python -m bench.record_flow FILE OUT`: the local baseline, a plain loop reading the records file line by line,
each record through the flow on a store of its own, its row written to OUT as `chordflow results --out`
writes it. It imports json and pocketflow only, so its start-up is an interpreter's.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pocketflow import Flow, Node


class EchoRecord(Node):
    """`a`: the record's id and text into `shared["a"]`."""

    def prep(self, shared: dict[str, Any]) -> Any:
        return shared["record"]

    def post(self, shared: dict[str, Any], prep_res: Any, exec_res: Any) -> None:
        shared["a"] = {"id": prep_res["id"], "text": prep_res["text"]}


class EchoId(Node):
    """`b`: a's id into `shared["b"]`."""

    def prep(self, shared: dict[str, Any]) -> Any:
        return shared["a"]["id"]

    def post(self, shared: dict[str, Any], prep_res: Any, exec_res: Any) -> None:
        shared["b"] = {"n": prep_res}


def record_flow() -> Flow:
    first = EchoRecord()
    first >> EchoId()
    return Flow(start=first)


def one_record(flow: Flow, record: dict[str, Any]) -> dict[str, Any]:
    """One record through the flow on a store of its own; the workflow's output `{id: b.n}`."""
    shared = {"record": record}
    flow.run(shared)
    return {"id": shared["b"]["n"]}


def main(path: str, out: str) -> int:
    flow = record_flow()
    with open(path, encoding="utf-8") as f, open(out, "w", encoding="utf-8") as rows:
        for index, line in enumerate(f):
            rows.write(json.dumps({"index": index, "result": one_record(flow, json.loads(line)), "error": None}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
