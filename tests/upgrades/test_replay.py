"""What a previous release wrote, read by this one: every message of each kind and every run record of the replay
corpus (tests/upgrades/<tag>/, written by that release's own code: make_corpus.py) decodes to the fields that release
read from it, and the runs it left in flight — a plain run as submitted, a batch stopped mid-chunk, a dataset job as
submitted — finish `success` with the right results on a worker of this release, each item run once.

The replays load the recorded keys into the suite's own redis-server and send the recorded messages, under their
recorded task ids, to a real `celery` worker of this tree given the corpus's signing key (an upgrade keeps a
cluster's key). A message of a format newer than this release is handed back, never misread:
tests/worker/cluster/test_redis_is_data.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis

import scheduler
from scheduler.datasets import reading
from scheduler.localcluster import Cluster
from scheduler.lookup import find_run
from tests.support import counting_nodes  # noqa: F401  (the test node type, in this process too)
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from tests.upgrades import corpus
from worker.cluster import messages as m
from worker.cluster.app import current_app
from worker.cluster.datasets.store import ClusterDataset
from worker.cluster.state.runs import ClusterRuns

TIMEOUT = 120.0
#: What each recorded kind decodes with now.
KINDS = {
    "advance": m.Advance, "advance_branch": m.AdvanceBranch, "chunk": m.Chunk, "chunk_copy": m.Chunk,
    "merge": m.Merge, "merge_full": m.Merge, "dataset_chunk": m.DatasetChunk, "header": m.Header,
    m.ADVANCE: m.Advance, m.ADVANCE_BRANCH: m.AdvanceBranch, m.RUN_CHUNK: m.Chunk, m.MERGE: m.Merge,
    m.DATASET_CHUNK: m.DatasetChunk,
}  # fmt: skip


def decoded(kind: str, wire: Any) -> Any:
    if kind == "header":
        return m.Header.from_wire(wire)
    return KINDS[kind].from_wire(*wire)


def assert_same(recorded: Any, now: Any, where: str = "") -> None:
    """`now` holds every value `recorded` holds; what it has besides (a field added since) is None."""
    if isinstance(recorded, dict) and isinstance(now, dict):
        for key, value in recorded.items():
            assert key in now, f"{where}.{key}: gone"
            assert_same(value, now[key], f"{where}.{key}")
        added = {key: value for key, value in now.items() if key not in recorded}
        assert all(value is None for value in added.values()), f"{where}: fields added since hold {added}"
    else:
        assert recorded == now, f"{where}: {recorded!r} then, {now!r} now"


def plain(value: Any) -> Any:
    """A dataclass as the corpus holds one: a dict of lists, tuples gone."""
    return corpus.from_json(corpus.to_json(dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value))


@pytest.mark.parametrize("tag", corpus.TAGS)
def test_every_message_of_a_previous_release_decodes_to_the_fields_it_read(tag: str) -> None:
    written = corpus.read(tag, "messages.json")
    found = [(entry["kind"], entry) for entry in written["built"] + written["sent"]]
    assert {KINDS[kind] for kind, _ in found} == {m.Advance, m.AdvanceBranch, m.Chunk, m.Merge, m.DatasetChunk,
                                                  m.Header}  # fmt: skip
    for kind, entry in found:
        assert_same(entry["fields"], plain(decoded(kind, entry["wire"])), kind)
    # what aging kept of each message sent below the top priority (its run's `queued_msgs`), as aging reads it now
    for run in corpus.read(tag, "runs.json")["runs"].values():
        for key, entry in run["keys"].items():
            for packed in entry["value"].values() if key.endswith(":queued_msgs") else ():
                name, args, *_ = msgpack.unpackb(packed, strict_map_key=False)
                assert decoded(name, args).run == run["reads"]["record"]["run_id"]


# -- the runs a previous release left in flight, on a worker of this one ----------------------------------------------


@pytest.fixture(scope="module", params=corpus.TAGS)
@starts("cluster")
def replay(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A redis-server holding a release's corpus runs (every recorded key) and one solo worker of this tree with the
    corpus's key; this process points at it. Yields that release's runs by id."""
    runs = corpus.read(request.param, "runs.json")["runs"]
    cluster = Cluster(
        tmp_path_factory.mktemp(f"replay-{request.param}"), plugins=f"{PLUGINS},tests.support.counting_nodes"
    )
    cluster.env["CHORDFLOW_SECRET_KEY"] = corpus.SECRET_KEY
    previous = cluster.apply_env()
    try:
        r = redis.Redis.from_url(cluster.redis.url)
        for run in runs.values():
            restore(r, run)
        cluster.start_worker("now1")
        yield runs
    finally:
        cluster.restore_env(previous)
        cluster.stop()


