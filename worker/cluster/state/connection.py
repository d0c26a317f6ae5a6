"""Every Redis client chordflow opens is made here (`open_client`), so each understands the same URLs.

Besides `redis://`, `rediss://` and `unix://`, Celery's Sentinel syntax: `sentinel://host:26379;sentinel://host2:26379`
(optionally `/db` and a password on the first address), with the primary's name in CHORDFLOW_REDIS_MASTER_NAME.
A Sentinel client asks the sentinels for the current primary at each new connection, so after a failover a
command that lost its connection reconnects to the promoted replica (within the outage budget's retries).

With CHORDFLOW_WAIT_REPLICAS=N, `replicated` makes the writes a run cannot lose (a batch chunk's outcomes, every
step of a dataset job) wait until N replicas hold them: asynchronous replication otherwise loses what the primary
acknowledged in its last milliseconds when it dies, and a worker would ack a chunk whose outcomes are gone; a
write no replica acknowledged in time fails its chunk (ReplicationLost) rather than count as done.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

from ir.errors import ReplicationLost
from worker import settings

SENTINEL_SCHEME = "sentinel"
#: The schemes of a Redis URL (a broker or the state store) that `open_client` opens.
REDIS_SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME)
#: How long the sentinels themselves may take to answer "who is the primary?" (seconds).
SENTINEL_TIMEOUT = 2.0
#: How long a replicated write waits for its replicas before the write counts as lost (milliseconds).
WAIT_TIMEOUT_MS = 1000


class BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """Connections to the primary the sentinels name, and a caller waits for a free one (as runstate's pool)."""


def is_sentinel(url: str) -> bool:
    return urlsplit(url.split(";", 1)[0]).scheme == SENTINEL_SCHEME


def sentinel_addresses(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The sentinels of a `sentinel://a:26379;sentinel://b:26379/0` URL, and the db/username/password of the
    primary (from the first address that has them)."""
    addresses: list[tuple[str, int]] = []
    params: dict[str, Any] = {}
    for chunk in filter(None, url.split(";")):
        parts = urlsplit(chunk)
        if parts.scheme != SENTINEL_SCHEME:
            raise ValueError(f"a Sentinel URL lists sentinel:// addresses only, got {parts.scheme}:// in it")
        addresses.append((parts.hostname or "127.0.0.1", parts.port or 26379))
        if parts.path.strip("/") and "db" not in params:
            params["db"] = int(parts.path.strip("/"))
        if parts.password and "password" not in params:
            params["password"] = unquote(parts.password)
            if parts.username:
                params["username"] = unquote(parts.username)
    return addresses, params


def master_name() -> str:
    """CHORDFLOW_REDIS_MASTER_NAME (`settings.load` says in one line when a Sentinel URL has none)."""
    return settings.load().redis_master_name


def transport_options(url: str, s: settings.Settings) -> dict[str, Any]:
    """What Celery's broker or result backend needs besides a `sentinel://` URL: the primary's name."""
    return {"master_name": s.redis_master_name} if is_sentinel(url) else {}


def open_client(url: str, *, blocking: bool = False, **options: Any) -> redis.Redis:
    """A client of the Redis at `url` (a Sentinel URL: of its current primary); `options` go to its connection
    pool (timeouts, retry, max_connections; `timeout` only with `blocking`, a pool that waits for a connection)."""
    if not is_sentinel(url):
        pool_class = redis.BlockingConnectionPool if blocking else redis.ConnectionPool
        return redis.Redis(connection_pool=pool_class.from_url(url, **options))
    addresses, params = sentinel_addresses(url)
    sentinels = Sentinel(
        addresses,
        sentinel_kwargs={"socket_timeout": SENTINEL_TIMEOUT, "socket_connect_timeout": SENTINEL_TIMEOUT},
    )
    pool_class = BlockingSentinelPool if blocking else SentinelConnectionPool
    return sentinels.master_for(master_name(), connection_pool_class=pool_class, **params, **options)


def replicated(client: redis.Redis, script: Any, keys: list[Any], args: list[Any], what: str) -> Any:
    """`script(keys, args)` on `client`, the writes that matter; with CHORDFLOW_WAIT_REPLICAS=N, followed on the same
    connection (WAIT counts that connection's writes) by a WAIT for N replicas. The script's reply.

    Raises ReplicationLost ("... acknowledged `what` ...") when fewer replicas acknowledged within WAIT_TIMEOUT_MS:
    the writes may be lost in a failover, so the writer must not report them done."""
    wanted = int(settings.get("wait_replicas"))
    if wanted <= 0:
        return script(keys=keys, args=args)
    pipe = client.pipeline(transaction=False)  # not MULTI: WAIT does not block inside a transaction
    script(keys=keys, args=args, client=pipe)
    pipe.execute_command("WAIT", wanted, WAIT_TIMEOUT_MS)
    reply, acknowledged = pipe.execute()
    if acknowledged < wanted:
        raise ReplicationLost(
            f"state may be lost in a Redis failover: {acknowledged} of {wanted} replicas (CHORDFLOW_WAIT_REPLICAS) "
            f"acknowledged {what} within {WAIT_TIMEOUT_MS / 1000:g} s"
        )
    return reply
