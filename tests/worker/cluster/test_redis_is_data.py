"""Redis content is data, never code: what a worker runs is authenticated, replays do nothing, and a message or run
record of a newer release is handed back, never misread.

A cluster of its own (a redis-server and real `celery -A worker.app worker` processes, with a random key this
process signs with too). The attacker here can write Redis, as anyone holding its password can: it rewrites a
run's workflow with one HSET while the run is going, and pushes a captured task message to the broker list again.
Side effects are counted in Redis (`test-count`, tests/support/counting_nodes.py) or are files a `shell` node
would create.
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu.serialization import dumps, loads

import scheduler
from scheduler import api
from scheduler.localcluster import Cluster, ManagedProcess
from tests.support import counting_nodes  # noqa: F401  (the test node type, in this process too)
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from worker import settings
from worker.cluster import messages, priorities, signing
from worker.cluster.app import current_app
from worker.cluster.state.keys import done_key, run_key
from worker.cluster.state.runs import ClusterRuns
from worker.runs.record import FORMAT, RunRecord

TIMEOUT = 120.0
ALTERED = "its workflow in Redis does not match its signature (altered?); refused"


@pytest.fixture(scope="module")
@starts("cluster")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One solo worker `u1`; a 4 s dead-delivery bound, so a killed worker's message comes back soon."""
    own = Cluster(
        tmp_path_factory.mktemp("redis-is-data"),
        visibility_timeout=4,
        plugins=f"{PLUGINS},tests.support.counting_nodes",
    )
    previous = own.apply_env()
    try:
        own.start_worker("u1")
        yield own
    finally:
        own.restore_env(previous)
        own.stop()


@pytest.fixture
def r(cluster: Cluster) -> redis.Redis:
    return redis.Redis.from_url(cluster.redis.url)


@pytest.fixture
def worker(cluster: Cluster) -> ManagedProcess:
    return cluster.workers["u1"]


def count(key: str, label: str, node_id: str = "c", **extra: Any) -> dict[str, Any]:
    """A node that records `<worker> <label>` in `<key>:runs` as it starts and counts its effect in `<key>:effects`."""
    return {"id": node_id, "type": "test-count", "params": {"key": key, "label": label}, **extra}


def shell(path: Path, node_id: str) -> dict[str, Any]:
    return {"id": node_id, "type": "shell", "params": {"command": f"touch {path}"}}


