"""The lease of a running chunk: while its worker is alive and running it, a chunk is not delivered again.

kombu's Redis transport emulates acknowledgements. A message a worker has received and not yet
acknowledged sits in the hash `unacked` (its payload, by delivery tag) and in the sorted set
`unacked_index` (member: the delivery tag; score: the time it was received), and every worker's sweeper
(`QoS.restore_visible`, every `unacked_restore_interval` seconds) puts back on its queue each message
whose score is older than the visibility timeout. The sweeper knows nothing of workers: on the timeout
alone, a chunk that runs longer than it is delivered again while its worker is still running it, and
again, and again (issue 8: 20k items in 11 s chunks under an 8 s timeout never finished).

A lease is the running chunk's heartbeat in that index: a daemon thread moves the entry's score to now
every third of the visibility timeout, and only while the entry exists (ZADD XX), so a message that was
acknowledged or already swept is never added back. A worker that dies (SIGKILL, lost host) stops
renewing with it, and its chunk is delivered again once the timeout has passed, as before.

Redis brokers only. AMQP (RabbitMQ) has no visibility timeout: an unacknowledged message goes back to its
queue when the consumer's connection closes, so a long chunk of a live worker is never delivered again and
there is nothing to renew. The index's key, the visibility timeout and the Redis client come from kombu's
own channel for the app's broker settings (transport options, `global_keyprefix`, sentinel), so they are
the ones its sweeper uses.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

#: Renewals per visibility timeout: two may be missed (Redis slow for a moment) before a sweeper takes the chunk.
RENEWALS_PER_TIMEOUT = 3
#: Seconds `stop()` waits for a renewal in flight.
STOP_TIMEOUT = 5.0

_channels: dict[tuple[Any, ...], Any] = {}  # (pid, broker uri, transport options) -> kombu Redis channel
_channels_lock = threading.Lock()


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
    """Keeps one unacknowledged message from being delivered again until `stop()`.

    Parameters: the task's Celery app (its broker holds the message) and the message's delivery tag. The first
    renewal happens right after `start()`, in the lease's thread: a chunk never waits on its lease.
    """

    def __init__(self, app: Any, tag: str):
        self.app = app
        self.tag = tag
        #: Renewals that found the entry and moved it.
        self.renewals = 0
        #: True once a renewal found no entry: the message was swept while running, so it runs elsewhere too.
        self.lapsed = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chordflow-lease-{tag}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=STOP_TIMEOUT)

    def renew(self, channel: Any) -> bool:
        """Move the entry's score to now; False when there is no entry (acknowledged, or swept already)."""
        with channel.conn_or_acquire() as client:
            return bool(client.zadd(channel.unacked_index_key, {self.tag: time.time()}, xx=True, ch=True))

    def _run(self) -> None:
        channel, interval = None, 1.0  # retry pace until the channel (and its visibility timeout) is known
        while not self._stopped.is_set():
            try:
                if channel is None:
                    channel = redis_channel(self.app)
                    if channel is None:
                        return
                    interval = max(0.1, channel.visibility_timeout / RENEWALS_PER_TIMEOUT)
                if not self.renew(channel):
                    self.lapsed = True
                    log.warning(
                        "chunk message %s was delivered again before it finished (its lease lapsed): "
                        "its items may run twice",
                        self.tag,
                    )
                    return
                self.renewals += 1
            except Exception as exc:  # broker away for a moment (redis or kombu errors): the next beat tries again
                log.warning("could not renew the lease of chunk message %s: %s", self.tag, exc)
            self._stopped.wait(interval)


@contextlib.contextmanager
def held(task: Any) -> Iterator[Lease | None]:
    """While the body runs, the message of `task`'s current request is not delivered again. Yields the lease, or
    None when there is nothing to hold: called directly or eagerly, no delivery tag, or a broker that is not Redis."""
    request = task.request
    tag = None if request.called_directly or request.is_eager else delivery_tag(request)
    if tag is None or not has_visibility_timeout(task.app):
        yield None
        return
    lease = Lease(task.app, tag)
    lease.start()
    try:
        yield lease
    finally:
        lease.stop()
