"""PocketFlow retries and "error as state" (NodeError in shared["_error"] + `error` edge routing)."""

from __future__ import annotations

import time

import msgpack
import pytest

import scheduler
from tests.support import batch_node, chain, unique, workflow
from tests.support import nodes as tn
from worker.node_error import NodeError


def _flaky(node_id: str, key: str, fails: int, **extra) -> dict:
    return {"id": node_id, "type": "test-flaky", "params": {"item": key, "fails": fails}, **extra}


def _handler() -> dict:
    return {
        "id": "handler",
        "type": "echo",
        "params": {"message": "${_error.message}", "kind": "${_error.exception_type}", "who": "${_error.node_name}"},
    }


def _routed(failing: dict, *more: dict) -> dict:
    edges = [{"from": failing["id"], "to": "handler", "action": "error"}]
    edges += [{"from": failing["id"], "to": m["id"]} for m in more]
    return workflow(failing, _handler(), *more, edges=edges)


def test_error_edge_routes_with_node_error():
    key = unique("route-")
    before = time.time()
    wf = _routed(
        _flaky("api", key, fails=99, max_retries=3), {"id": "next", "type": "test-upper", "params": {"text": "x"}}
    )
    result = scheduler.run(wf)
    assert result.status == "success"
    shared = result.shared
    err = shared["_error"]
    assert isinstance(err, NodeError)
    assert isinstance(err, dict)
    assert err.exception_type == "ConnectionError"
    assert err.message == f"flaky {key} attempt 3"
    assert err.node_name == "api"
    assert err.retry_count == 3
    assert err.max_retries == 3
    assert "ConnectionError" in err.traceback_str
    assert "Traceback" in err.traceback_str
    assert before <= err.timestamp <= time.time()
    assert isinstance(err.exception, ConnectionError)
    # The handler ran (reading the error through templates); the default successor did not.
    assert shared["handler"] == {"message": f"flaky {key} attempt 3", "kind": "ConnectionError", "who": "api"}
    assert "next" not in shared
    assert tn.FLAKY_ATTEMPTS[key] == 3


def test_node_error_is_msgpack_serializable():
    result = scheduler.run(_routed(_flaky("api", unique(), fails=99)))
    err = result.shared["_error"]
    packed = msgpack.packb(dict(err))
    unpacked = msgpack.unpackb(packed)
    assert unpacked == dict(err)
    assert set(unpacked) == {
        "exception_type",
        "message",
        "node_name",
        "retry_count",
        "max_retries",
        "traceback_str",
        "timestamp",
    }
    assert (unpacked["retry_count"], unpacked["max_retries"]) == (1, 1)


def test_no_error_edge_propagates_original_exception():
    key = unique()
    wf = workflow(_flaky("api", key, fails=99, max_retries=2), {"id": "after", "type": "echo", "params": {"v": 1}})
    shared: dict = {}
    with pytest.raises(ConnectionError, match=rf"^flaky {key} attempt 2$"):
        scheduler.run(wf, shared=shared)
    assert "_error" not in shared
    assert "after" not in shared
    assert tn.FLAKY_ATTEMPTS[key] == 2


def test_success_takes_default_edge_not_error_edge():
    key = unique()
    wf = _routed(
        _flaky("api", key, fails=1, max_retries=2), {"id": "next", "type": "test-upper", "params": {"text": "x"}}
    )
    shared = scheduler.run(wf).shared
    assert shared["api"] == {"value": key, "attempts": 2}
    assert shared["next"] == {"value": "X"}
    assert "handler" not in shared
    assert "_error" not in shared


def test_error_action_routes_to_error_edge():
    wf = workflow(
        {"id": "check", "type": "test-error-action", "params": {"value": "v"}},
        {"id": "handler", "type": "echo", "params": {"saw": "${check.value}"}},
        edges=[{"from": "check", "to": "handler", "action": "error"}],
    )
    result = scheduler.run(wf)
    assert result.status == "success"
    assert result.shared["handler"] == {"saw": "v"}
    assert "_error" not in result.shared


def test_batch_fail_fast_routes_to_error_edge(backend):
    wf = _routed(batch_node("b", node_type="test-fail", params={"value": "${item}", "fail_on": "b"}))
    result = scheduler.run(wf, shared={"x": ["a", "b", "c"]}, backend=backend)
    assert result.status == "success"
    err = result.shared["_error"]
    assert (err.exception_type, err.message, err.node_name) == ("ValueError", "boom b", "b")
    assert result.shared["handler"] == {"message": "boom b", "kind": "ValueError", "who": "b"}
    assert "b" not in result.shared, "a failed fail_fast batch writes no aggregate"


def test_node_max_retries_and_wait_map_to_pocketflow():
    wf = workflow({"id": "api", "type": "test-flaky", "params": {"item": "k"}, "max_retries": 4, "wait": 0.25})
    actual = chain(scheduler.compile(wf).start_node)[-1]
    assert isinstance(actual, tn.FlakyNode)
    assert (actual.max_retries, actual.wait) == (4, 0.25)
    default = chain(scheduler.compile(workflow({"id": "a", "type": "test-upper"})).start_node)[-1]
    assert (default.max_retries, default.wait) == (1, 0)


@pytest.mark.parametrize(("max_retries", "fails", "ok"), [(3, 2, True), (2, 2, False), (1, 0, True), (1, 1, False)])
def test_node_max_retries_counts_attempts(max_retries, fails, ok):
    key = unique()
    wf = workflow(_flaky("api", key, fails=fails, max_retries=max_retries))
    if ok:
        assert scheduler.run(wf).shared["api"] == {"value": key, "attempts": fails + 1}
    else:
        with pytest.raises(ConnectionError):
            scheduler.run(wf)
    assert tn.FLAKY_ATTEMPTS[key] == (fails + 1 if ok else max_retries)
