"""Rate-limit buckets in Redis: one per key for the whole cluster, shared by every run and every worker.

The same GCRA as worker/engine/rate_limits.py LocalLimiter, in one Lua script (state/lua/rate_limit.lua)
run on Redis's clock: one round trip per admission. Tokens a call reports are owed in this process and
charged with the next admission of the same key, so counting tokens costs no round trip of its own; so are the
seconds admitted calls ran (`observe`), which the bucket keeps as a moving average (`call_us`) for the metrics'
desired workers (scheduler/ops/demand.py).
"""

from __future__ import annotations

import threading
from collections import defaultdict

import redis

from ir.errors import Outage
from ir.models import RateLimitSpec
from worker.cluster.state.keys import limit_key
from worker.cluster.state.runstate import script
from worker.engine.rate_limits import DECLARED_SECONDS, TOKEN_WINDOW, interval_of

#: A bucket nobody used for this long is forgotten (its rate, its debts).
BUCKET_TTL = 3600
MICROS = 1_000_000


class RedisLimiter:
    """A Limiter (worker/engine/rate_limits.py) whose buckets live in the state store's Redis."""

    def __init__(self, client: redis.Redis):
        self.redis = client
        self._script = script(client, "rate_limit")
        self._owed: dict[str, int] = defaultdict(int)
        self._ran: dict[str, tuple[int, int]] = {}  # key -> (us admitted calls ran, calls) not yet told the bucket
        self._lock = threading.Lock()

    def _call(self, op: str, limit: RateLimitSpec, amount: float, ran: tuple[int, int] = (0, 0)) -> float:
        per_call = round(interval_of(limit) * MICROS)
        per_token = round(60 * MICROS / limit.tokens_per_minute) if limit.tokens_per_minute else 0
        args = [op, per_call, limit.burst, per_token, amount, int(DECLARED_SECONDS * MICROS)]
        args += [int(TOKEN_WINDOW * MICROS), BUCKET_TTL, *ran]
        try:
            return int(self._script(keys=[limit_key(limit.key)], args=args)) / MICROS
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # raised inside the node: not its error
            raise Outage(f"rate limit '{limit.key}': Redis out of reach: {exc}") from exc

    def admit(self, limit: RateLimitSpec) -> float:
        with self._lock:
            owed = self._owed.pop(limit.key, 0)
            ran = self._ran.pop(limit.key, (0, 0))
        try:
            return self._call("admit", limit, owed, ran)
        except BaseException:
            if owed:
                self.charge(limit, owed)  # not charged: owed still
            if ran[1]:
                self._add_ran(limit.key, *ran)
            raise

    def hold(self, limit: RateLimitSpec, seconds: float) -> None:
        self._call("hold", limit, round(seconds * MICROS))

    def charge(self, limit: RateLimitSpec, tokens: int) -> None:
        if limit.tokens_per_minute and tokens > 0:
            with self._lock:
                self._owed[limit.key] += tokens

    def observe(self, limit: RateLimitSpec, seconds: float) -> None:
        self._add_ran(limit.key, round(seconds * MICROS), 1)

    def _add_ran(self, key: str, micros: int, calls: int) -> None:
        with self._lock:
            total, count = self._ran.get(key, (0, 0))
            self._ran[key] = (total + micros, count + calls)
