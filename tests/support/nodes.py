"""Node types used by the test suite, loaded as a plugin: CHORDFLOW_PLUGINS=tests.support.nodes.

Workers started by the tests import this module too, so every type must work in another process.
Nodes that keep module-level state (`FLAKY_ATTEMPTS`, `RECORDS`, `PROBE`, `REVERSE`, `EVENT`) are only
inspected by in-process tests; batch tests that go through `scheduler.run` read results from the store.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pocketflow import Node

from worker.nodes import register

WAIT_TIMEOUT_S = 10.0  # how long a gated node waits before giving up (a failure, never a synchronization)

_lock = threading.Lock()

# test-flaky: attempts so far, keyed by item (str(item)). Tests use unique items (uuid prefix).
FLAKY_ATTEMPTS: dict[str, int] = {}


@dataclass
class Call:
    """One execution of `test-record`: the item's index and item, the store it ran on, and what the probe saw."""

    index: Any
    item: Any
    store: Any
    observed: Any = None


# test-record: every execution, in the order they happened.
RECORDS: list[Call] = []
# test-record: an optional callable run at each execution; its return value lands in Call.observed.
OBSERVER: dict[str, Callable[[], Any] | None] = {"fn": None}


class ConcurrencyProbe:
    """State of `test-concurrency`: how many items are inside exec at once, the peak, and which threads ran them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.peak = 0
        self.threads: set[int] = set()
        self.barrier: threading.Barrier | None = None

    def reset(self, parties: int | None = None) -> None:
        with self.lock:
            self.active = 0
            self.peak = 0
            self.threads = set()
            self.barrier = threading.Barrier(parties) if parties else None


PROBE = ConcurrencyProbe()


class ReverseGate:
    """State of `test-reverse`: item i may finish only after every item with a higher index finished."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.finished: list[int] = []

    def reset(self) -> None:
        with self.cond:
            self.finished = []


REVERSE = ReverseGate()


