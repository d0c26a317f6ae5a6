"""The short fault campaign: a fixed list of schedule numbers, each run on a real cluster (redis-server with AOF,
a solo and a prefork worker) while its faults hit it — workers and pool children SIGKILLed and paused, Redis
restarted, a cancel mid-fault, the client killed — and every invariant of tests/chaos/invariants.py checked after:
the result equals the local backend's (or the run failed naming the fault), each index and record once, side
effects at most once per execution begun, `max_concurrent` kept, nothing held once the run ended, a second run at
full concurrency at once, nothing left by a purge. Two schedules of the kinds drawn from 501 on: a worker host cut
off from Redis mid-item (`cut_worker`: a network namespace, made for it), and RabbitMQ's application restarted under
a dataset job (`restart_broker`: the campaign's own RabbitMQ node, ~12 s to start). `make chaos` runs more
(tests/RELIABILITY.md has the figures).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.chaos import generator
from tests.chaos.generator import Fault, Schedule
from tests.chaos.runner import Campaign, campaign
from tests.support.kinds import starts

#: Schedules whose features and faults between them cover every kind but the client's death (each 7-17 s here).
NUMBERS = (1, 2, 3, 6, 7)


#: A `cut_worker` (schedule 508: `n1` cut off 3.1 s mid-item) and a `restart_broker` (560: on RabbitMQ, down 3.2 s).
NEWEST = (508, 560)


@pytest.fixture(scope="module")
@starts("faults")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Campaign]:
    with campaign(tmp_path_factory.mktemp("chaos")) as made:
        yield made


@pytest.mark.parametrize("number", NUMBERS)
def test_a_schedule_keeps_every_invariant(chaos: Campaign, number: int) -> None:
    verdict = chaos.check(generator.generate(number))
    assert verdict.violations == [], "\n".join([verdict.line(), *verdict.violations])


@pytest.mark.parametrize("number", NEWEST)
def test_a_schedule_of_the_newest_kinds_keeps_every_invariant(chaos: Campaign, number: int) -> None:
    verdict = chaos.check(generator.generate(number))
    assert verdict.violations == [], "\n".join([verdict.line(), *verdict.violations])


def test_schedule_4_keeps_its_invariants(chaos: Campaign) -> None:
    """Shrunk from schedule 4 (an even schedule's client drives the run: `scheduler.run(backend="celery")` in a
    process of its own, SIGKILLed mid-batch); it broke:
    schedule 4: purge: run cl... left ['cf:{cl...}:totals', 'cf:{cl...}:chunks', 'cf:{cl...}:failed:b#0',
    'cf:{cl...}:win:b#0:begun', 'cf:{cl...}:meta', 'cf:{cl...}:events', 'cf:{cl...}:result:b#0']
    (`purge` of a client-driven run deleted its record from the embedded store only; scheduler/api.py `purge` now
    purges its Redis keys too.)
    """
    schedule = Schedule(number=4, features=(), items=10, chunk_size=4, seconds=0.1, faults=(Fault("kill_client", 3),))
    verdict = chaos.check(schedule)
    assert verdict.violations == [], verdict.line()
