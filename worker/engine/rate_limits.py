"""Rate limits and backpressure: how one call of a node is admitted, and what happens when a service says
"too many requests".

A node's `rate_limit` (ir/models.py RateLimitSpec) names a bucket; every call of every node naming the same
key draws from it (but an `llm` call the run has the answer to, which sends nothing). The bucket is a GCRA
(generic cell rate algorithm): it keeps one time, the theoretical arrival time (TAT) of the next call; a call is
admitted when TAT - now <= the burst's tolerance, and moves TAT one emission interval (1/rate) on.
`tokens_per_minute` is a second GCRA of the same bucket, charged after the call with the tokens it reports (a
node's `tokens_used(exec_res)`), so calls are admitted while the account owes less than a minute of tokens. Two
declarations of one key share the lowest rate while both are
in use (a declaration lasts DECLARED_SECONDS after its last call).

Where the bucket lives is a Limiter: `LocalLimiter` here, in this process (local runs); on a cluster, one
in Redis that every worker shares (worker/cluster/rate_limits.py), installed with `use()` when a worker
process starts or by the run context of a client-driven cluster run.

Backpressure: a node's exec raises `Throttled` (HTTP 429, 503 with Retry-After). `call` then waits what the
service asked (else an exponential backoff with jitter), tells the bucket to hold back that long — so every
caller slows down, not only this one — and calls again without counting an attempt against `max_retries`.
Past the call's bounded wait (`Throttled.max_wait`, default DEFAULT_MAX_WAIT) the item fails with
ThrottledTooLong: a throttled call never counts as a success.

Every wait here (admission, backoff, the pause between retries) ends when the batch stops (worker/stopping.py).
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from pocketflow import BaseNode, Node

from ir.errors import SameForEveryItem, Throttled, ThrottledTooLong
from ir.models import RateLimitSpec
from worker import stopping
from worker.engine import context

#: Seconds a throttled call may wait in all (across its 429s) before its item fails.
DEFAULT_MAX_WAIT = 300.0
#: Backoff without Retry-After: BACKOFF_BASE * 2**n seconds (full jitter), at most BACKOFF_CAP.
BACKOFF_BASE = 0.5
BACKOFF_CAP = 30.0
#: A key's declared rate counts for the lowest-rate rule this long after its last call.
DECLARED_SECONDS = 60.0
#: The tokens a bucket may owe before it admits no more calls: one minute's worth.
TOKEN_WINDOW = 60.0
#: Calls are paced at this share of the declared rate. Arrivals jitter (threads, processes, the network): a
#: service counting exactly at its limit answers 429 to the calls that bunch up, and each 429 holds the whole
#: bucket back for its Retry-After. A little headroom costs 5% of the rate and keeps 429s rare.
HEADROOM = 0.95


def interval_of(limit: RateLimitSpec) -> float:
    """Seconds between two calls of the bucket (0.0: the limit counts tokens only)."""
    return 1.0 / (limit.per_second * HEADROOM) if limit.per_second else 0.0


class Limiter(Protocol):
    """Where buckets live. `admit` returns 0.0 when the call may go now, else the seconds to wait before
    asking again; `hold` makes every caller of the bucket wait `seconds`; `charge` bills tokens a call used;
    `observe` tells how long an admitted call ran (the slots a rate keeps busy: scheduler/ops/demand.py)."""

    def admit(self, limit: RateLimitSpec) -> float: ...

    def hold(self, limit: RateLimitSpec, seconds: float) -> None: ...

    def charge(self, limit: RateLimitSpec, tokens: int) -> None: ...

    def observe(self, limit: RateLimitSpec, seconds: float) -> None: ...


def _cadence(tat: float, now: float, interval: float) -> float:
    """Where an admitted call's slot starts: its theoretical time when it is late for it by less than one interval
    (the waiter's sleep and round trip made it late: several processes polling a bucket would otherwise lose that
    lateness from every slot, 15% of the rate at 200/s), else now (a quiet spell earns no credit past the burst)."""
    return tat if now - tat < interval else now


class LocalLimiter:
    """Buckets in this process (thread-safe): what local runs share."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.lock = threading.Lock()
        self.buckets: dict[str, dict[str, float]] = {}

    def _bucket(self, limit: RateLimitSpec, now: float) -> dict[str, float]:
        bucket = self.buckets.setdefault(limit.key, {"tat": now, "tok": now, "iv": 0.0, "iv_at": 0.0})
        interval = interval_of(limit)
        if interval >= bucket["iv"] or now - bucket["iv_at"] > DECLARED_SECONDS:
            bucket["iv"], bucket["iv_at"] = interval, now
        return bucket

    def admit(self, limit: RateLimitSpec) -> float:
        with self.lock:
            now = self.clock()
            bucket = self._bucket(limit, now)
            if limit.tokens_per_minute and bucket["tok"] - now > TOKEN_WINDOW:
                return bucket["tok"] - now - TOKEN_WINDOW
            interval = bucket["iv"]
            if not interval:
                return 0.0
            wait = max(bucket["tat"], now) - now - interval * (limit.burst - 1)
            if wait > 1e-9:  # float sums of intervals: a nanosecond is no wait
                return wait
            bucket["tat"] = _cadence(bucket["tat"], now, interval) + interval
            return 0.0

    def hold(self, limit: RateLimitSpec, seconds: float) -> None:
        with self.lock:
            now = self.clock()
            bucket = self._bucket(limit, now)
            interval = bucket["iv"]
            bucket["tat"] = max(bucket["tat"], now + seconds + interval * (limit.burst - 1))
            if limit.tokens_per_minute:
                bucket["tok"] = max(bucket["tok"], now + seconds + TOKEN_WINDOW)

    def charge(self, limit: RateLimitSpec, tokens: int) -> None:
        if not limit.tokens_per_minute or tokens <= 0:
            return
        with self.lock:
            now = self.clock()
            bucket = self._bucket(limit, now)
            bucket["tok"] = max(bucket["tok"], now) + tokens * 60.0 / limit.tokens_per_minute

    def observe(self, limit: RateLimitSpec, seconds: float) -> None:
        """Nothing: a local run's calls size no cluster (only the Redis buckets keep call times)."""


