"""worker/app.py: one Celery app per settings value, tasks on every app, and the two Celery internals
RunResultBackend overrides (`on_task_call`, `add_pending_result`) pinned to the behaviour it relies on."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from celery.app.utils import find_app

import scheduler
import worker.app
from tests.support import dist_nodes  # noqa: F401  (the test node types, in this process too)
from worker.cluster.app import RunResultBackend, current_app, task
from worker.cluster.state.runstate import client

CHORDFLOW_TASKS = {"chordflow.run_chunk", "chordflow.aggregate"}


def in_fresh_thread(call: Callable[[], Any]) -> Any:
    """`call()` in a new thread: Celery keeps one result backend per thread, so this one starts clean."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(120)
    assert not thread.is_alive()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def subscriptions(backend: RunResultBackend) -> tuple[set[Any], list[str]]:
    """The result channels this backend subscribed to, and the task ids it holds pending results for."""
    return set(backend.result_consumer.subscribed_to), [tid for mapping in backend._pending_results for tid in mapping]


def test_new_settings_get_a_new_app_and_the_old_one_is_left_as_built(monkeypatch: pytest.MonkeyPatch) -> None:
    before = current_app()
    broker = before.conf.broker_url
    monkeypatch.setenv("CHORDFLOW_BROKER_URL", "redis://127.0.0.1:1/5")
    monkeypatch.setenv("CHORDFLOW_RESULT_BACKEND", "redis://127.0.0.1:1/5")
    other = current_app()
    assert other is not before
    assert other.conf.broker_url == other.conf.result_backend == "redis://127.0.0.1:1/5"
    assert before.conf.broker_url == broker
    assert current_app() is other  # built once per settings value
    monkeypatch.undo()
    assert current_app() is before
    import worker.cluster.batches.tasks  # what a worker imports through `include`

    for app in (before, other, worker.app.app):
        assert set(app.tasks) >= CHORDFLOW_TASKS
        assert type(app.backend) is RunResultBackend


def test_a_task_defined_after_the_apps_exist_is_registered_on_each() -> None:
    apps = [current_app(), worker.app.app]

    @task(name="tests.defined-late")
    def late() -> str:
        return "late"

    for app in apps:
        assert "tests.defined-late" in app.tasks
    assert late.name == "tests.defined-late"  # the proxy resolves to the task on current_app()


def test_celery_dash_a_worker_dot_app_loads_the_module_app() -> None:
    assert find_app("worker.app") is worker.app.app


def subscribes(client: Any) -> int:
    """SUBSCRIBE commands the Redis server has run so far (the result backend's way to wait for a task)."""
    return int(client.info("commandstats").get("cmdstat_subscribe", {}).get("calls", 0))


@pytest.mark.usefixtures("celery_cluster")
def test_a_chordflow_chord_makes_no_result_subscription() -> None:
    """Inside `quiet()` (around chordflow's chord dispatch) neither hook subscribes: the server sees no
    SUBSCRIBE, and no pending result is held while the batch runs (Celery drops a subscription once its
    result object is garbage, so the backend's own state only proves something while the run is going)."""
    seen: list[tuple[set[Any], list[str]]] = []

    def on_event(event: dict[str, Any]) -> None:
        if event["type"] == "batch_progress" and not seen:  # in the run's thread, inside the backend's wait
            seen.append(subscriptions(current_app().backend))

    def run() -> None:
        batch = {"items": "${items}", "chunk_size": 1}
        wf = {"nodes": [{"id": "b", "type": "echo", "params": {"v": "${item}"}, "batch": batch}]}
        result = scheduler.run(wf, {"items": list(range(6))}, backend="celery", on_event=on_event)
        assert result.shared["b"]["success_count"] == 6

    before = subscribes(client())
    in_fresh_thread(run)
    assert subscribes(client()) == before
    assert seen == [(set(), [])]


@pytest.mark.usefixtures("celery_cluster")
def test_quiet_skips_the_subscription_and_outside_it_get_still_works() -> None:
    """The control for the test above: a task sent outside `quiet()` is subscribed to, and `.get()` works."""

    def send_both() -> tuple[Any, int, Any, str, int]:
        app = current_app()
        with app.backend.quiet():
            quiet_result = app.signature("tests.add", (1, 1)).delay()
        inside = subscriptions(app.backend)  # while quiet_result is alive
        before = subscribes(client())
        sent = app.signature("tests.add", (2, 3)).delay()
        outside = subscriptions(app.backend)
        assert quiet_result.id
        return inside, subscribes(client()) - before, outside, sent.id, sent.get(timeout=30)

    inside, subscribed, (channels, _), task_id, value = in_fresh_thread(send_both)
    assert inside == (set(), [])
    assert subscribed >= 1
    assert any(task_id in (c.decode() if isinstance(c, bytes) else c) for c in channels)
    assert value == 5
