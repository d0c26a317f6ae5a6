"""Deliveries: a live worker's are never delivered again, a dead worker's come back within a minute.

kombu's Redis transport emulates acknowledgements. A message a worker has received and not yet
acknowledged sits in the hash `unacked` (its payload, by delivery tag) and in the sorted set
`unacked_index` (member: the delivery tag; score: when it was received), and every worker's sweeper
(`QoS.restore_visible`, every `unacked_restore_interval` seconds) puts back on its queue each message whose
score is older than the visibility timeout. The sweeper knows nothing of workers: on a long timeout a dead
worker's chunk waits that long (an hour by default); on a short one a live worker's long chunk is delivered
again while it runs, and again (20k items in 11 s chunks under an 8 s timeout never finished, before this).

So the timeout is short and live deliveries are kept fresh:

- **The bound.** The transport's visibility timeout is `dead_delivery_seconds`: DEAD_DELIVERY_SECONDS (30 s), or
  CHORDFLOW_VISIBILITY_TIMEOUT when that is lower. Sweeps run every `sweep_interval` (5 s).
- **Renewal** (`DeliveryRenewer`). A worker's consumer holds every message it was delivered in its main process
  (prefork children only run them): running, reserved (prefetched) or waiting for an ETA. A thread there moves
  the index entry of every one of them to now every sixth of the bound, in one `ZADD XX` for all of them (XX:
  an entry that was acknowledged or swept is never added back). A worker that dies, is cut off or is paused
  stops renewing, and after the bound a live worker's sweeper delivers its chunks, advances and dataset chunks
  again: within `bound + sweep interval` of its last renewal (about 35 s), whatever the timeout setting says.
- **One tag per delivery** (`RedisTransport`). kombu gives a message its delivery tag when it is published and
  keeps it when it restores the message, so the stale holder of a swept message (a paused worker that wakes
  up) would share its tag with the new delivery: its acknowledgement would delete the new delivery's entry,
  and the new holder, its entry gone, could neither be renewed nor come back if it died. The transport here
  gives a restored message a fresh tag: a stale holder's renewals and acknowledgement touch nothing.
- **Letting go** (`LetsGo`). An acknowledgement or a give-back that cannot reach Redis (the worker cut off) lets
  the delivery go anyway: nothing renews it any more, and a sweeper puts it back within the bound.
- **Fencing** (`held`, `Lease`). A chunk checks its delivery on the way out: if the entry is gone, the message
  was swept and runs (or ran) elsewhere, so the chunk raises Ignore and never reports — only one outcome per
  chunk reaches the merge. Dataset chunks are fenced by their claim (worker/cluster/state/lua/dataset_step.lua).

Redis brokers only. AMQP (RabbitMQ) has no visibility timeout: an unacknowledged message goes back to its
queue when the consumer's connection closes, so there is nothing to renew.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from celery.exceptions import Ignore
from celery.worker import state as worker_state
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

from worker.periodic import Periodic

log = logging.getLogger(__name__)

#: Seconds without renewal after which a delivery is a dead worker's and is delivered again (at most).
DEAD_DELIVERY_SECONDS = 30
#: Renewals per bound: five may be missed (Redis slow for a moment) before a sweeper takes a live delivery.
RENEWALS_PER_BOUND = 6
#: Seconds between sweeps, at most.
SWEEP_SECONDS = 5
#: Seconds a sweeper's mutex lasts: one that died mid-sweep holds up the others this long (kombu's default: 300).
SWEEP_MUTEX_SECONDS = 10

_channels: dict[tuple[Any, ...], Any] = {}  # (pid, broker uri, transport options) -> kombu Redis channel
_channels_lock = threading.Lock()


# -- the bound -------------------------------------------------------------------------------------------------


def dead_delivery_seconds(visibility_timeout: int) -> int:
    """The transport's visibility timeout: CHORDFLOW_VISIBILITY_TIMEOUT, at most DEAD_DELIVERY_SECONDS."""
    return max(1, min(int(visibility_timeout), DEAD_DELIVERY_SECONDS))