_default: Limiter = LocalLimiter()


def use(limiter: Limiter) -> None:
    """Make `limiter` this process's (a cluster worker installs the Redis one when it starts)."""
    global _default
    _default = limiter


def current() -> Limiter:
    """The run context's limiter, else this process's."""
    return context.current().limiter or _default


_turnstiles: dict[tuple[int, str], threading.Lock] = {}
_turnstiles_lock = threading.Lock()


def _turnstile(limiter: Limiter, key: str) -> threading.Lock:
    with _turnstiles_lock:
        return _turnstiles.setdefault((id(limiter), key), threading.Lock())


def admit(limit: RateLimitSpec, limiter: Limiter) -> None:
    """Wait until the bucket admits one call.

    The threads of a process that wait on one bucket queue at a turnstile, so only the first asks the bucket:
    64 item threads polling Redis together would cost 64 round trips per admitted call (and the CPU to make
    them), where one does.

    The batch's stop (worker/stopping.py) ends the wait, in the queue or at the bucket: a wait reserves nothing
    (a bucket moves only for a call it admits), so a wait given up leaves the bucket as the calls made left it."""
    turnstile = _turnstile(limiter, limit.key)
    stopping.acquire(turnstile)
    try:
        while True:
            stopping.check()  # never admitted once stopped: an admission is a call's slot taken
            if (wait := limiter.admit(limit)) <= 0:
                return
            stopping.sleep(min(wait, 1.0))  # asked again at least every second: a hold may move, a rate may rise
    finally:
        turnstile.release()


def backoff(attempt: int) -> float:
    """Full-jitter exponential backoff: a random wait in [0, min(cap, base * 2**attempt)]."""
    return random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt))


@functools.cache
def _plain(cls: type) -> bool:
    """Whether a node of class `cls` runs PocketFlow's own prep -> _exec (retries) -> post, so `call` may run those
    steps itself; a node class that overrides `_run` or `_exec` is run as it is, admitted once. Once per class:
    `call` asks for every node execution."""
    return cls._run is BaseNode._run and cls._exec in (BaseNode._exec, Node._exec)


def call(node: BaseNode, shared: Any, limit: RateLimitSpec | None) -> Any:
    """Run `node` on `shared` (its `_run`), admitting each attempt through its bucket and waiting out Throttled."""
    limiter = current() if limit is not None else None
    if not _plain(type(node)):
        if limiter is None:
            return node._run(shared)
        admit(limit, limiter)  # type: ignore[arg-type]
        began = time.monotonic()
        try:
            return node._run(shared)
        finally:
            limiter.observe(limit, time.monotonic() - began)  # type: ignore[arg-type]
    prep_res = node.prep(shared)
    exec_res = _attempts(node, prep_res, limit, limiter)
    return node.post(shared, prep_res, exec_res)


