"""Schedules on a real cluster (worker/cluster/schedules.py): the workers make each fire's run themselves, exactly one
per fire, whatever the number of workers, their restarts and outages.

- The contract: every 10 s on THREE workers, each restarted (SIGKILL or SIGTERM) between two fires: exactly one run
  per fire, each run once and succeeded.
- Every worker SIGKILLed through two fires, then started: catchup `all` makes a run per missed fire, `last` one run
  (the latest), `none` none.
- Sweeps at the same moment, a run made from eight threads at once, a sweep done again after dying before it set the
  next fire time: one run per fire (the idempotency claim). A template altered in Redis makes no run; a paused
  schedule none until resumed.

Which run a fire made is read from its claim (`cf:{idem:schedule:<name>:<fire>}`); a test node appends to a file for
each run it ran, so "ran once" is a fact on disk."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import scheduler
from ir.errors import UnknownSchedule
from scheduler.localcluster import Cluster
from tests.scheduler.test_durable import lines, side_effect, until, write_wf
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from worker.cluster.app import current_app
from worker.cluster.schedules import Cron, fire_key, make_run, sweep
from worker.cluster.state.keys import SCHEDULES, SCHEDULES_DUE, idempotency_key
from worker.cluster.state.runs import ClusterRuns
from worker.cluster.state.runstate import client
from worker.cluster.state.schedules import Schedules

#: Fires of the contract test, 10 s apart.
FIRES = 5


def made(name: str, fire: int) -> str | None:
    """The run the schedule's fire made, once it is recorded."""
    held = client().get(idempotency_key(fire_key(name, fire)))
    run_id = None if held is None else held.decode().split(" ", 1)[0]
    return run_id if run_id is not None and ClusterRuns().get(run_id) is not None else None


def shown(name: str) -> dict:
    [found] = [each for each in scheduler.list_schedules() if each["name"] == name]
    return found


