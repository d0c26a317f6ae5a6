"""The Celery app: `celery -A worker.app worker` (or `chordflow worker`) runs chordflow chunks.

Configured from the environment (worker.settings). Reliability choices: late acks and
reject-on-worker-lost so a killed worker's chunk is delivered again; a short visibility timeout (a dead
worker's deliveries come back within it) that live workers' renewals keep off their own (broker/deliveries.py);
prefetch 1 (chunks are long); msgpack/json only, never pickle; task events on for Flower.

One app per settings value (`create_app`, `current_app`): the module's `app` is built from the
environment at import; a process whose environment changes later gets a new app, never a reconfigured
one. Every live worker keeps its pool size in the worker registry (worker/cluster/state/heartbeat.py).

Every task message is signed with the shared key and verified by workers (worker/cluster/signing.py); a worker
without a key refuses to start unless CHORDFLOW_INSECURE=1 (`chordflow worker --insecure`).

Every log line of a worker has its secrets masked; CHORDFLOW_LOG_FORMAT=json makes each one a JSON object
(worker/cluster/logs.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from celery import Celery, Task, signals
from celery.backends.redis import RedisBackend, SentinelBackend
from celery.exceptions import Ignore, Reject
from celery.local import Proxy
from celery.utils.nodenames import default_nodename, nodesplit

from ir.errors import NewerFormat, RunPurged
from worker import settings, tracing
from worker.cluster import aging, draining, logs, messages, outage, priorities, signing, waits
from worker.cluster.broker import amqp, deliveries
from worker.cluster.broker.base import Broker
from worker.cluster.broker.registry import for_settings as broker_for
from worker.cluster.rate_limits import RedisLimiter
from worker.cluster.state import connection, heartbeat, runstate
from worker.cluster.state.keys import purged_key
from worker.engine import rate_limits
from worker.nodes import registry
from worker.periodic import Periodic

log = logging.getLogger(__name__)


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
        # What differs between Redis and RabbitMQ (broker/redis.py, broker/amqp.py): the transport and how a dead
        # worker's deliveries come back (a renewed visibility timeout, or heartbeats), the queue's declaration.
        **broker_for(s).app_options(),
        # A message sent without a priority (a branch's advance, a dataset chunk) goes as a normal run's advance.
        "task_default_priority": priorities.message_priority(s.broker_url, "normal", priorities.CONTROL),
        "result_backend_transport_options": {
            "retry_policy": {"timeout": float(s.outage_seconds)},
            **connection.transport_options(s.result_backend, s),
        },
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
        # A send waits this long at most for a free producer of the pool (broker_pool_limit, 10), and again
        # for its connection (worker/cluster/broker/pool.py), then fails with one clear error instead of hanging.
        "broker_pool_acquire_timeout": s.pool_timeout,
        "broker_connection_retry_on_startup": True,
        # Redis outages: a worker reconnects to the broker forever (with backoff), never exits; a publish
        # (a chunk, the next advance) retries for about a minute; result writes retry across the outage.
        "broker_connection_max_retries": None,
        "task_publish_retry_policy": {"max_retries": 40, "interval_start": 0, "interval_step": 0.5, "interval_max": 2},
        "result_backend_always_retry": True,
        "result_backend_max_retries": 40,
        "result_backend_max_sleep_between_retries_ms": 2000,
    }


class QuietResults:
    """A Redis result backend minus pub/sub subscriptions for chordflow's own chords.

    Celery subscribes to the result channel of every task it sends. The
    scheduler never waits that way (it reads the run's progress stream), so inside `quiet()` those
    subscriptions are skipped: they would cost a round trip per chunk and linger until exit. Outside
    it — any other task sent with this app — `AsyncResult.get()` works as usual.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self._quiet = threading.local()
        # Every command (a window's counter included) rides out a restart.
        self.connparams.update(outage.redis_options())

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
            super().on_task_call(producer, task_id)  # type: ignore[misc]

    def add_pending_result(self, result: Any, weak: bool = False, start_drainer: bool = True) -> Any:
        if self._is_quiet():
            return result
        return super().add_pending_result(result, weak=weak, start_drainer=start_drainer)  # type: ignore[misc]


class RunResultBackend(QuietResults, RedisBackend):
    """The result backend of a `redis://` URL."""


class RunSentinelBackend(QuietResults, SentinelBackend):
    """The result backend of a `sentinel://...;sentinel://...` URL (its primary: CHORDFLOW_REDIS_MASTER_NAME)."""


class GivesBack(Task):
    """A task that, when chordflow's state stays out of reach past the budget, gives its message back instead
    of failing: Reject(requeue=True), which stores nothing and counts nothing."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except outage.ERRORS as exc:
            if self.request.called_directly:
                raise
            log.warning(
                "%s[%s]: Redis or the broker out of reach for over %g s (%s: %s): given back, to be delivered "
                "again; not a failure of the run",
                self.name,
                self.request.id,
                outage.budget(),
                type(exc).__name__,
                exc,
            )
            raise Reject(exc, requeue=True) from exc


class KnowsFormat(Task):
    """A task that meets a message of a wire format newer than this release reads (a newer worker's, during a
    rolling upgrade: worker/cluster/messages.py) hands it back to the broker for a worker that knows it: one warning
    per message on this process, a pause so that an old worker alone does not spin on it, Reject(requeue=True)."""

    #: Seconds before such a message is handed back.
    PAUSE = 1.0
    #: Messages warned about on this process, at most this many remembered (then forgotten, and warned again).
    REMEMBERED = 10_000
    _warned: set[str] = set()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except NewerFormat as exc:
            if self.request.called_directly:
                raise
            task_id = self.request.id or ""
            if task_id not in self._warned:
                if len(self._warned) >= self.REMEMBERED:
                    self._warned.clear()
                self._warned.add(task_id)
                log.warning("%s[%s]: %s; handed back for a worker of a newer release", self.name, task_id, exc)
            time.sleep(self.PAUSE)
            raise Reject(exc, requeue=True) from exc


class _NewerFormatQuiet(logging.Filter):
    """Drops Celery's rejection line (a WARNING with a traceback, at every delivery) of a message KnowsFormat hands
    back: KnowsFormat has said it once."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, Reject) and isinstance(exc.reason, NewerFormat))


logging.getLogger("celery.app.trace").addFilter(_NewerFormatQuiet())


class StaysPurged(Task):
    """A task of a purged run (`chordflow purge`) runs nothing and writes nothing: a delivery that begins after the
    purge finds the run's tombstone (one EXISTS per delivery, not per item), and one in flight then stops where a
    write is refused or a stop check sees the tombstone (RunPurged). Either is ignored: acknowledged, no result, no
    done mark, one WARNING line."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Inside GivesBack (see ChordflowTask's bases): Redis out of reach here gives the message back, as in the task.
        run_id = None if self.request.called_directly else messages.run_of(tuple(args))
        if run_id is not None and runstate.client().exists(purged_key(run_id)):
            log.warning("skipped task %s[%s]: run %s was purged", self.name, self.request.id, run_id)
            raise Ignore()
        try:
            return super().__call__(*args, **kwargs)
        except RunPurged as exc:
            if self.request.called_directly:
                raise
            log.warning("%s[%s]: %s", self.name, self.request.id, exc)
            raise Ignore() from None


class ChordflowTask(KnowsFormat, GivesBack, StaysPurged, signing.SignedTask):
    """The base of every task on a chordflow app: signed messages only, run once, given back in an outage or when
    written by a newer release, nothing of a purged run."""


class ChordflowCelery(Celery):
    """chordflow's Celery app: every message it sends is signed, every task on it runs signed messages only."""

    amqp_cls = "worker.cluster.broker.pool:ChordflowAMQP"
    task_cls = "worker.cluster.app:ChordflowTask"

    def __init__(self, *args: Any, chordflow_settings: settings.Settings | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.chordflow_settings = chordflow_settings or settings.load()
        self.insecure = self.chordflow_settings.insecure

    @functools.cached_property
    def chordflow_broker(self) -> Broker:
        """The broker of the settings (broker/registry.py): what differs between Redis and RabbitMQ."""
        return broker_for(self.chordflow_settings)

    @functools.cached_property
    def signer(self) -> signing.Signer | None:
        """From the key in the settings, read once (raises SigningKeyError if it cannot be used)."""
        return signing.signer_for(self.chordflow_settings)

    def _get_backend(self) -> QuietResults:
        url = self.conf.result_backend
        return (RunSentinelBackend if connection.is_sentinel(url) else RunResultBackend)(app=self, url=url)


# Tasks defined with `task()`, registered on every app `create_app` builds (before or after the definition).
_tasks: list[tuple[Callable[..., Any], dict[str, Any]]] = []
_built: weakref.WeakSet[ChordflowCelery] = weakref.WeakSet()
_apps: dict[tuple[Any, ...], ChordflowCelery] = {}  # current_app's, one per cluster settings value
_lock = threading.RLock()


def create_app(s: settings.Settings) -> ChordflowCelery:
    """A Celery app configured once from `s`, with every task defined so far (and later) registered on it."""
    new = ChordflowCelery(
        "chordflow",
        include=["worker.cluster.batches.tasks", "worker.cluster.advance", "worker.cluster.datasets.tasks"],
        set_as_current=False,
        chordflow_settings=s,
    )
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
    key = cluster_key(s)
    found = _apps.get(key)
    if found is None:
        with _lock:
            found = _apps.get(key)
            if found is None:
                found = _apps[key] = create_app(s)
    return found


def cluster_key(s: settings.Settings) -> tuple[Any, ...]:
    """The settings an app is built from: a change of another (a run's home, an LLM model) keeps the app."""
    return tuple(getattr(s, name) for name in settings.FIELDS if name not in settings.CHECKED_ON_USE)


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


@signals.celeryd_init.connect
def _refuse_to_start_unsigned(instance: Any, **_: object) -> None:
    """A worker without a key would run whatever anyone who can write to the broker sends: it does not start
    (one line on stderr, exit 1) unless that is asked for with CHORDFLOW_INSECURE=1."""
    if not isinstance(instance.app, ChordflowCelery):
        return
    try:
        signing.worker_may_start(instance.app)
    except signing.SigningKeyError as exc:
        raise SystemExit(f"error: {exc}") from None


@signals.celeryd_init.connect
def _unique_default_name(instance: Any, **_: object) -> None:
    """A worker started without `-n` is `chordflow-<pid>@<host>`, not Celery's `celery@<host>`: two such workers on
    one host stay two in the registry (chunk sizing, `top`, `chordflow_workers`) and in Celery's own mingle."""
    if isinstance(instance.app, ChordflowCelery) and instance.hostname == default_nodename(None):
        instance.hostname = default_nodename(f"chordflow-{os.getpid()}@{nodesplit(instance.hostname)[1]}")


@signals.celeryd_init.connect
def _log_format(instance: Any, **_: object) -> None:
    """CHORDFLOW_LOG_FORMAT=json: every line the worker writes is a JSON object, so no banner (not a log line).
    A value other than text or json stops the worker at start, with one line."""
    if not isinstance(instance.app, ChordflowCelery):
        return
    try:
        json_lines = logs.json_format()
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if json_lines:
        instance.quiet = True
        logs.json_lines_only()


#: Secrets are masked in every log line; CHORDFLOW_LOG_FORMAT=json makes each one a JSON object (cluster/logs.py).
signals.after_setup_logger.connect(logs.configure, weak=False)
signals.after_setup_task_logger.connect(logs.configure, weak=False)


@signals.worker_ready.connect
def _warn_when_insecure(sender: Any, **_: object) -> None:
    if isinstance(sender.app, ChordflowCelery) and sender.app.signer is None:
        log.warning("running INSECURE (CHORDFLOW_INSECURE): unsigned task messages are accepted and run")


@signals.worker_init.connect
def _warn_unknown_variables(**_: object) -> None:
    """A misspelt CHORDFLOW_* variable is named at a worker's start, as by the CLI (once per process)."""
    settings.warn_unknown()


@signals.worker_process_init.connect
@signals.worker_init.connect
def _load_plugins(**_: object) -> None:
    """User node types (CHORDFLOW_PLUGINS) must exist on every worker before a chunk arrives."""
    registry.load_plugins()


@signals.worker_process_init.connect
@signals.worker_init.connect
def _share_rate_limits(**_: object) -> None:
    """Rate-limit buckets of every node a worker runs are the cluster's, in Redis (worker/cluster/rate_limits.py)."""
    rate_limits.use(RedisLimiter(runstate.client()))


@signals.worker_process_init.connect
@signals.worker_init.connect
def _start_tracing(**_: object) -> None:
    """With tracing on, the SDK is loaded as the worker starts, not inside the first chunk it runs."""
    if tracing.ON:
        tracing.tracer()


@signals.worker_process_shutdown.connect
@signals.worker_shutdown.connect
def _export_spans(**_: object) -> None:
    """A pool child exits without Python's exit hooks: what it traced is exported before it goes."""
    tracing.flush()


#: A warm shutdown drains every process running chunks: their items not started go back at once, those in flight
#: get CHORDFLOW_DRAIN_GRACE (worker/cluster/draining.py).
signals.worker_init.connect(draining.listen, weak=False)
signals.worker_ready.connect(draining.keep_pool, weak=False)
signals.worker_shutting_down.connect(draining.tell_pool, weak=False)


#: The threads a worker keeps while it lives, by (hostname, what): started once at worker_ready, stopped at shutdown.
_loops: dict[tuple[str, str], Periodic] = {}


def _keep(sender: Any, what: str, make: Callable[[], Periodic | None]) -> None:
    """Start the thread `make` builds (None: none is needed here) once per worker."""
    if (sender.hostname, what) in _loops or not isinstance(sender.app, ChordflowCelery):
        return
    loop = make()
    if loop is not None:
        _loops[(sender.hostname, what)] = loop
        loop.start()


@signals.worker_shutdown.connect
def _stop_loops(**_: object) -> None:
    while _loops:
        _loops.popitem()[1].stop()


@signals.worker_ready.connect
def _register_worker(sender: Any, **_: object) -> None:
    """Announce this worker's pool size in the registry (chunk sizing reads it), refreshed until shutdown."""
    s = settings.load()
    processes = int(sender.pool.info.get("max-concurrency") or 1)
    client = runstate.client(s.result_backend)
    _keep(sender, "heartbeat", lambda: heartbeat.Heartbeat(client, sender.hostname, processes, s.worker_heartbeat))


@signals.worker_ready.connect
def _renew_deliveries(sender: Any, **_: object) -> None:
    """While this worker lives, no message it holds (running, prefetched, waiting for its ETA) is delivered again:
    a thread of the main process, where the consumer holds them, renews them all
    (worker/cluster/broker/deliveries.py)."""

    def make() -> Periodic | None:
        app = sender.app
        if not broker_for(app.chordflow_settings).renews_deliveries:
            return None
        bound = app.conf.broker_transport_options.get("visibility_timeout") or deliveries.DEAD_DELIVERY_SECONDS
        return deliveries.DeliveryRenewer(sender, deliveries.renew_interval(bound))

    _keep(sender, "deliveries", make)


@signals.worker_ready.connect
def _sweep_for_aging(sender: Any, **_: object) -> None:
    """Messages that waited too long behind higher-priority ones are sent again one level up: every worker
    sweeps, one at a time (worker/cluster/aging.py)."""
    _keep(sender, "aging", lambda: aging.Sweeper(sender.app))


@signals.worker_ready.connect
def _fire_timers(sender: Any, **_: object) -> None:
    """Waiting runs go on when due or signalled: every worker sweeps the timers, one at a time
    (worker/cluster/waits.py)."""
    _keep(sender, "timers", lambda: waits.TimerSweeper(sender.app))


@signals.worker_ready.connect
def _fire_schedules(sender: Any, **_: object) -> None:
    """Schedules make their runs when due, with no beat process: every worker sweeps them, one at a time
    (worker/cluster/schedules.py; imported here, so a client sending runs never loads croniter)."""
    from worker.cluster import schedules

    _keep(sender, "schedules", lambda: schedules.ScheduleSweeper(sender.app))


@signals.worker_ready.connect
def _keep_solo_heartbeats(sender: Any, **_: object) -> None:
    """A `-P solo` worker on RabbitMQ runs each task inside its consumer loop, which sends no heartbeat meanwhile:
    without these, RabbitMQ would drop the connection of a worker running a chunk longer than two heartbeat
    intervals and deliver its chunk again (worker/cluster/broker/amqp.py)."""

    def make() -> Periodic | None:
        app = sender.app
        heartbeat_seconds = app.conf.broker_heartbeat
        solo = type(sender.pool).__module__ == "celery.concurrency.solo"
        if not solo or not heartbeat_seconds or broker_for(app.chordflow_settings).renews_deliveries:
            return None
        log.info("solo pool on RabbitMQ: broker heartbeats sent from a thread while a task runs")
        beats = amqp.SoloHeartbeats(sender, heartbeat_seconds / 3)
        signals.task_prerun.connect(lambda **_: beats.started(), weak=False)
        signals.task_postrun.connect(lambda **_: beats.finished(), weak=False)
        return beats

    _keep(sender, "solo heartbeats", make)