def runner(node: BaseNode, limit: RateLimitSpec | None) -> Callable[[Any], Any]:
    """`call(node, shared, limit)` compiled once for a node run many times (a batch's items, a sub-workflow's
    records): a plain node without a rate limit or retries runs prep -> exec -> post straight, its bound steps
    looked up once, and only an exec that raises goes on in `_attempts` (a Throttled waited out, the fallback)."""
    if limit is not None or not _plain(type(node)) or getattr(node, "max_retries", 1) > 1:
        return functools.partial(_call, node, limit)
    prep, exec_, post = node.prep, node.exec, node.post
    node.cur_retry = 0  # the only attempt's number, as `_attempts` would set it

    def run(shared: Any) -> Any:
        prep_res = prep(shared)
        try:
            exec_res = exec_(prep_res)
        except Exception as exc:
            exec_res = _attempts(node, prep_res, None, None, exc)
        return post(shared, prep_res, exec_res)

    return run


def _answered(node: BaseNode, prep_res: Any) -> bool:
    """Whether the node says this attempt sends nothing (`answered(prep_res)`: an `llm` call whose answer the run
    has kept, a provider batch's): it is not admitted, so a batch answered in a provider batch is not held to the
    rate its synchronous calls would be."""
    answered = getattr(node, "answered", None)
    return answered is not None and answered(prep_res)


def _call(node: BaseNode, limit: RateLimitSpec | None, shared: Any) -> Any:
    return call(node, shared, limit)


def _observed(node: BaseNode, prep_res: Any, limit: RateLimitSpec, limiter: Limiter) -> Any:
    """An admitted attempt's exec, its duration told to the limiter: how long a call holds its slot, whatever it
    waited to be admitted (a batch behind a limit of 10/s whose calls take t seconds keeps ~10*t slots busy)."""
    began = time.monotonic()
    try:
        return node.exec(prep_res)
    finally:
        limiter.observe(limit, time.monotonic() - began)


def _attempts(
    node: BaseNode,
    prep_res: Any,
    limit: RateLimitSpec | None,
    limiter: Limiter | None,
    raised: Exception | None = None,
) -> Any:
    """PocketFlow's retry loop (`max_retries` attempts, `wait` between, `exec_fallback` after the last), with
    an admission before each attempt and throttled attempts waited out rather than counted. `raised`: what the
    first attempt raised when a `runner` made it (the loop goes on from there)."""
    attempt, throttles, waited = 0, 0, 0.0
    while True:
        node.cur_retry = attempt
        try:
            if raised is not None:
                exc, raised = raised, None
                raise exc
            if limiter is not None and not _answered(node, prep_res):
                admit(limit, limiter)  # type: ignore[arg-type]
                exec_res = _observed(node, prep_res, limit, limiter)  # type: ignore[arg-type]
            else:
                exec_res = node.exec(prep_res)
        except Throttled as exc:
            delay = exc.retry_after if exc.retry_after is not None else backoff(throttles)
            most = exc.max_wait if exc.max_wait is not None else DEFAULT_MAX_WAIT
            if waited + delay > most:
                raise ThrottledTooLong(
                    f"{exc} (throttled for {waited:.1f}s in all, giving up after {most:g}s)"
                ) from exc
            throttles, waited = throttles + 1, waited + delay
            if limiter is not None:
                limiter.hold(limit, delay)  # type: ignore[arg-type]
            stopping.sleep(delay)
            continue
        except SameForEveryItem:
            raise  # no attempt would answer otherwise (a refused key, an unknown model): none is made
        except Exception as exc:
            if attempt >= getattr(node, "max_retries", 1) - 1:
                if isinstance(node, Node):
                    return node.exec_fallback(prep_res, exc)
                raise
            if (pause := getattr(node, "wait", 0)) > 0:
                stopping.sleep(pause)
            attempt += 1
            continue
        if limiter is not None and limit.tokens_per_minute:  # type: ignore[union-attr]
            used = getattr(node, "tokens_used", None)
            if used is not None:
                limiter.charge(limit, int(used(exec_res) or 0))  # type: ignore[arg-type]
        return exec_res
