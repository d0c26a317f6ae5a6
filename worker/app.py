"""The Celery app: `celery -A worker.app worker` (or `chordflow worker`) runs chordflow chunks.

Configured from the environment (worker.settings). Reliability choices: late acks and
reject-on-worker-lost so a killed worker's chunk is delivered again; a visibility timeout above
the longest chunk; prefetch 1 (chunks are long); msgpack/json only, never pickle; ordered chords;
task events on for Flower.

One app per settings value (`create_app`, `current_app`): the module's `app` is built from the
environment at import; a process whose environment changes later gets a new app, never a reconfigured
one. Every live worker keeps its pool size in the worker registry (worker/heartbeat.py).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from celery import Celery, signals
from celery.backends.redis import RedisBackend
from celery.local import Proxy

from worker import heartbeat, runstate, settings
from worker.nodes import registry


def config(s: settings.Settings) -> dict:
    return {
        "broker_url": s.broker_url,
        "result_backend": s.result_backend,
        "task_serializer": "msgpack",
        "result_serializer": "msgpack",
        "accept_content": ["msgpack", "json"],
        "result_accept_content": ["msgpack", "json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "broker_transport_options": {
            "visibility_timeout": s.visibility_timeout,
            # Sweep for lost (unacked, past the timeout) chunks every few seconds, scanning each time;
            # kombu's default sweep is ~100 s apart, which would delay recovery far past the timeout.
            "unacked_restore_interval": max(1, min(10, s.visibility_timeout // 4)),
            "unacked_restore_throttle": 1,
            # A broker that vanishes without closing the socket must not hang a publish forever.
            "socket_timeout": 15,
            "socket_connect_timeout": 5,
        },
        "result_backend_transport_options": {"retry_policy": {"timeout": 5.0}},
        "result_chord_ordered": True,
        "result_expires": s.run_ttl,
        "result_chord_expires": s.run_ttl,
        "result_chord_join_timeout": 30.0,
        "task_default_queue": s.queue,
        "task_track_started": True,
        "task_send_sent_event": True,
        "worker_send_task_events": True,
        "worker_soft_shutdown_timeout": 30.0,
        "worker_enable_soft_shutdown_on_idle": True,
        "worker_hijack_root_logger": False,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": 3,
    }


class RunResultBackend(RedisBackend):
    """The Redis result backend, minus pub/sub subscriptions for chordflow's own chords.

    Celery subscribes to the result channel of every task it sends and of every chord member. The
    scheduler never waits that way (it reads the run's progress stream), so inside `quiet()` those
    subscriptions are skipped: they would cost a round trip per chunk and linger until exit. Outside
    it — any other task sent with this app — `AsyncResult.get()` works as usual.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._quiet = threading.local()

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        self._quiet.on = True
        try:
            yield
        finally:
            self._quiet.on = False

    def _is_quiet(self) -> bool:
        return getattr(self._quiet, "on", False)

    def on_task_call(self, producer: Any, task_id: str) -> None:
        if not self._is_quiet():
            super().on_task_call(producer, task_id)

    def add_pending_result(self, result: Any, weak: bool = False, start_drainer: bool = True) -> Any:
        if self._is_quiet():
            return result
        return super().add_pending_result(result, weak=weak, start_drainer=start_drainer)


class ChordflowCelery(Celery):
    def _get_backend(self) -> RunResultBackend:
        return RunResultBackend(app=self, url=self.conf.result_backend)


# Tasks defined with `task()`, registered on every app `create_app` builds (before or after the definition).
_tasks: list[tuple[Callable[..., Any], dict[str, Any]]] = []
_built: weakref.WeakSet[ChordflowCelery] = weakref.WeakSet()
_apps: dict[settings.Settings, ChordflowCelery] = {}  # current_app's, one per settings value
_lock = threading.RLock()


def create_app(s: settings.Settings) -> ChordflowCelery:
    """A Celery app configured once from `s`, with every task defined so far (and later) registered on it."""
    new = ChordflowCelery("chordflow", include=["worker.tasks", "worker.orchestrate"], set_as_current=False)
    new.conf.update(config(s))
    with _lock:
        for fun, options in _tasks:
            new.task(shared=False, **options)(fun)
        _built.add(new)
    return new


def current_app(s: settings.Settings | None = None) -> ChordflowCelery:
    """The app for the settings in the environment now (or `s`): one app per settings value, built once.

    A scheduler process may be pointed elsewhere after import (tests apply a cluster's environment);
    it then gets a new app for the new settings, never a reconfigured old one.
    """
    s = s or settings.load()
    found = _apps.get(s)
    if found is None:
        with _lock:
            found = _apps.get(s)
            if found is None:
                found = _apps[s] = create_app(s)
    return found


def task(*, name: str, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """Define a task on every chordflow app (`@task(name="x.y")`), like Celery's `shared_task`.

    Returns a proxy to the task on `current_app()`, so `.delay()` or `.signature()` go to the broker of
    the environment at call time, not the one at import.
    """

    def define(fun: Callable[..., Any]) -> Any:
        with _lock:
            _tasks.append((fun, {"name": name, **options}))
            for each in list(_built):
                each.task(shared=False, name=name, **options)(fun)
        return Proxy(lambda: current_app().tasks[name], __doc__=fun.__doc__)

    return define


#: The app `celery -A worker.app worker` runs: built from the environment at import.
app = current_app()


@signals.worker_process_init.connect
@signals.worker_init.connect
def _load_plugins(**_: object) -> None:
    """User node types (CHORDFLOW_PLUGINS) must exist on every worker before a chunk arrives."""
    registry.load_plugins()


_heartbeats: dict[str, heartbeat.Heartbeat] = {}


@signals.worker_ready.connect
def _register_worker(sender: Any, **_: object) -> None:
    """Announce this worker's pool size in the registry (chunk sizing reads it), refreshed until shutdown."""
    hostname = sender.hostname
    if hostname in _heartbeats:
        return
    s = settings.load()
    processes = int(sender.pool.info.get("max-concurrency") or 1)
    beat = heartbeat.Heartbeat(runstate.client(s.result_backend), hostname, processes, s.worker_heartbeat)
    _heartbeats[hostname] = beat
    beat.start()


@signals.worker_shutdown.connect
def _unregister_worker(**_: object) -> None:
    while _heartbeats:
        _heartbeats.popitem()[1].stop()
