"""The RunStore contract (worker/runs/store.py): the same test bodies against both stores, the embedded
SQLite one and Redis (a real redis-server this module starts), as the `backend` fixture does for backends.

What a caller may rely on whichever store it holds: records, fenced checkpoints, the trail and its steps,
the store a run goes on with, branches kept mid-section, one `rewind` over the stores' primitives, and
`purge` / `prune` leaving nothing of a run behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ir.errors import Unrecoverable
from scheduler.localcluster import RedisServer
from tests.support.kinds import starts
from worker.cluster.state.keys import RunKeys
from worker.cluster.state.runs import ClusterRuns
from worker.engine.steps import Step
from worker.runs.record import FORMAT, RunRecord, resume_refusal
from worker.runs.sqlite import LocalRuns
from worker.runs.store import RunStore, rewind


@pytest.fixture(scope="module")
@starts("processes")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("run-stores"))
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(params=["sqlite", "redis"])
def runs(request: pytest.FixtureRequest, tmp_path: Path) -> RunStore:
    if request.param == "sqlite":
        return LocalRuns(tmp_path / "runs.db")
    server: RedisServer = request.getfixturevalue("redis_server")
    client = redis.Redis.from_url(server.url)
    client.flushdb()
    return ClusterRuns(client, ttl=600)


def record(run_id: str = "r1", status: str = "running") -> RunRecord:
    workflow = {"nodes": [{"id": "a", "type": "echo"}, {"id": "b", "type": "echo"}]}
    return RunRecord(run_id, workflow, "local", status, "a")


def step(node: str, nxt: str | None, changed: dict, *, created: list[str] | None = None) -> Step:
    return Step(node, None, nxt, changed, [], config=f"cfg-{node}", reads="", created=created or [])


def test_a_created_run_is_found_with_its_store(runs: RunStore) -> None:
    runs.create(record(), {"x": [1, 2]})
    found = runs.get("r1")
    assert found is not None and (found.status, found.node, found.step) == ("running", "a", 0)
    assert runs.load_store("r1") == {"x": [1, 2]}
    assert runs.get("nope") is None


def test_one_key_of_the_store_is_read_alone(runs: RunStore) -> None:
    runs.create(record(), {"__llm_calls__": [{"model": "fake", "input_tokens": 3}], "x": 1})
    runs.checkpoint("r1", 0, step("a", "b", {"x": 2}))
    assert runs.load_key("r1", "__llm_calls__") == [{"model": "fake", "input_tokens": 3}]
    assert runs.load_key("r1", "x") == 2  # as checkpointed
    assert runs.load_key("r1", "nothing") is None and runs.load_key("nope", "x") is None


def test_encoded_values_join_the_store_as_given(runs: RunStore) -> None:
    from ir import snapshot

    runs.create(record(), {"x": 1}, encoded={"big": snapshot.encode(list(range(5)))})
    assert runs.load_store("r1") == {"x": 1, "big": [0, 1, 2, 3, 4]}


def test_a_checkpoint_moves_the_run_and_is_fenced_on_its_step(runs: RunStore) -> None:
    runs.create(record(), {})
    assert runs.checkpoint("r1", 0, step("a", "b", {"a": {"v": 1}}, created=["a"]))
    assert not runs.checkpoint("r1", 0, step("a", "b", {"a": {"v": 2}}))  # a stale writer writes nothing
    found = runs.get("r1")
    assert (found.step, found.node) == (1, "b")
    assert runs.load_store("r1") == {"a": {"v": 1}}
    assert runs.trail("r1") == ["a"]
    assert [(s.node, s.action, s.config) for s in runs.steps("r1")] == [("a", "default", "cfg-a")]


def test_status_and_recent(runs: RunStore) -> None:
    runs.create(record("r1"), {})
    runs.create(record("r2"), {})
    runs.set_status("r1", "failed", "boom", "b")
    found = runs.get("r1")
    assert (found.status, found.error, found.node) == ("failed", "boom", "b")
    assert [r.run_id for r in runs.recent("failed")] == ["r1"]
    assert {r.run_id for r in runs.recent()} == {"r1", "r2"}


def test_rewind_puts_the_store_back_as_it_was_before_the_step(runs: RunStore) -> None:
    runs.create(record(), {"x": 1})
    runs.checkpoint("r1", 0, step("a", "b", {"x": 2, "a": {"v": 1}}, created=["a"]))
    runs.checkpoint("r1", 1, step("b", None, {"x": 3, "b": {"w": 1}}, created=["b"]))
    rewind(runs, "r1", 1)
    assert runs.load_store("r1") == {"x": 2, "a": {"v": 1}}
    assert runs.trail("r1") == ["a"] and runs.get("r1").step == 1
    rewind(runs, "r1", 0)
    assert runs.load_store("r1") == {"x": 1}
    assert runs.trail("r1") == [] and runs.get("r1").step == 0


def test_a_step_without_an_undo_log_cannot_be_rewound(runs: RunStore) -> None:
    runs.create(record(), {})
    runs.checkpoint("r1", 0, Step("a", None, "b", {"a": {}}, [], config=None, reads=None, created=["a"]))
    with pytest.raises(Unrecoverable, match="cannot be rolled back"):
        rewind(runs, "r1", 0)


def test_an_edited_workflow_replaces_the_recorded_one(runs: RunStore) -> None:
    runs.create(record(), {})
    runs.set_workflow("r1", {"nodes": [{"id": "c", "type": "echo"}]}, "edited.json", "c")
    found = runs.get("r1")
    assert found.workflow == {"nodes": [{"id": "c", "type": "echo"}]} and found.node == "c"


def test_branches_are_kept_by_section(runs: RunStore) -> None:
    from ir import snapshot

    runs.create(record(), {})
    runs.save_branch("r1", "s#0", "left", snapshot.encode({"done": True}))
    runs.save_branch("r1", "s#0", "right", snapshot.encode({"done": False}))
    assert runs.load_branches("r1", "s#0") == {"left": {"done": True}, "right": {"done": False}}
    assert runs.load_branches("r1", "other#0") == {}


def test_durable_says_who_drives_the_run(runs: RunStore) -> None:
    """The one thing a caller may need to know: whether the run goes on without the process that started it."""
    assert runs.durable is isinstance(runs, ClusterRuns)
    assert runs.exception("r1") is None


def add_dataset_rows(runs: RunStore, run_id: str) -> None:
    """A dataset job's chunk of records and its outcome, where each store keeps them."""
    if isinstance(runs, LocalRuns):
        from worker.datasets.sqlite import LocalDataset

        ds = LocalDataset(run_id, runs)
        ds.start(2)
        ds.add(0, [{"a": 1}, {"a": 2}], {}, 2)
    else:
        from worker.cluster.state.keys import run_key

        for name in ("ds:rec", "ds:out", "ds:cov"):
            runs.redis.hset(run_key(run_id, name), "0", b"x")


