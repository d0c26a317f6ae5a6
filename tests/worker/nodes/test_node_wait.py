"""The `wait` node in a local run: a time, an event sent with `scheduler.signal` (from another thread, as
`chordflow signal` does from another process: through the embedded store), a timeout routed by an `error` edge,
where a wait may stand, and a resumed run that keeps its first due time. Cluster waits: tests/worker/cluster/
test_waits.py."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

import pytest

from ir.errors import EventTimedOut, ValidationError
from scheduler import api
from worker.runs.sqlite import LocalRuns


def waiting_then(*more: dict[str, Any], **params: Any) -> dict[str, Any]:
    nodes = [{"id": "w", "type": "wait", "params": params}, *more]
    edges = [{"from": "w", "to": n["id"], **n.pop("on", {})} for n in more]
    return {"nodes": nodes, "edges": edges}


def newest_run() -> str:
    return LocalRuns.default().recent(None, 1)[0].run_id


def when_waiting(then: Any) -> threading.Thread:
    """Once the newest run shows it waits (`status`), call `then(run_id, status)` on a thread of its own."""

    def watch() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            recent = LocalRuns.default().recent(None, 1)
            if recent and recent[0].status == "running" and "waiting" in (info := api.status(recent[0].run_id)):
                then(recent[0].run_id, info)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_time_wait_goes_on_at_its_time_and_writes_it() -> None:
    started = time.time()
    result = api.run(waiting_then({"id": "e", "type": "echo", "params": {"at": "${w.until}"}}, seconds=0.6))
    assert result.status == "success"
    due = datetime.fromisoformat(result.shared["w"]["until"]).timestamp()
    assert started + 0.6 <= due <= time.time() and result.shared["e"]["at"] == result.shared["w"]["until"]


def test_an_event_releases_the_wait_and_its_data_lands_in_the_namespace() -> None:
    seen: dict[str, Any] = {}

    def approve(run_id: str, info: dict[str, Any]) -> None:
        seen.update(info["waiting"])
        api.signal(run_id, "approved", {"by": "ann"})

    watcher = when_waiting(approve)
    result = api.run(waiting_then({"id": "e", "type": "echo", "params": {"who": "${w.data.by}"}}, event="approved"))
    watcher.join()
    assert result.status == "success" and result.shared["w"] == {"event": "approved", "data": {"by": "ann"}}
    assert result.shared["e"]["who"] == "ann"
    assert seen["event"] == "approved" and seen["until"] is None and seen["text"] == "waiting for event 'approved'"


def test_an_event_that_does_not_come_in_time_is_the_nodes_error() -> None:
    handled = {"id": "h", "type": "echo", "params": {"why": "${_error.message}"}, "on": {"action": "error"}}
    result = api.run(waiting_then(handled, event="approved", timeout=0.3))
    assert result.status == "success"
    assert result.shared["h"]["why"].startswith("wait node 'w': event 'approved' did not come by ")
    with pytest.raises(EventTimedOut, match="event 'approved' did not come by"):  # no error edge: the run fails
        api.run(waiting_then(event="approved", timeout="1s"))


def test_a_signal_sent_before_the_run_waits_is_kept_until_it_does() -> None:
    gate = threading.Event()

    def early(run_id: str, info: dict[str, Any]) -> None:
        api.signal(run_id, "second", 2)  # the run waits for 'first' now; 'second' is kept
        api.signal(run_id, "first", 1)
        gate.set()

    watcher = when_waiting(early)
    wf = waiting_then({"id": "w2", "type": "wait", "params": {"event": "second"}}, event="first")
    result = api.run(wf)
    watcher.join()
    assert gate.is_set() and result.status == "success"
    assert (result.shared["w"]["data"], result.shared["w2"]["data"]) == (1, 2)


def test_signal_refuses_an_ended_run_a_bad_event_and_data_that_is_not_json() -> None:
    run_id = api.run(waiting_then(seconds=0)).run_id
    with pytest.raises(ValidationError, match=r"already ended \(succeeded\): nothing waits for 'x'"):
        api.signal(run_id, "x")
    with pytest.raises(ValidationError, match="the event must be a non-empty string"):
        api.signal(run_id, "")
    with pytest.raises(ValidationError, match="data must be a JSON value"):
        api.signal(run_id, "x", {1, 2})


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"seconds": 1, "event": "x"}, "exactly one of 'seconds', 'until' or 'event' (got 'seconds' and 'event')"),
        ({}, "exactly one of 'seconds', 'until' or 'event' (got none)"),
        ({"seconds": 5, "timeout": "1h"}, "'timeout' goes with 'event' only"),
        ({"until": "2026-12-05T06:00:00"}, "params.until: must be an ISO 8601 time with its zone"),
        ({"seconds": "soon"}, "params.seconds: must be a number of seconds or a duration"),
        ({"event": "x", "timeout": -1}, "params.timeout: must be a number of seconds or a duration"),
    ],
)
def test_a_wait_with_bad_params_is_refused_naming_the_param(params: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match="nodes\\[0\\] \\(id 'w'\\)") as caught:
        api.run(waiting_then(**params))
    assert problem in str(caught.value)


def test_a_wait_stands_at_the_top_level_only() -> None:
    batch = {"nodes": [
        {"id": "s", "type": "echo", "params": {"xs": [1, 2]}},
        {"id": "w", "type": "wait", "params": {"seconds": 1}, "batch": {"items": "${s.xs}"}},
    ], "edges": [{"from": "s", "to": "w"}]}  # fmt: skip
    with pytest.raises(
        ValidationError, match="id 'w'\\): a wait node waits at the run's top level only, not as a batch"
    ):
        api.run(batch)
    branches = {"nodes": [
        {"id": "f", "type": "echo", "params": {}}, {"id": "w", "type": "wait", "params": {"seconds": 1}},
        {"id": "b", "type": "echo", "params": {}}, {"id": "j", "type": "echo", "params": {}},
    ], "edges": [
        {"from": "f", "to": "w", "parallel": True, "fan_in": "j"},
        {"from": "f", "to": "b", "parallel": True, "fan_in": "j"},
        {"from": "w", "to": "j"}, {"from": "b", "to": "j"},
    ]}  # fmt: skip
    with pytest.raises(ValidationError, match="not in a parallel branch"):
        api.run(branches)
    sub = {"nodes": [{"id": "s", "type": "workflow", "params": {"workflow": waiting_then(seconds=1)}}]}
    with pytest.raises(ValidationError, match="node 'w': a wait node waits at the run's top level only, not in a sub"):
        api.run(sub)


def test_a_resumed_run_waits_until_its_first_due_time_not_a_new_one() -> None:
    """A run cut short while it waited (here a cancel; a killed process leaves the same record) goes on at the due
    time its wait began with: resumed past it, at once."""
    cancel = threading.Event()
    watcher = when_waiting(lambda run_id, info: cancel.set())
    result = api.run(waiting_then(seconds=1.0), cancelled=cancel)
    watcher.join()
    assert result.status == "cancelled"
    time.sleep(1.0)  # the time the wait is about: its due time passes while nothing runs the run
    resumed_at = time.time()
    resumed = api.resume(result.run_id)
    assert resumed.status == "success"
    assert datetime.fromisoformat(resumed.shared["w"]["until"]).timestamp() < resumed_at  # not a second from now