def until(check: Any, what: str, timeout: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def rewrite_workflow(r: redis.Redis, run_id: str, change: Any) -> None:
    """What an attacker with Redis's password does: one HSET of the run record's workflow, no key needed."""
    workflow = json.loads(r.hget(run_key(run_id, "run"), "workflow"))
    change(workflow)
    r.hset(run_key(run_id, "run"), "workflow", json.dumps(workflow))


def warnings_about(worker: ManagedProcess, text: str) -> list[str]:
    return [line for line in worker.log.read_text().splitlines() if "WARNING" in line and text in line]


def test_a_shell_node_written_into_a_running_runs_workflow_never_runs(
    r: redis.Redis, worker: ManagedProcess, tmp_path: Path
) -> None:
    """Mid-batch (the batch's item held), n2 becomes a `shell` node; the advance after the batch refuses the run."""
    key, pwned = f"wf-{uuid.uuid4().hex[:8]}", tmp_path / "pwned"
    r.set(f"{key}:hold:u1:0", 1)
    wf = {
        "nodes": [count(key, "${item}", "b", batch={"items": "${items}"}), {"id": "n2", "type": "echo"}],
        "edges": [{"from": "b", "to": "n2"}],
    }
    run_id = scheduler.submit(wf, {"items": [0]})
    until(lambda: r.lrange(f"{key}:runs", 0, -1), "the batch's item to start")

    def evil(workflow: dict[str, Any]) -> None:
        workflow["nodes"][1] = shell(pwned, "n2")

    rewrite_workflow(r, run_id, evil)
    r.delete(f"{key}:hold:u1:0")
    with pytest.raises(signing.WorkflowAltered, match="does not match its signature"):
        scheduler.wait(run_id, timeout=TIMEOUT)
    record = ClusterRuns().get(run_id)
    assert record is not None and record.status == "failed"
    assert record.error == f"WorkflowAltered: run {run_id}: {ALTERED}"
    assert r.hgetall(f"{key}:effects") == {b"0": b"1"}  # the batch, signed in its chunk message, ran
    line = worker.wait_for_line(f"run {run_id}: running -> failed", TIMEOUT)
    assert "WARNING" in line and ALTERED in line
    assert len(warnings_about(worker, run_id)) == 1
    assert not pwned.exists()


def test_a_shell_node_written_into_a_dataset_jobs_workflow_never_runs(
    r: redis.Redis, worker: ManagedProcess, tmp_path: Path
) -> None:
    """Chunk 0 of six one-record chunks is held; the workflow becomes a `shell` node; no later chunk runs."""
    key, pwned = f"ds-{uuid.uuid4().hex[:8]}", tmp_path / "pwned"
    r.set(f"{key}:hold:u1:0", 1)
    run_id = scheduler.submit({"nodes": [count(key, "${record}")]}, items=list(range(6)), chunk_size=1)
    until(lambda: r.lrange(f"{key}:runs", 0, -1), "the first record to start")

    def evil(workflow: dict[str, Any]) -> None:
        workflow["nodes"] = [shell(pwned, "c")]

    rewrite_workflow(r, run_id, evil)
    r.delete(f"{key}:hold:u1:0")
    with pytest.raises(signing.WorkflowAltered, match="does not match its signature"):
        scheduler.wait(run_id, timeout=TIMEOUT)
    record = ClusterRuns().get(run_id)
    assert record is not None and record.status == "failed" and ALTERED in (record.error or "")
    assert r.lrange(f"{key}:runs", 0, -1) == [b"u1 0"]  # the chunk begun before the change; no record after it
    line = worker.wait_for_line(f"run {run_id}: running -> failed", TIMEOUT)
    assert "WARNING" in line and ALTERED in line
    until(lambda: not r.llen(settings.load().queue) and not r.hlen("unacked"), "the chunks in flight to be taken")
    assert len(warnings_about(worker, run_id)) == 1
    assert not pwned.exists()


def test_a_run_record_verifies_only_for_its_own_run_workflow_and_dataset(r: redis.Redis) -> None:
    signer = current_app().signer
    assert signer is not None
    runs = ClusterRuns(r, ttl=600, signer=signer)
    wf = {"nodes": [{"id": "n", "type": "echo"}]}
    for run_id in ("sig-a", "sig-b"):
        runs.create(RunRecord(run_id, wf, "celery", dataset={"as_": "record"} if run_id == "sig-b" else None), {})
    a, b = runs.get("sig-a"), runs.get("sig-b")
    assert a is not None and b is not None
    signing.check_run(signer, "sig-a", a)
    signing.check_run(signer, "sig-b", b)
    signing.check_run(None, "sig-a", RunRecord("sig-a", {"nodes": []}, "celery"))  # an insecure worker: no check
    altered = [
        ("sig-b", a),  # run a's workflow and signature copied into run b's record
        ("sig-a", RunRecord("sig-a", a.workflow, "celery", dataset={"as_": "record"}, signature=a.signature)),
        ("sig-b", RunRecord("sig-b", b.workflow, "celery", dataset={"as_": "row"}, signature=b.signature)),
        ("sig-a", RunRecord("sig-a", {"nodes": [{"id": "n", "type": "shell"}]}, "celery", signature=a.signature)),
        ("sig-a", RunRecord("sig-a", a.workflow, "celery")),  # no signature at all
        (
            "sig-a",
            RunRecord("sig-a", a.workflow, "celery", signature=signing.Signer(b"x" * 32).sign_run("sig-a", wf, None)),
        ),
    ]
    for run_id, record in altered:
        with pytest.raises(signing.WorkflowAltered, match=re.escape(f"run {run_id}: {ALTERED}")):
            signing.check_run(signer, run_id, record)
    runs.set_workflow("sig-a", {"nodes": [{"id": "m", "type": "echo"}]}, None, "m")  # an edit by a key holder
    edited = runs.get("sig-a")
    assert edited is not None and edited.signature != a.signature
    signing.check_run(signer, "sig-a", edited)


# -- replays ---------------------------------------------------------------------------------------------------


def captured_advance(
    monkeypatch: pytest.MonkeyPatch, r: redis.Redis, wf: dict[str, Any], **options: Any
) -> tuple[str, bytes]:
    """Submit `wf` while its first `chordflow.advance` goes to a queue no worker reads; returns the run id and that
    message as the broker list holds it (what anyone who can read Redis could capture)."""
    queue = f"capture-{uuid.uuid4().hex[:8]}"
    with monkeypatch.context() as m:
        m.setenv("CHORDFLOW_QUEUE", queue)
        run_id = scheduler.submit(wf, **options)
    lists = [queue] + [f"{queue}\x06\x16{step}" for step in priorities.STEPS[1:]]  # kombu: one list per priority
    raw = [message for name in lists for message in r.lrange(name, 0, -1)]
    assert len(raw) == 1
    r.delete(*lists)
    return run_id, raw[0]


def push(r: redis.Redis, raw: bytes | str) -> None:
    """Onto the list the workers read, as kombu's Redis transport publishes."""
    r.lpush(settings.load().queue, raw)


def task_id_of(raw: bytes) -> str:
    return json.loads(raw)["headers"]["id"]


def test_a_captured_advance_pushed_again_after_its_run_was_reset_runs_nothing(
    monkeypatch: pytest.MonkeyPatch, r: redis.Redis, worker: ManagedProcess
) -> None:
    key = f"replay-{uuid.uuid4().hex[:8]}"
    run_id, raw = captured_advance(monkeypatch, r, {"nodes": [count(key, "once")]})
    task_id = task_id_of(raw)
    push(r, raw)
    assert scheduler.wait(run_id, timeout=TIMEOUT).status == "success"
    until(lambda: r.exists(done_key(task_id)), "the task's done mark (set once its result is stored)")
    assert 0 < r.ttl(done_key(task_id)) <= settings.load().run_ttl

    def reset() -> None:  # the run as it was recorded: queued at step 0, so an advance at step 0 would run it all
        r.hset(run_key(run_id, "run"), mapping={"status": "queued", "step": 0, "node": "c", "error": ""})

    reset()
    push(r, raw)
    line = worker.wait_for_line(f"skipped task chordflow.advance[{task_id}]", TIMEOUT)
    assert "WARNING" in line and "ran to the end already" in line
    assert len(warnings_about(worker, task_id)) == 1
    assert r.hgetall(f"{key}:effects") == {b"once": b"1"}
    assert r.hget(run_key(run_id, "run"), "status") == b"queued"  # nothing of the run moved
    # The limit (README, Security): whoever can write Redis can also delete the mark, and the signed message runs
    # again within its expiry. Only a Redis password stops that.
    r.delete(done_key(task_id))
    push(r, raw)
    until(lambda: r.hget(run_key(run_id, "run"), "status") == b"succeeded", "the replay to run the run again")
    assert r.hgetall(f"{key}:effects") == {b"once": b"2"}


def test_an_expired_message_is_dropped(monkeypatch: pytest.MonkeyPatch, r: redis.Redis, worker: ManagedProcess) -> None:
    """The captured advance, its expiry moved into the past and signed again with the cluster's key: dropped."""
    key = f"expired-{uuid.uuid4().hex[:8]}"
    run_id, raw = captured_advance(monkeypatch, r, {"nodes": [count(key, "once")]})
    envelope = json.loads(raw)
    headers = envelope["headers"]
    assert headers[signing.EXPIRES] - time.time() == pytest.approx(settings.load().run_ttl, abs=60)
    content_type = envelope["content-type"]
    body = loads(base64.b64decode(envelope["body"]), content_type, envelope["content-encoding"], accept=[content_type])
    signer = current_app().signer
    assert signer is not None
    headers[signing.EXPIRES] = int(time.time()) - 1
    headers[signing.HEADER] = signer.sign(headers["task"], headers["id"], body, headers[signing.EXPIRES])
    push(r, json.dumps(envelope))
    line = worker.wait_for_line(f"dropped task chordflow.advance[{headers['id']}]", TIMEOUT)
    assert "WARNING" in line and "the message expired at" in line
    assert len(warnings_about(worker, headers["id"])) == 1
    assert r.hget(run_key(run_id, "run"), "status") == b"queued" and not r.exists(f"{key}:runs")
    push(r, raw)  # the same message as it was sent, still within its expiry: it runs
    assert scheduler.wait(run_id, timeout=TIMEOUT).status == "success"
    assert r.hgetall(f"{key}:effects") == {b"once": b"1"}


def test_a_message_delivered_again_after_its_worker_was_killed_mid_task_still_runs(
    cluster: Cluster, r: redis.Redis
) -> None:
    """Same task id, never marked done (its worker died in it): the redelivered `advance` runs the node to the end."""
    key = f"killed-{uuid.uuid4().hex[:8]}"
    cluster.start_worker("u2")
    # u1's log goes on from the module's earlier tests, which skip replayed messages on purpose: count from here.
    skipped = {name: len(warnings_about(worker, "skipped task")) for name, worker in cluster.workers.items()}
    try:
        for name in ("u1", "u2"):
            r.set(f"{key}:hold:{name}:once", 1)
        run_id = scheduler.submit({"nodes": [count(key, "once")]})
        holder = until(lambda: r.lrange(f"{key}:runs", 0, -1), "the node to start")[0].decode().split()[0]
        other = "u2" if holder == "u1" else "u1"
        cluster.workers[holder].kill()
        r.delete(f"{key}:hold:{other}:once")
        assert scheduler.wait(run_id, timeout=TIMEOUT).status == "success"
        assert r.lrange(f"{key}:runs", 0, -1) == [f"{holder} once".encode(), f"{other} once".encode()]
        assert r.hgetall(f"{key}:effects") == {b"once": b"1"}
        assert len(warnings_about(cluster.workers[other], "skipped task")) == skipped[other]
    finally:
        cluster.workers.pop("u2").kill()
        if cluster.workers["u1"].proc.poll() is not None:
            cluster.start_worker("u1")  # the module's worker, for whatever runs after


def resigned(raw: bytes, args: tuple[Any, ...], task_id: str) -> str:
    """The captured message `raw` with other arguments and task id, signed again with the cluster's key."""
    envelope = json.loads(raw)
    headers, content_type = envelope["headers"], envelope["content-type"]
    _, kwargs, embed = loads(base64.b64decode(envelope["body"]), content_type, envelope["content-encoding"],
                             accept=[content_type])  # fmt: skip
    body = (list(args), kwargs, embed)
    _, _, encoded = dumps(body, serializer="msgpack")
    envelope["body"] = base64.b64encode(encoded).decode()
    headers["id"] = envelope["properties"]["correlation_id"] = task_id
    # a message given back goes to the queue its routing key names: the workers' (not the capture's)
    envelope["properties"]["delivery_info"]["routing_key"] = settings.load().queue
    signer = current_app().signer
    assert signer is not None
    headers[signing.HEADER] = signer.sign(headers["task"], task_id, body, headers[signing.EXPIRES])
    return json.dumps(envelope)


def test_a_message_of_a_newer_format_is_handed_back_and_its_run_goes_on(
    monkeypatch: pytest.MonkeyPatch, r: redis.Redis, worker: ManagedProcess
) -> None:
    """What a worker of a newer release would send during a rolling upgrade, pushed by hand: this worker warns once,
    hands it back again and again (never misread, never lost), and the run's own advance still runs it once."""
    key = f"newer-{uuid.uuid4().hex[:8]}"
    # a high run's advance: aging never sends a copy of it (the original is all there is)
    run_id, raw = captured_advance(monkeypatch, r, {"nodes": [count(key, "once")]}, priority="high")
    newer_id = str(uuid.uuid4())
    newer = {"v": messages.FORMAT + 1, "run": run_id, "step": 0, "resume_at": "a field this release does not know"}
    push(r, resigned(raw, (newer,), newer_id))
    line = worker.wait_for_line(f"chordflow.advance[{newer_id}]: an advance of wire format {messages.FORMAT + 1}")
    assert "WARNING" in line and "handed back for a worker of a newer release" in line
    until(lambda: len(worker_lines(worker, f"chordflow.advance[{newer_id}] received")) >= 3, "two redeliveries")
    assert len(warnings_about(worker, newer_id)) == 1  # one warning, however often it comes back
    assert r.hget(run_key(run_id, "run"), "status") == b"queued" and not r.exists(f"{key}:runs")  # nothing misread
    push(r, raw)  # the run's own advance, of this release's format
    assert scheduler.wait(run_id, timeout=TIMEOUT).status == "success"
    assert r.hgetall(f"{key}:effects") == {b"once": b"1"}
    api.purge(run_id)  # the newer message goes with its run: nothing of a purged run runs
    worker.wait_for_line(f"skipped task chordflow.advance[{newer_id}]: run {run_id} was purged", TIMEOUT)


def test_a_run_record_of_a_newer_format_is_left_alone_until_a_worker_reads_it(
    monkeypatch: pytest.MonkeyPatch, r: redis.Redis, worker: ManagedProcess
) -> None:
    key = f"record-{uuid.uuid4().hex[:8]}"
    run_id, raw = captured_advance(monkeypatch, r, {"nodes": [count(key, "once")]}, priority="high")
    assert r.hget(run_key(run_id, "run"), "format") == str(FORMAT).encode()
    r.hset(run_key(run_id, "run"), "format", FORMAT + 1)  # as a newer release would have written it
    raw = resigned(raw, (*json_args(raw),), task_id_of(raw)).encode()
    push(r, raw)
    line = worker.wait_for_line(f"run {run_id}: record format {FORMAT + 1}", TIMEOUT)
    assert "WARNING" in line and "handed back" in line
    until(lambda: len(worker_lines(worker, f"chordflow.advance[{task_id_of(raw)}] received")) >= 2, "a redelivery")
    assert r.hget(run_key(run_id, "run"), "status") == b"queued" and not r.exists(f"{key}:runs")
    r.hset(run_key(run_id, "run"), "format", FORMAT)  # the upgrade reaches this worker
    assert scheduler.wait(run_id, timeout=TIMEOUT).status == "success"
    assert r.hgetall(f"{key}:effects") == {b"once": b"1"}


def json_args(raw: bytes) -> list[Any]:
    envelope = json.loads(raw)
    content_type = envelope["content-type"]
    body = loads(base64.b64decode(envelope["body"]), content_type, envelope["content-encoding"], accept=[content_type])
    return list(body[0])


def worker_lines(worker: ManagedProcess, text: str) -> list[str]:
    return [line for line in worker.log.read_text().splitlines() if text in line]
