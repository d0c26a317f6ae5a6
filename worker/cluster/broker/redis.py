"""Redis as the broker (kombu's Redis transport): acknowledgements are emulated, so a dead worker's deliveries
come back after a visibility timeout that live workers keep renewing (broker/deliveries.py); a queue is one
Redis list per priority step, read directly for its depth and head.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from kombu.transport.redis import Channel

from worker.cluster import priorities
from worker.cluster.broker import deliveries
from worker.cluster.broker.base import READ_TIMEOUT, Broker, QueuesView, QueueView
from worker.cluster.broker.pool import SENT_AT_HEADER
from worker.cluster.state import connection


class RedisBroker(Broker):
    renews_deliveries = True

    def app_options(self) -> dict[str, Any]:
        bound = deliveries.dead_delivery_seconds(self.settings.visibility_timeout)
        return {
            # Deliveries (broker/deliveries.py): each worker renews every message it holds every few seconds, so
            # the visibility timeout is a short dead-delivery bound, at most 30 s: a dead worker's chunks, advances
            # and dataset chunks come back within it, a live worker's are never delivered twice. Swept messages get
            # a fresh delivery tag (the transport there), so a paused worker that wakes up is fenced.
            **deliveries.broker_options(self.settings.broker_url),
            "broker_transport_options": {
                "visibility_timeout": bound,
                # Sweep for deliveries past the bound every few seconds, scanning each time (kombu's default sweep
                # is ~100 s apart), and never wait long on the mutex of a sweeper that died mid-sweep (kombu's: 300 s).
                "unacked_restore_interval": deliveries.sweep_interval(bound),
                "unacked_restore_throttle": 1,
                "unacked_mutex_expire": deliveries.SWEEP_MUTEX_SECONDS,
                # A broker that vanishes without closing the socket must not hang a publish forever.
                "socket_timeout": 15,
                "socket_connect_timeout": 5,
                **connection.transport_options(self.settings.broker_url, self.settings),
                # One list per priority step (worker/cluster/priorities.py): a high run's messages pass queued ones.
                **priorities.transport_options(),
            },
        }

    def reach(self, timeout: float) -> None:
        """Nothing: the preflight pings every Redis a run needs, this one with the state store, and names it."""

    def _layout(self) -> tuple[str, str, list[int], str | None]:
        """How kombu's Redis transport lays queues out: its defaults (`kombu.transport.redis.Channel`) overridden by
        the transport options: the key prefix, the separator before a priority step, the steps, the unacked hash."""
        options = self.app_options()["broker_transport_options"]

        def option(name: str) -> Any:
            return options.get(name, getattr(Channel, name))

        unacked_key = option("unacked_key") if option("ack_emulation") else None
        return option("global_keyprefix") or "", option("sep"), sorted(set(option("priority_steps"))), unacked_key

    def lists(self, queue: str) -> list[tuple[int, str]]:
        """Each priority step of `queue` and its list (kombu pushes on the left, workers pop on the right)."""
        prefix, sep, steps, _ = self._layout()
        return [(step, prefix + (f"{queue}{sep}{step}" if step else queue)) for step in steps]

    def _client(self) -> Any:
        return connection.open_client(
            self.settings.broker_url, socket_timeout=READ_TIMEOUT, socket_connect_timeout=READ_TIMEOUT
        )

    def read_queues(self, queues: Iterable[str], now: float) -> QueuesView:
        """Each queue's lists (`_lists`); the head of each list (`LINDEX -1`, the next one a worker takes) for the
        time it was sent (`chordflow_sent_at`, stamped by broker/pool.py), and kombu's `unacked` hash."""
        prefix, _, steps, unacked_key = self._layout()
        names = list(dict.fromkeys(queues))
        if urlsplit(self.settings.broker_url).scheme not in connection.REDIS_SCHEMES:
            return QueuesView([], None)
        client = self._client()
        try:
            pipe = client.pipeline(transaction=False)
            for queue in names:
                for _, name in self.lists(queue):
                    pipe.llen(name)
                    pipe.lindex(name, -1)
            if unacked_key is not None:
                pipe.hlen(prefix + unacked_key)
            replies = pipe.execute()
        finally:
            client.close()
        views, width = [], 2 * len(steps)
        for position, queue in enumerate(names):
            mine = replies[position * width : (position + 1) * width]
            sent = [t for t in (_sent_at(head) for head in mine[1::2]) if t is not None]
            views.append(QueueView(queue, sum(mine[0::2]), max(0.0, now - min(sent)) if sent else None))
        return QueuesView(views, replies[-1] if unacked_key is not None else None)

    def lost_after(self) -> float:
        """The dead-delivery bound and a sweep of deliveries: a dead worker's messages are back in their lists."""
        bound = deliveries.dead_delivery_seconds(self.settings.visibility_timeout)
        return float(bound + deliveries.sweep_interval(bound))

    def heads(self, queue: str) -> dict[int, float]:
        """A worker killed between kombu's BRPOP and its `unacked` write loses the message it took: the head of each
        list (a message without a `chordflow_sent_at` stamp counts as sent at 0: nothing is taken for passed)."""
        lists = self.lists(queue)
        client = self._client()
        try:
            pipe = client.pipeline(transaction=False)
            for _, name in lists:
                pipe.lindex(name, -1)
            replies = pipe.execute()
        finally:
            client.close()
        return {step: _sent_at(head) or 0.0 for (step, _), head in zip(lists, replies, strict=True) if head is not None}


def _sent_at(payload: bytes | None) -> float | None:
    """When the message (kombu's JSON envelope) was sent: its `chordflow_sent_at` header, if it has one."""
    if payload is None:
        return None
    try:
        value = json.loads(payload).get("headers", {}).get(SENT_AT_HEADER)
    except (ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None
