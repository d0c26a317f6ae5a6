"""Reaching the cluster: `preflight` before asking it anything (one PING to each Redis a run needs, one
connection to a RabbitMQ broker), `broker_errors` around what is asked later; each failure one clear line
(BackendError) instead of a worker hint, kombu's retries or a traceback.

Celery is not imported here: `chordflow wait` and `results` of a cluster run reach it through this and read
Redis, and a Celery import would be most of their start-up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from urllib.parse import urlsplit

import kombu.exceptions
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ir.errors import BackendError
from worker import redact, settings
from worker.cluster import outage
from worker.cluster.state import connection

#: Seconds the preflight PING waits to connect to, and to hear from, each Redis the run needs.
PREFLIGHT_TIMEOUT = 1.0
#: Seconds the preflight waits for sentinels to name a primary (a failover takes a few, past their down-after).
FAILOVER_SECONDS = 30


def auth_failure(url: str, exc: BaseException) -> str | None:
    """The "authentication failed" message when Redis refused the URL's credentials (also via kombu), else None."""
    for each in (exc, exc.__cause__, exc.__context__):
        if isinstance(each, redis.AuthenticationError) or str(each).startswith(("NOAUTH", "WRONGPASS")):
            why = "wrong user or password" if urlsplit(url).password else "the server requires a password"
            return f"authentication failed for Redis at {redact.mask_url(url)}: {why}"
    return None


def preflight(s: settings.Settings, timeout: float = PREFLIGHT_TIMEOUT) -> None:
    """One PING to each Redis the run needs (broker, state), before anything else asks them.

    A broker that is not Redis (RabbitMQ) is connected to once (`Broker.reach`). Behind Sentinel, sentinels
    that name no primary yet are a failover under way: the PING waits up to FAILOVER_SECONDS for one.
    """
    if urlsplit(s.broker_url).scheme not in connection.REDIS_SCHEMES:
        from worker.cluster.broker.registry import for_settings  # kombu's transports: only for such a broker

        try:
            for_settings(s).reach(timeout)
        except (kombu.exceptions.OperationalError, OSError) as exc:
            where = redact.mask_url(s.broker_url)
            raise BackendError(redact.mask(f"cannot reach the broker at {where} ({exc})")) from exc
    for url in dict.fromkeys([s.broker_url, s.result_backend]):
        if urlsplit(url).scheme not in connection.REDIS_SCHEMES:
            continue
        retry = outage.DeadlineRetry(FAILOVER_SECONDS) if connection.is_sentinel(url) else Retry(NoBackoff(), 0)
        probe = connection.open_client(url, socket_connect_timeout=timeout, socket_timeout=timeout, retry=retry)
        try:
            probe.ping()
        except (redis.RedisError, OSError) as exc:
            message = auth_failure(url, exc) or f"cannot reach Redis at {redact.mask_url(url)} ({exc})"
            raise BackendError(redact.mask(message)) from exc
        finally:
            probe.close()


@contextlib.contextmanager
def broker_errors(url: str) -> Iterator[None]:
    """Turns a lost Redis connection into one clear BackendError instead of a traceback or a hang."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, kombu.exceptions.OperationalError, OSError) as exc:
        message = (
            auth_failure(url, exc)
            or pool_exhausted(exc)
            or f"lost the connection to Redis at {redact.mask_url(url)}: {exc}"
        )
        raise BackendError(redact.mask(message)) from exc


def pool_exhausted(exc: BaseException) -> str | None:
    """Every connection (or producer) of this process's broker pool stayed busy: that, not a lost Redis."""
    text = str(exc)
    return text if text.startswith("Timed out waiting for a broker") else None