@pytest.fixture
@starts("cluster", "faults")
def own_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A redis-server of its own (so every run in it is a schedule's) and no worker yet; this process points at it."""
    cluster = Cluster(tmp_path, plugins=PLUGINS)
    previous = cluster.apply_env()
    try:
        yield cluster
    finally:
        cluster.restore_env(previous)
        cluster.stop()


def test_three_workers_make_exactly_one_run_per_fire_through_restarts(own_cluster: Cluster, tmp_path: Path) -> None:
    began = time.monotonic()
    for worker in ("s1", "s2", "s3"):
        own_cluster.start_worker(worker)
    log = tmp_path / "ran.log"
    wf = write_wf(tmp_path, {"nodes": [side_effect("tick", log, label="tick for ${who}")]})
    name = "every-10s"
    added = scheduler.schedule(name, str(wf), "*/10 * * * * *", inputs={"who": "ann"})
    fires = [added["next_fire"] + 10 * i for i in range(FIRES)]
    restarts = {1: ("s1", signal.SIGKILL), 2: ("s2", signal.SIGTERM), 3: ("s3", signal.SIGKILL)}
    runs = []
    for i, fire in enumerate(fires):
        run = until(lambda fire=fire: made(name, fire), 30, f"the run of fire {i}")
        assert scheduler.wait(run, timeout=60).status == "success"
        runs.append(run)
        if i in restarts:  # a worker goes, and comes back, between two fires
            worker, how = restarts[i]
            own_cluster.workers[worker].kill(how)
            own_cluster.start_worker(worker)
    assert (shown(name)["last_fire"], shown(name)["last_run"]) == (fires[-1], runs[-1])
    scheduler.unschedule(name)  # the next fire is 8 s or more away
    assert len(set(runs)) == FIRES
    assert {r.run_id for r in ClusterRuns().recent(limit=100)} == set(runs)  # no other run was recorded
    assert lines(log) == ["tick for ann"] * FIRES  # each ran once, with the input the schedule was given
    records = [ClusterRuns().get(run) for run in runs]
    late = sorted(record.created - fire for record, fire in zip(records, fires, strict=True))  # type: ignore[union-attr]
    assert late[0] >= 0 and late[-1] < 10  # each made after its time, before the next fire's
    print(f"\n{FIRES} fires on 3 workers, 3 restarts: {time.monotonic() - began:.1f} s; each run made after its fire "
          f"by {', '.join(f'{s:.2f}' for s in late)} s")  # fmt: skip


def test_every_worker_down_through_two_fires_then_each_catchup(own_cluster: Cluster, tmp_path: Path) -> None:
    own_cluster.start_worker("o1")
    own_cluster.start_worker("o2")
    wf = write_wf(tmp_path, {"nodes": [{"id": "e", "type": "echo", "params": {"at": "now"}}]})
    names = {catchup: f"catchup-{catchup}" for catchup in ("all", "last", "none")}
    first = max(
        scheduler.schedule(name, str(wf), "*/20 * * * * *", catchup=catchup)["next_fire"]
        for catchup, name in names.items()
    )
    for name in names.values():
        assert scheduler.wait(until(lambda name=name: made(name, first), 40, "the first fire"), 60).status == "success"
    for worker in list(own_cluster.workers.values()):
        worker.kill(signal.SIGKILL)
    missed = [first + 20, first + 40]
    while time.time() < first + 46:  # the outage: two fires pass with no worker (nothing to wait on but the clock)
        time.sleep(0.1)
    assert [made(name, fire) for name in names.values() for fire in missed] == [None] * 6
    own_cluster.start_worker("o1")  # one is enough to sweep
    assert time.time() < first + 58, "the workers took so long to start that the next fire would stand for the missed"
    for name in names.values():  # swept: its next fire is the first after the restart
        until(lambda name=name: shown(name)["next_fire"] == first + 60, 10, f"{name} swept")
    runs = {catchup: [made(name, fire) for fire in missed] for catchup, name in names.items()}
    assert runs["all"][0] and runs["all"][1] and runs["all"][0] != runs["all"][1]
    assert runs["last"][0] is None and runs["last"][1]
    assert runs["none"] == [None, None]
    for run in [*runs["all"], runs["last"][1]]:
        assert scheduler.wait(run, timeout=60).status == "success"


@pytest.fixture
def yearly(celery_cluster: Cluster, tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A schedule on the suite's cluster whose fire (next 1 January) the test makes come with a `now` of its own: the
    workers' own sweeps, on the real clock, never find it due."""
    name = f"yearly-{uuid.uuid4().hex[:8]}"
    wf = write_wf(tmp_path, {"nodes": [{"id": "e", "type": "echo", "params": {"text": "new year"}}]})
    yield name, scheduler.schedule(name, str(wf), "0 0 1 1 *")["next_fire"]
    with contextlib.suppress(UnknownSchedule):
        scheduler.unschedule(name)


def test_sweeps_at_once_make_one_run_and_a_sweep_done_again_makes_none(yearly: tuple[str, int]) -> None:
    name, fire = yearly
    app, start = current_app(), threading.Barrier(8)

    def one_sweep(counts: list[int]) -> None:
        start.wait()
        counts.append(sweep(app, fire + 1))

    counts: list[int] = []
    threads = [threading.Thread(target=one_sweep, args=(counts,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run = made(name, fire)
    assert sum(counts) == 1 and run is not None
    assert scheduler.wait(run, timeout=60).status == "success"
    assert (shown(name)["last_fire"], shown(name)["last_run"]) == (fire, run)
    assert shown(name)["next_fire"] == Cron("0 0 1 1 *").after(fire + 1)  # a year on
    # A sweep that died after making the run, before setting the next fire time, is done again: nothing new.
    client().zadd(SCHEDULES_DUE, {name: fire})
    assert sweep(app, fire + 2) == 0 and made(name, fire) == run
    assert shown(name)["next_fire"] == Cron("0 0 1 1 *").after(fire + 2)


def test_eight_threads_making_one_fires_run_make_one(yearly: tuple[str, int]) -> None:
    name, fire = yearly
    template, app, start = Schedules(client()).get(name), current_app(), threading.Barrier(8)
    assert template is not None
    results: list[tuple[str, bool]] = []

    def make() -> None:
        start.wait()
        results.append(make_run(app, template, fire))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [new for _, new in results].count(True) == 1 and len({run for run, _ in results}) == 1
    assert scheduler.wait(results[0][0], timeout=60).status == "success"  # the advances sent again were fenced


def test_a_template_altered_in_redis_makes_no_run(yearly: tuple[str, int], caplog: pytest.LogCaptureFixture) -> None:
    name, fire = yearly
    template = Schedules(client()).get(name)
    assert template is not None
    template.workflow["nodes"][0]["params"]["text"] = "not what was signed"
    client().hset(SCHEDULES, name, template.pack())
    with caplog.at_level(logging.WARNING, logger="worker.cluster.schedules"):
        assert sweep(current_app(), fire + 1) == 0
    assert f"schedule {name!r}: its template in Redis does not match its signature" in caplog.text
    assert made(name, fire) is None and shown(name)["next_fire"] is None  # off the due list until added again


def test_a_paused_schedule_makes_no_run_until_resumed(yearly: tuple[str, int]) -> None:
    name, fire = yearly
    assert scheduler.pause_schedule(name)["paused"] is True
    assert sweep(current_app(), fire + 1) == 0 and made(name, fire) is None
    assert scheduler.resume_schedule(name)["next_fire"] == fire
    assert sweep(current_app(), fire + 1) == 1 and made(name, fire) is not None