def held_of(runs: RunStore, run_id: str) -> list[str]:
    """Everything the store still holds that names the run: rows of any table, or keys and its `cf:runs` entry."""
    if isinstance(runs, LocalRuns):
        tables = [name for (name,) in runs.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return [
            table
            for table in tables
            if "run_id" in {row[1] for row in runs.db.execute(f"PRAGMA table_info({table})")}
            and runs.db.execute(f"SELECT 1 FROM {table} WHERE run_id = ?", (run_id,)).fetchone()
        ]
    from worker.cluster.state.keys import RUNS

    held = [key.decode() for key in runs.redis.scan_iter(match=f"cf:{{{run_id}}}:*")]
    return held + ([RUNS] if runs.redis.zscore(RUNS, run_id) is not None else [])


def test_purge_deletes_every_trace_of_the_run_and_nothing_of_another(runs: RunStore) -> None:
    from ir import snapshot

    for run_id in ("r1", "r2"):
        runs.create(record(run_id, "failed"), {"x": 1})
        runs.checkpoint(run_id, 0, step("a", "b", {"x": 2, "a": {"v": 1}}, created=["a"]))
        runs.save_branch(run_id, "s#1", "left", snapshot.encode({"done": True}))
        add_dataset_rows(runs, run_id)
    assert held_of(runs, "r1")
    runs.purge("r1")
    assert held_of(runs, "r1") == []
    assert runs.get("r1") is None and runs.load_store("r1") == {} and runs.trail("r1") == []
    assert [r.run_id for r in runs.recent()] == ["r2"]
    assert runs.load_store("r2") == {"x": 2, "a": {"v": 1}} and runs.load_branches("r2", "s#1") == {
        "left": {"done": True}
    }
    runs.purge("r1")  # a run it does not hold: no error


def test_prune_deletes_ended_runs_last_updated_before_the_cutoff_never_a_running_one(runs: RunStore) -> None:
    import time

    from worker.runs.store import prune

    for run_id, status in (("done", "succeeded"), ("failed", "failed"), ("going", "running")):
        runs.create(record(run_id, status), {})
    earliest = min(r.updated for r in runs.recent())
    assert prune(runs, earliest) == 0  # nothing was updated before it
    assert len(runs.recent()) == 3
    assert prune(runs, time.time() + 60) == 2
    assert [r.run_id for r in runs.recent()] == ["going"]
    assert held_of(runs, "done") == [] and held_of(runs, "failed") == []


def test_ids_starting_finds_the_runs_a_prefix_names(runs: RunStore) -> None:
    for run_id in ("pfx-one", "pfx-two", "other"):
        runs.create(record(run_id), {})
    assert sorted(runs.ids_starting("pfx-", 10)) == ["pfx-one", "pfx-two"]
    assert runs.ids_starting("pfx-o", 10) == ["pfx-one"] and len(runs.ids_starting("pfx-", 1)) == 1
    assert runs.ids_starting("pfx_", 10) == []  # '_' is a character of an id, not a wildcard


def test_a_record_keeps_its_format_and_one_of_a_newer_release_is_not_resumed(runs: RunStore) -> None:
    """Every record carries the format it was written in (0: before formats were numbered); `resume` refuses one a
    newer release wrote rather than misread it."""
    runs.create(record("now", "failed"), {})
    runs.create(RunRecord("newer", {"nodes": []}, "local", "failed", "a", format=FORMAT + 1), {})
    now, newer = runs.get("now"), runs.get("newer")
    assert now is not None and newer is not None
    assert (now.format, newer.format) == (FORMAT, FORMAT + 1)
    assert resume_refusal(now) is None
    assert resume_refusal(newer) == (
        f"run newer was recorded by a newer chordflow (record format {FORMAT + 1}; this one reads up to {FORMAT}): "
        "resume it with that release"
    )
    if isinstance(runs, LocalRuns):  # as a row of a file from before formats were numbered
        runs.db.execute("UPDATE runs SET format = NULL WHERE run_id = 'now'")
    else:
        runs.redis.hdel(RunKeys("now").run, "format")  # type: ignore[attr-defined]
    old = runs.get("now")
    assert old is not None and old.format == 0 and resume_refusal(old) is None
