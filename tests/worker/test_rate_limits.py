"""Rate limits (`rate_limit` on a node): one bucket per key, in-process for local runs and in Redis for the
cluster, shared by every run naming the key; the lowest declared rate wins; a hold slows every caller.

Requests go to a real loopback server that records when each one arrived: the assertion is on what the
service saw (at most the rate, plus the burst and a little for arrival jitter, in any one-second window),
which is 30 or more at once when the limit does not work."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import redis

import ir
import scheduler
from ir.models import RateLimitSpec
from scheduler import api
from scheduler.localcluster import Cluster, RedisServer
from tests.support.http_server import serving
from tests.support.kinds import starts
from worker.cluster.rate_limits import MICROS, RedisLimiter
from worker.cluster.state.keys import limit_key
from worker.engine.rate_limits import HEADROOM, LocalLimiter

#: Arrivals one window may hold beyond rate + burst: admission and arrival are not the same instant.
JITTER = 2


class Arrivals:
    """A loopback API that answers 200 and records each request's arrival time."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        arrivals = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with arrivals.lock:
                    arrivals.times.append(time.monotonic())
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def busiest_second(self) -> int:
        """The most requests that arrived within any one second."""
        times = sorted(self.times)
        most, first = 0, 0
        for last, at in enumerate(times):
            while at - times[first] > 1.0:
                first += 1
            most = max(most, last - first + 1)
        return most


@pytest.fixture
def api_server() -> Iterator[tuple[Arrivals, str]]:
    arrivals = Arrivals()
    with serving(arrivals.handler()) as url:
        yield arrivals, url


def limited_batch(url: str, key: str, rate: float, *, parallel: bool = True) -> dict:
    node = {
        "id": "call",
        "type": "http",
        "params": {"url": f"{url}/item/${{item}}"},
        "rate_limit": {"key": key, "requests_per_second": rate},
        "batch": {"items": "${items}", "parallel": parallel, "max_concurrent": 8, "error_handling": "continue"},
    }
    return {"inputs": {"items": {"type": "array"}}, "nodes": [node]}


# -- the field --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rate_limit", "problem"),
    [
        ({"key": "m", "requests_per_second": 0}, "rate_limit.requests_per_second: Input should be greater than 0"),
        ({"key": "m", "rps": 5}, "rate_limit.rps: unknown field"),
        ({"requests_per_second": 5}, "rate_limit.key: is required"),
        ({"key": "m"}, "give requests_per_second, requests_per_minute or tokens_per_minute"),
        ({"key": "m", "requests_per_second": 1, "requests_per_minute": 60}, "not both"),
        ({"key": "m", "requests_per_minute": 60, "burst": 0}, "rate_limit.burst: Input should be greater than"),
        ({"key": "m", "tokens_per_minute": -1}, "rate_limit.tokens_per_minute: Input should be greater than 0"),
    ],
)
def test_a_bad_rate_limit_is_one_line_naming_the_node_and_field(rate_limit: dict, problem: str) -> None:
    with pytest.raises(ir.ValidationError) as raised:
        ir.load({"nodes": [{"id": "a", "type": "echo", "rate_limit": rate_limit}]})
    assert "nodes[0] (id 'a')" in str(raised.value) and problem in str(raised.value)


def test_requests_per_minute_is_the_same_rate_per_second() -> None:
    assert RateLimitSpec(key="k", requests_per_minute=120).per_second == 2


# -- the bucket ----------------------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_bucket_admits_the_burst_then_one_call_per_interval() -> None:
    clock = Clock()
    limiter = LocalLimiter(clock)
    limit = RateLimitSpec(key="k", requests_per_second=10, burst=3)
    assert [limiter.admit(limit) for _ in range(3)] == [0.0, 0.0, 0.0]
    interval = 1 / (10 * HEADROOM)  # paced a little under the declared rate
    assert limiter.admit(limit) == pytest.approx(interval)
    clock.now += interval
    assert limiter.admit(limit) == 0.0
    assert limiter.admit(limit) == pytest.approx(interval)


def test_a_call_late_for_its_slot_keeps_the_cadence_but_a_quiet_spell_earns_no_credit() -> None:
    clock = Clock()
    limiter = LocalLimiter(clock)
    limit = RateLimitSpec(key="k", requests_per_second=10)
    interval = 1 / (10 * HEADROOM)
    assert limiter.admit(limit) == 0.0
    clock.now += 1.5 * interval  # half an interval late for the next slot (a waiter's sleep, a round trip)
    assert limiter.admit(limit) == 0.0
    clock.now += 0.5 * interval  # the slot after it is where it was: nothing lost to the lateness
    assert limiter.admit(limit) == 0.0
    assert limiter.admit(limit) == pytest.approx(interval)
    clock.now += 5 * interval  # quiet: the next call goes at once, the one after waits a whole interval
    assert limiter.admit(limit) == 0.0
    assert limiter.admit(limit) == pytest.approx(interval)