def restore(r: redis.Redis, run: dict[str, Any]) -> None:
    """Write back every key of a recorded run, as it was, and its entries in the shared keys."""
    for key, entry in run["keys"].items():
        kind, value = entry["type"], entry["value"]
        if kind == "string":
            r.set(key, value)
        elif kind == "hash":
            r.hset(key, mapping=value)
        elif kind == "list":
            r.rpush(key, *value)
        elif kind == "set":
            r.sadd(key, *value)
        elif kind == "zset":
            r.zadd(key, {member: score for member, score in value})
        elif kind == "stream":
            for entry_id, fields in value:
                r.xadd(key, fields, id=entry_id)
        if entry["ttl"] > 0:
            r.pexpire(key, entry["ttl"])
    for key, entries in run["shared"].items():
        r.zadd(key, entries)


@pytest.fixture(params=corpus.TAGS)
@starts("processes")
def recorded(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A redis-server of its own holding a release's corpus runs, nothing running them; this process points at it."""
    runs = corpus.read(request.param, "runs.json")["runs"]
    cluster = Cluster(tmp_path, plugins=PLUGINS)  # a redis-server, no worker
    previous = cluster.apply_env()
    try:
        r = redis.Redis.from_url(cluster.redis.url)
        for run in runs.values():
            restore(r, run)
        yield runs
    finally:
        cluster.restore_env(previous)
        cluster.stop()


def test_every_run_record_of_a_previous_release_reads_the_same(recorded: dict[str, Any]) -> None:
    """The run record, the store and a dataset job's counts: what the release read is what this one reads."""
    runs = ClusterRuns()
    for run_id, run in recorded.items():
        record = runs.get(run_id)
        assert record is not None
        assert_same(run["reads"]["record"], plain(record), run_id)
        assert runs.load_store(run_id) == run["reads"]["store"]
        if "counts" in run["reads"]:
            assert ClusterDataset(run_id).counts() == run["reads"]["counts"]


@pytest.mark.parametrize("run_id", [corpus.PLAIN, corpus.BATCH, corpus.DATASET])
def test_a_run_a_previous_release_left_in_flight_finishes_on_a_worker_of_this_one(
    replay: dict[str, Any], run_id: str
) -> None:
    run = replay[run_id]
    for message in run["messages"]:  # under its own task id: a chunk a delivery of which began runs again
        current_app().send_task(message["task"], tuple(message["args"]), task_id=message["id"])
    result = scheduler.wait(run_id, timeout=TIMEOUT)
    expect = run["expect"]
    assert result.status == expect["status"], result.error
    if "outputs" in expect:
        assert result.outputs == expect["outputs"]
    if "labels" in expect:
        assert [item["label"] for item in result.shared["b"]["results"]] == expect["labels"]  # each index once
    if "rows" in expect:
        rows = dataset_rows(run_id)
        assert [[row["index"], row["result"]["label"]] for row in rows] == expect["rows"]
    key = f"corpus:{run_id.removeprefix('corpus-')}:effects"  # the test-count nodes' side effects, counted
    counted = redis.Redis.from_url(current_app().chordflow_settings.result_backend, decode_responses=True)
    assert {label: int(n) for label, n in counted.hgetall(key).items()} == expect["effects"]


def dataset_rows(run_id: str) -> list[dict[str, Any]]:
    record, _ = find_run(run_id)
    return list(reading.rows(record, is_final=lambda: True))