class HoldGate:
    """State of `test-wait-event`: items wait inside exec until `set()`; `waiting` counts those that arrived."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.waiting = 0
        self.open = False

    def clear(self) -> None:
        with self.cond:
            self.waiting, self.open = 0, False

    def set(self) -> None:
        with self.cond:
            self.open = True
            self.cond.notify_all()


EVENT = HoldGate()


def reset() -> None:
    """Forget all module-level state (called before every test by conftest)."""
    with _lock:
        FLAKY_ATTEMPTS.clear()
        RECORDS.clear()
        OBSERVER["fn"] = None
    PROBE.reset()
    REVERSE.reset()
    EVENT.clear()


def recorded() -> list[tuple[Any, Any]]:
    """(index, item) of every `test-record` execution so far, in execution order."""
    with _lock:
        return [(c.index, c.item) for c in RECORDS]


class _ParamNode(Node):
    """prep hands the (already template-resolved) params to exec, plus the store where needed."""

    def prep(self, shared: Any) -> dict[str, Any]:
        return dict(self.params)


@register("test-upper")
class UpperNode(_ParamNode):
    """Writes `value` = param `text` upper-cased."""

    def exec(self, prep_res: dict[str, Any]) -> str:
        return str(prep_res["text"]).upper()

    def post(self, shared: Any, prep_res: Any, exec_res: str) -> str:
        shared["value"] = exec_res
        return "default"


@register("test-fail")
class FailNode(_ParamNode):
    """Raises ValueError(f"boom {value}") when param `fail` is truthy or `value` equals param `fail_on`;
    otherwise writes `value` unchanged."""

    def exec(self, prep_res: dict[str, Any]) -> Any:
        value = prep_res.get("value")
        if prep_res.get("fail") or ("fail_on" in prep_res and value == prep_res["fail_on"]):
            raise ValueError(f"boom {value}")
        return value

    def post(self, shared: Any, prep_res: Any, exec_res: Any) -> str:
        shared["value"] = exec_res
        return "default"


@register("test-flaky")
class FlakyNode(_ParamNode):
    """Fails (ConnectionError) the first `fails` attempts for its `item`, then writes `value` and `attempts`.

    Attempts are counted per item in FLAKY_ATTEMPTS under a lock: items may run in threads.
    """

    def exec(self, prep_res: dict[str, Any]) -> dict[str, Any]:
        item = prep_res["item"]
        key = str(item)
        with _lock:
            attempt = FLAKY_ATTEMPTS[key] = FLAKY_ATTEMPTS.get(key, 0) + 1
        if attempt <= int(prep_res.get("fails", 2)):
            raise ConnectionError(f"flaky {item} attempt {attempt}")
        return {"value": item, "attempts": attempt}

    def post(self, shared: Any, prep_res: Any, exec_res: dict[str, Any]) -> str:
        shared["value"] = exec_res["value"]
        shared["attempts"] = exec_res["attempts"]
        return "default"


@register("test-error-string")
class ErrorStringNode(_ParamNode):
    """Writes `value` = "Error: <value> is bad" (for every item, or only when `value` equals `error_on`)."""

    def exec(self, prep_res: dict[str, Any]) -> Any:
        value = prep_res.get("value")
        if "error_on" not in prep_res or value == prep_res["error_on"]:
            return f"Error: {value} is bad"
        return value

    def post(self, shared: Any, prep_res: Any, exec_res: Any) -> str:
        shared["value"] = exec_res
        return "default"


@register("test-error-action")
class ErrorActionNode(_ParamNode):
    """Writes `value` and returns the action "error" (always, or only when `value` equals `error_on`)."""

    def post(self, shared: Any, prep_res: dict[str, Any], exec_res: Any) -> str:
        value = prep_res.get("value")
        shared["value"] = value
        if "error_on" not in prep_res or value == prep_res["error_on"]:
            return "error"
        return "default"


@register("test-none")
class NoneNode(Node):
    """exec returns None and nothing is written: a legitimate empty result."""

    def exec(self, prep_res: Any) -> None:
        return None


@register("test-llm-calls")
class LlmCallsNode(_ParamNode):
    """Appends {"index", "item"} to the store's `__llm_calls__` list (when there is one), writes `value`.

    With param `fail_on` equal to `item`, raises ValueError(f"boom {item}") right after appending (a call that
    was made, then failed).
    """

    def prep(self, shared: Any) -> dict[str, Any]:
        return {"params": dict(self.params), "calls": shared.get("__llm_calls__"), "index": shared.get("__index__")}

    def post(self, shared: Any, prep_res: dict[str, Any], exec_res: Any) -> str:
        item = prep_res["params"].get("item")
        calls = prep_res["calls"]
        if calls is not None:
            shared.get("__llm_calls__").append({"index": prep_res["index"], "item": item})
        if "fail_on" in prep_res["params"] and item == prep_res["params"]["fail_on"]:
            raise ValueError(f"boom {item}")
        shared["value"] = item
        return "default"


@register("test-record")
class RecordNode(_ParamNode):
    """Appends a Call(index, item, store, observed) to RECORDS; raises ValueError when `item` equals `fail_on`.

    `store` is the dict the node ran on (the root behind its namespaced view), so tests can check item
    isolation. Writes `value` = item.
    """

    def prep(self, shared: Any) -> dict[str, Any]:
        params = dict(self.params)
        observer = OBSERVER["fn"]
        call = Call(
            index=shared.get("__index__"),
            item=params.get("item"),
            store=getattr(shared, "root", shared),
            observed=observer() if observer is not None else None,
        )
        with _lock:
            RECORDS.append(call)
        return params

    def exec(self, prep_res: dict[str, Any]) -> Any:
        item = prep_res.get("item")
        if "fail_on" in prep_res and item == prep_res["fail_on"]:
            raise ValueError(f"boom {item}")
        return item

    def post(self, shared: Any, prep_res: Any, exec_res: Any) -> str:
        shared["value"] = exec_res
        return "default"


@register("test-concurrency")
class ConcurrencyNode(_ParamNode):
    """Counts items inside exec at once (PROBE.active/peak); waits on PROBE.barrier when one is set.

    With param `fail` truthy it then raises ValueError(f"boom {item}"): after the barrier, so no item fails
    before all of the barrier's parties are running."""

    def exec(self, prep_res: dict[str, Any]) -> Any:
        probe = PROBE
        with probe.lock:
            probe.active += 1
            probe.peak = max(probe.peak, probe.active)
            probe.threads.add(threading.get_ident())
            barrier = probe.barrier
        try:
            if barrier is not None:
                barrier.wait(timeout=WAIT_TIMEOUT_S)
        finally:
            with probe.lock:
                probe.active -= 1
        if prep_res.get("fail"):
            raise ValueError(f"boom {prep_res.get('item')}")
        return prep_res.get("item")

    def post(self, shared: Any, prep_res: Any, exec_res: Any) -> str:
        shared["value"] = exec_res
        return "default"