def test_the_lowest_declared_rate_of_a_key_wins_while_it_is_declared() -> None:
    clock = Clock()
    limiter = LocalLimiter(clock)
    fast, slow = RateLimitSpec(key="k", requests_per_second=100), RateLimitSpec(key="k", requests_per_second=2)
    assert limiter.admit(slow) == 0.0
    assert limiter.admit(fast) == pytest.approx(0.5 / HEADROOM)  # the slow run's rate holds for the fast one
    clock.now += 61  # the slow declaration is old: the fast rate is back
    assert limiter.admit(fast) == 0.0
    assert limiter.admit(fast) == pytest.approx(0.01 / HEADROOM)


def test_a_hold_makes_every_caller_wait() -> None:
    clock = Clock()
    limiter = LocalLimiter(clock)
    limit = RateLimitSpec(key="k", requests_per_second=100)
    limiter.hold(limit, 2.0)
    assert limiter.admit(limit) == pytest.approx(2.0)


def test_tokens_are_charged_after_the_call_and_stop_admissions_past_a_minute_of_them() -> None:
    clock = Clock()
    limiter = LocalLimiter(clock)
    limit = RateLimitSpec(key="k", tokens_per_minute=600)
    assert limiter.admit(limit) == 0.0
    limiter.charge(limit, 1200)  # two minutes' worth: one minute over the window
    assert limiter.admit(limit) == pytest.approx(60.0)


@pytest.fixture(scope="module")
@starts("processes")
def bucket_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    server = RedisServer(tmp_path_factory.mktemp("buckets"))
    try:
        yield redis.Redis.from_url(server.url)
    finally:
        server.kill()


def test_the_redis_bucket_follows_the_same_rule(bucket_redis: redis.Redis) -> None:
    limiter = RedisLimiter(bucket_redis)
    limit = RateLimitSpec(key="redis-rule", requests_per_second=2, burst=2)
    assert [limiter.admit(limit) for _ in range(2)] == [0.0, 0.0]
    assert 0.3 < limiter.admit(limit) <= 0.5 / HEADROOM
    limiter.hold(limit, 5.0)
    assert limiter.admit(limit) > 4.0
    slow = RateLimitSpec(key="redis-lowest", requests_per_second=1)
    fast = RateLimitSpec(key="redis-lowest", requests_per_second=1000)
    assert limiter.admit(slow) == 0.0
    assert limiter.admit(fast) > 0.5  # two runs naming one key: the lowest rate holds for both


def test_the_redis_bucket_keeps_the_cadence_of_a_call_late_for_its_slot(bucket_redis: redis.Redis) -> None:
    limiter = RedisLimiter(bucket_redis)
    limit = RateLimitSpec(key="redis-cadence", requests_per_second=10)
    interval = round(MICROS / (10 * HEADROOM))
    assert limiter.admit(limit) == 0.0
    seconds, micros = bucket_redis.time()
    now = seconds * MICROS + micros
    late = now - interval // 2  # the next slot was due half an interval ago
    bucket_redis.hset(limit_key("redis-cadence"), "tat", late)
    assert limiter.admit(limit) == 0.0
    assert int(bucket_redis.hget(limit_key("redis-cadence"), "tat")) == late + interval  # not Redis's now + interval
    bucket_redis.hset(limit_key("redis-cadence"), "tat", now - 5 * interval)  # a quiet spell
    assert limiter.admit(limit) == 0.0
    assert int(bucket_redis.hget(limit_key("redis-cadence"), "tat")) > now  # no credit: from Redis's now on


def test_the_redis_bucket_owes_tokens_until_the_next_admission(bucket_redis: redis.Redis) -> None:
    limiter = RedisLimiter(bucket_redis)
    limit = RateLimitSpec(key="redis-tokens", tokens_per_minute=60)
    assert limiter.admit(limit) == 0.0
    limiter.charge(limit, 180)  # three minutes' worth, charged with the next admission
    assert limiter.admit(limit) > 100.0


# -- runs --------------------------------------------------------------------------------------------------------
def test_a_local_batch_stays_within_its_rate(api_server: tuple[Arrivals, str]) -> None:
    arrivals, url = api_server
    result = scheduler.run(limited_batch(url, "local-api", 10), {"items": list(range(30))})
    assert result.shared["call"]["success_count"] == 30
    assert arrivals.busiest_second() <= 10 + 1 + JITTER


def test_two_cluster_runs_naming_one_key_share_its_rate(
    celery_cluster: Cluster, api_server: tuple[Arrivals, str]
) -> None:
    arrivals, url = api_server
    wf = limited_batch(url, "shared-api", 8, parallel=False)
    runs = [api.submit(wf, {"items": list(range(20))}) for _ in range(2)]
    results = [api.wait(run_id, timeout=120) for run_id in runs]
    assert [r.shared["call"]["success_count"] for r in results] == [20, 20]
    assert len(arrivals.times) == 40
    assert arrivals.busiest_second() <= 8 + 1 + JITTER


def test_a_client_driven_cluster_run_uses_the_clusters_bucket(
    celery_cluster: Cluster, api_server: tuple[Arrivals, str], tmp_path: Path
) -> None:
    """`scheduler.run(backend="celery")`: the batch's items run on workers, under the one Redis bucket."""
    arrivals, url = api_server
    result = scheduler.run(limited_batch(url, "client-api", 10, parallel=False), {"items": list(range(25))},
                           backend="celery")  # fmt: skip
    assert result.shared["call"]["success_count"] == 25
    assert arrivals.busiest_second() <= 10 + 1 + JITTER