def sweep_interval(bound: int) -> int:
    """Seconds between a worker's sweeps for deliveries older than `bound`."""
    return max(1, min(SWEEP_SECONDS, bound // 4))


def renew_interval(bound: float) -> float:
    return max(0.1, bound / RENEWALS_PER_BOUND)


def broker_options(broker_url: str) -> dict[str, Any]:
    """Celery settings that make a Redis broker's connections use the transport below (nothing for another broker).

    kombu gives a `rediss://` URL without `ssl_*` options insecure TLS by default, but only when the transport is
    named by the scheme: named by its class here, it gets the same default through `broker_use_ssl` (`ssl_*`
    options in the URL still win)."""
    scheme = urlsplit(broker_url).scheme
    if scheme not in TRANSPORTS:
        return {}
    options: dict[str, Any] = {"broker_transport": TRANSPORTS[scheme]}
    if scheme == "rediss":
        options["broker_use_ssl"] = {"ssl_cert_reqs": ssl.CERT_NONE}
    return options


# -- one tag per delivery --------------------------------------------------------------------------------------


class LetsGo(kombu_redis.QoS):
    """kombu's acknowledgement emulation, except that an acknowledgement or a give-back (a reject with requeue, as
    GivesBack raises when Redis stays out of reach) that cannot reach Redis lets the delivery go here anyway. kombu
    keeps such a delivery among those this worker holds, so the renewer would keep it fresh forever and no sweeper
    would ever put it back: the chunk lost. Let go, its entry stays in the unacked index with nothing renewing it,
    and a sweeper puts the message back within the bound (given back: it runs again; acknowledged: its done mark
    skips it). The error still goes up (Celery logs it)."""

    def ack(self, delivery_tag: Any) -> None:
        try:
            super().ack(delivery_tag)
        except BaseException:
            virtual.QoS.ack(self, delivery_tag)
            raise

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        try:
            super().reject(delivery_tag, requeue)
        except BaseException:
            virtual.QoS.ack(self, delivery_tag)
            raise


class _Retagging:
    QoS = LetsGo

    def _do_restore_message(self, payload: Any, exchange: Any, routing_key: Any, pipe: Any, leftmost: bool = False):
        """Back on its queue with a fresh delivery tag (kombu keeps the tag given at publish): the next delivery's
        index entry is its own, never the stale holder's."""
        with contextlib.suppress(KeyError, TypeError):
            payload["properties"]["delivery_tag"] = str(uuid.uuid4())
        return super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)  # type: ignore[misc]


class RetaggingChannel(_Retagging, kombu_redis.Channel):
    pass


class RetaggingSentinelChannel(_Retagging, kombu_redis.SentinelChannel):
    pass


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport, restoring each swept message under a new delivery tag and letting go of a delivery
    it could not acknowledge or give back (LetsGo)."""

    Channel = RetaggingChannel


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = RetaggingSentinelChannel


#: Broker URL scheme -> the transport its connections use.
TRANSPORTS = {
    "redis": f"{__name__}:RedisTransport",
    "rediss": f"{__name__}:RedisTransport",
    "sentinel": f"{__name__}:SentinelTransport",
}


# -- renewal, in a worker's main process -----------------------------------------------------------------------


def delivery_tag(request: Any) -> str | None:
    """The delivery tag of the message a task request runs. kombu's virtual transports (Redis) keep it in the
    message properties; Celery copies those whole into the request but leaves it out of `delivery_info`."""
    properties = getattr(request, "properties", None) or {}
    delivery_info = getattr(request, "delivery_info", None) or {}
    return properties.get("delivery_tag") or delivery_info.get("delivery_tag")


def has_visibility_timeout(app: Any) -> bool:
    """Whether `app` consumes from a Redis broker (the transport whose sweeper redelivers on a timeout).
    Looks at the broker URL's transport class only: nothing is connected or instantiated."""
    return app.connection_for_read().get_transport_cls().driver_type == "redis"


def _request_tag(request: Any) -> str | None:
    message = getattr(request, "message", None)
    return getattr(message, "delivery_tag", None)


class DeliveryRenewer(Periodic):
    """Keeps every message a worker's consumer holds unacknowledged from being delivered again, until `stop()`.

    Parameters: the worker's consumer (Celery's, in the worker's main process: `task_consumer.channel` is the
    kombu channel its deliveries are on, looked up at every beat since a reconnect replaces it) and the seconds
    between renewals."""

    name = "chordflow-deliveries"
    tick_at_start = True

    def __init__(self, consumer: Any, interval: float):
        super().__init__(interval)
        self.consumer = consumer
        #: Beats that renewed (whatever they held), and entries moved by the last one.
        self.beats = 0
        self.renewed = 0
        self._failing = False

    def held(self) -> tuple[Any, list[str]]:
        """The consumer's kombu channel and the delivery tags this worker holds unacknowledged (none: (None, [])):
        those of the channel, and those of the tasks it runs or has reserved (a task running across a reconnect
        holds a delivery of the channel before)."""
        channel = getattr(getattr(self.consumer, "task_consumer", None), "channel", None)
        delivered = getattr(getattr(channel, "qos", None), "_delivered", None)
        if channel is None or delivered is None or not getattr(channel, "ack_emulation", False):
            return None, []
        tags: set[str] = set()
        for _ in range(3):  # the consumer's thread may change them meanwhile: copy them again
            with contextlib.suppress(RuntimeError):
                tags = {str(tag) for tag in list(delivered)}
                tags.update(str(tag) for r in list(worker_state.reserved_requests) if (tag := _request_tag(r)))
                break
        return channel, sorted(tags)

    def renew(self) -> int:
        """Move every held delivery's entry to now (one ZADD XX); returns how many entries moved."""
        channel, tags = self.held()
        if not tags:
            return 0
        with channel.conn_or_acquire() as client:
            return int(client.zadd(channel.unacked_index_key, dict.fromkeys(tags, time.time()), xx=True, ch=True))

    def tick(self) -> None:
        try:
            self.renewed = self.renew()
            self.beats += 1
            if self._failing:
                log.info("renewing this worker's deliveries again")
            self._failing = False
        except Exception as exc:  # broker away for a moment (redis or kombu errors): the next beat tries again
            if not self._failing:
                log.warning("could not renew this worker's deliveries in the broker: %s", exc)
            self._failing = True


# -- fencing, where a task runs --------------------------------------------------------------------------------


def redis_channel(app: Any) -> Any | None:
    """This process's kombu channel to the Redis broker `app` consumes from; None when kombu emulates no
    acknowledgements there (`ack_emulation` off: no unacked index, no sweeper).

    Opened once per process and broker (a forked pool process opens its own); one attempt to connect."""
    conn = app.connection_for_read()
    key = (os.getpid(), conn.as_uri(include_password=True), repr(sorted(conn.transport_options.items())))
    with _channels_lock:
        channel = _channels.get(key)
        if channel is None:
            channel = _channels[key] = conn.channel()  # the connection stays open with it
        else:
            conn.release()
    return channel if channel.ack_emulation else None


class Lease:
    """The delivery a task runs (`app`: the task's Celery app, whose broker holds it; `tag`: its delivery tag)."""

    def __init__(self, app: Any, tag: str):
        self.app = app
        self.tag = tag
        #: True once `check` found the delivery taken over: it was swept, so it runs (or ran) elsewhere too.
        self.lapsed = False

    def check(self) -> bool:
        """Renew the delivery's entry once and say whether it still exists. A broker that does not answer counts
        as held: the outcome is reported (the batch's window counts a chunk once anyway)."""
        try:
            channel = redis_channel(self.app)
            if channel is None:
                return True
            with channel.conn_or_acquire() as client:
                pipe = client.pipeline(transaction=False)
                pipe.zadd(channel.unacked_index_key, {self.tag: time.time()}, xx=True)
                pipe.zscore(channel.unacked_index_key, self.tag)
                score = pipe.execute()[1]
        except Exception as exc:  # redis or kombu errors
            log.warning("could not check the delivery of message %s: %s", self.tag, exc)
            return True
        self.lapsed = score is None
        return not self.lapsed


def fence_start(task: Any, what: str = "chunk") -> Lease | None:
    """The lease of `task`'s current delivery, checked: a delivery already taken over (a message this worker had
    reserved while it was paused or cut off past the bound, since delivered again) raises Ignore after one WARNING
    line, so it never starts (a dataset chunk would take its claim from the delivery that holds it). None when
    there is nothing to fence: called directly or eagerly, no delivery tag, or a broker that is not Redis."""
    request = task.request
    tag = None if request.called_directly or request.is_eager else delivery_tag(request)
    if tag is None or not has_visibility_timeout(task.app):
        return None
    lease = Lease(task.app, tag)
    if not lease.check():
        _taken_over(what, lease, "it does not run here")
    return lease


@contextlib.contextmanager
def held(task: Any, what: str = "chunk") -> Iterator[Lease | None]:
    """Runs the body for `task`'s current delivery, fenced: not at all if it was taken over already
    (`fence_start`), and if on the way out (returning or raising) it was taken over meanwhile (swept while this
    worker was paused or cut off past the bound, so delivered again), one WARNING line and Ignore instead: the task
    reports nothing, not even a failure. Yields the lease, or None when there is nothing to fence."""
    lease = fence_start(task, what)
    if lease is None:
        yield None
        return
    try:
        yield lease
    except Exception:
        if lease.check():
            raise
        _taken_over(what, lease, "its outcome is dropped")
    if not lease.check():
        _taken_over(what, lease, "its outcome is dropped")


def _taken_over(what: str, lease: Lease, outcome: str) -> None:
    log.warning(
        "%s message %s was delivered again while this worker held it (paused or cut off for longer than the "
        "dead-delivery bound): %s, the new delivery's counts",
        what,
        lease.tag,
        outcome,
    )
    raise Ignore()