@register("test-reverse")
class ReverseNode(Node):
    """Item i (of param `total`) finishes only after all items with a higher index: reversed completion.

    Appends {"index", "item"} to `__llm_calls__`, writes `value` = item, or "Error: <item>" when the index is
    in param `error_at`. Needs all items in flight at once (parallel, max_concurrent >= total).
    """

    def prep(self, shared: Any) -> dict[str, Any]:
        return {"params": dict(self.params), "index": shared.get("__index__")}

    def exec(self, prep_res: dict[str, Any]) -> int:
        index, total = prep_res["index"], int(prep_res["params"]["total"])
        gate = REVERSE
        with gate.cond:
            if not gate.cond.wait_for(lambda: len(gate.finished) == total - 1 - index, timeout=WAIT_TIMEOUT_S):
                raise TimeoutError(f"item {index}: items after it did not finish")
        return index

    def post(self, shared: Any, prep_res: dict[str, Any], exec_res: int) -> str:
        params = prep_res["params"]
        item = params.get("item")
        shared.get("__llm_calls__").append({"index": exec_res, "item": item})
        shared["value"] = f"Error: {item}" if exec_res in params.get("error_at", []) else item
        gate = REVERSE
        with gate.cond:
            gate.finished.append(exec_res)
            gate.cond.notify_all()
        return "default"


@register("test-branch")
class BranchNode(_ParamNode):
    """Writes `value` and returns the action in param `action` (default "default")."""

    def post(self, shared: Any, prep_res: dict[str, Any], exec_res: Any) -> str:
        shared["value"] = prep_res.get("value")
        return prep_res.get("action", "default")


@register("test-rounds")
class RoundsNode(Node):
    """Counts passes in the root key `__rounds__`; returns "again" until param `rounds` passes are done."""

    def prep(self, shared: Any) -> int:
        return int(shared.get("__rounds__", 0)) + 1

    def post(self, shared: Any, prep_res: int, exec_res: Any) -> str:
        shared["__rounds__"] = prep_res
        return "again" if prep_res < int(self.params.get("rounds", 1)) else "done"


@register("test-side-effect")
class SideEffectNode(Node):
    """Appends `label` to the file `log` (side effects counted across processes); raises while the file
    `requires` (when given) does not exist, sleeps `seconds` first (for cancels mid-batch), and first waits
    (up to 60 s) for the file `gate` when given (a test opens it to let the node finish)."""

    def prep(self, shared: Any) -> dict[str, Any]:
        return dict(self.params)

    def exec(self, params: dict[str, Any]) -> str:
        time.sleep(float(params.get("seconds", 0)))
        deadline = time.monotonic() + 60
        while params.get("gate") and not os.path.exists(params["gate"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        requires = params.get("requires")
        if requires and not os.path.exists(requires):
            raise FileNotFoundError(f"missing {requires}")
        with open(params["log"], "a", encoding="utf-8") as log:
            log.write(f"{params.get('label')}\n")
        return str(params.get("label"))

    def post(self, shared: Any, prep_res: Any, exec_res: str) -> str:
        shared["label"] = exec_res
        return "default"


@register("test-wait-event")
class WaitEventNode(Node):
    """Arrives at EVENT (counted in `waiting`) and waits inside exec until the test opens it (at most 60 s)."""

    def exec(self, prep_res: Any) -> None:
        with EVENT.cond:
            EVENT.waiting += 1
            EVENT.cond.wait_for(lambda: EVENT.open, timeout=60)
