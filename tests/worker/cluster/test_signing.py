"""Signed task messages (worker/cluster/signing.py): a worker runs only what a holder of the cluster's key sent.

The cluster tests use a cluster of their own (a redis-server and one real `celery -A worker.app worker`)
and forge `chordflow.run_chunk` messages the way an attacker who can write to the broker would: a plain
Celery app, msgpack, the job layout of worker/cluster/batches/dispatch.py, and a `shell` node that would `touch` a file.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu.serialization import dumps, loads

import scheduler
from ir import snapshot
from ir.errors import ValidationError
from ir.models import NodeSpec
from scheduler.localcluster import Cluster, ManagedProcess
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from worker import settings
from worker.cluster import signing
from worker.cluster.app import current_app
from worker.cluster.batches.tasks import chunk_executor

RUN_CHUNK = "chordflow.run_chunk"
TIMEOUT = 60.0
ECHO_BATCH = {"id": "b", "type": "echo", "params": {"v": "${item}"}, "batch": {"items": "${items}"}}


@pytest.fixture(scope="module")
@starts("cluster")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A redis-server and one solo worker, with a random key this process signs with too."""
    own = Cluster(tmp_path_factory.mktemp("signing"), plugins=PLUGINS)
    previous = own.apply_env()
    try:
        own.start_worker("s1")
        yield own
    finally:
        own.restore_env(previous)
        own.stop()


@pytest.fixture
def worker(cluster: Cluster) -> ManagedProcess:
    return cluster.workers["s1"]


def chunk_job(command: str) -> dict[str, Any]:
    """The argument of one `chordflow.run_chunk`, as worker/cluster/batches/dispatch.py lays it out: one item."""
    spec = NodeSpec.model_validate(
        {"id": "sh", "type": "shell", "params": {"command": command}, "batch": {"items": "${items}"}}
    )
    return {
        "run": f"signing-{uuid.uuid4().hex[:10]}",
        "batch": "sh",
        "node": spec.wire(),
        "snap": snapshot.encode(snapshot.snapshot_of({}), label="shared"),
        "start": 0,
        "items": [snapshot.encode(["x"])],
        "plan": "no-plan",  # no window in Redis: the chunk runs and its finish is refused as stale
    }


@contextlib.contextmanager
def plain_client(broker: str, signer: signing.Signer | None = None) -> Iterator[Celery]:
    """A plain Celery app on the cluster's broker and queue, msgpack like chordflow's; it signs only with `signer`."""
    app = Celery("forger", set_as_current=False)
    app.conf.update(broker_url=broker, task_serializer="msgpack", task_default_queue=settings.load().queue)
    if signer is not None:
        signing.sign_messages(app, signer)
    try:
        yield app
    finally:
        app.close()


def signed_headers(task_id: str, job: dict[str, Any]) -> dict[str, Any]:
    """The signature and expiry chordflow's app (with the cluster's key) puts on a run_chunk of `job` with this id."""
    message = current_app().amqp.create_task_message(task_id, RUN_CHUNK, (job,), {})
    return {name: message.headers[name] for name in (signing.HEADER, signing.EXPIRES)}


def run_signed(worker: ManagedProcess, job: dict[str, Any]) -> None:
    """Send `job` with chordflow's app (signed) and wait until the worker reports it succeeded."""
    sent = current_app().send_task(RUN_CHUNK, (job,))
    worker.wait_for_line(f"Task {RUN_CHUNK}[{sent.id}] succeeded", TIMEOUT)


def forge_unsigned(broker: str, task_id: str, job: dict[str, Any], worker: ManagedProcess, tmp_path: Path) -> str:
    with plain_client(broker) as app:
        app.send_task(RUN_CHUNK, (job,), task_id=task_id)
    return RUN_CHUNK


def forge_with_another_key(broker: str, task_id: str, job: dict[str, Any], worker: ManagedProcess, _: Path) -> str:
    with plain_client(broker, signing.Signer(secrets.token_bytes(32))) as app:
        app.send_task(RUN_CHUNK, (job,), task_id=task_id)
    return RUN_CHUNK


def forge_tampered_args(broker: str, task_id: str, job: dict[str, Any], worker: ManagedProcess, tmp_path: Path) -> str:
    """A genuine signature of a harmless chunk, first sent as signed (it runs), then over the attacker's args."""
    harmless = chunk_job(f"touch {tmp_path / 'harmless'}")
    headers = signed_headers(task_id, harmless)
    with plain_client(broker) as app:
        app.send_task(RUN_CHUNK, (harmless,), task_id=task_id, headers=headers)
        worker.wait_for_line(f"Task {RUN_CHUNK}[{task_id}] succeeded", TIMEOUT)
        assert (tmp_path / "harmless").exists()  # the headers are right for the message they were made for
        app.send_task(RUN_CHUNK, (job,), task_id=task_id, headers=headers)
    return RUN_CHUNK


def forge_added_callback(broker: str, task_id: str, job: dict[str, Any], worker: ManagedProcess, tmp_path: Path) -> str:
    """Genuinely signed args, plus a callback the worker would publish - signed with its key - after the task."""
    harmless = chunk_job(f"touch {tmp_path / 'harmless'}")
    headers = signed_headers(task_id, harmless)
    with plain_client(broker) as app:
        evil = app.signature(RUN_CHUNK, (job,), immutable=True)
        app.send_task(RUN_CHUNK, (harmless,), task_id=task_id, headers=headers, link=evil)
    return RUN_CHUNK


def forge_deeply_nested(broker: str, task_id: str, job: dict[str, Any], worker: ManagedProcess, _: Path) -> str:
    """Args nested deeper than the check can recurse: still one drop, not a crash of the worker's consumer."""
    nested: dict[str, Any] = {"job": job}
    for _depth in range(500):
        nested = {"n": nested}
    with plain_client(broker) as app:
        app.send_task(RUN_CHUNK, (nested,), task_id=task_id, headers={signing.HEADER: "0" * 64})
    return RUN_CHUNK


def forge_through_a_builtin(broker: str, task_id: str, job: dict[str, Any], worker: ManagedProcess, _: Path) -> str:
    """`celery.map`, a task every Celery app has, calls the task it names inside the worker: it is checked too."""
    with plain_client(broker) as app:
        app.send_task("celery.map", (app.signature(RUN_CHUNK), [job]), task_id=task_id)
    return "celery.map"


FORGERIES = [
    forge_unsigned,
    forge_with_another_key,
    forge_tampered_args,
    forge_added_callback,
    forge_deeply_nested,
    forge_through_a_builtin,
]


@pytest.mark.parametrize("forge", FORGERIES, ids=lambda f: f.__name__.removeprefix("forge_"))
def test_a_forged_chunk_is_dropped_with_one_warning_and_the_worker_keeps_serving(
    cluster: Cluster, worker: ManagedProcess, tmp_path: Path, forge: Any
) -> None:
    pwned = tmp_path / "pwned"
    task_id = uuid.uuid4().hex
    name = forge(cluster.redis.url, task_id, chunk_job(f"touch {pwned}"), worker, tmp_path)
    line = worker.wait_for_line(f"dropped task {name}[{task_id}]", TIMEOUT)
    assert "WARNING" in line and "no valid signature" in line
    run_signed(worker, chunk_job(f"touch {tmp_path / 'signed'}"))  # the next message, signed: it runs
    assert (tmp_path / "signed").exists()
    assert not pwned.exists()
    assert str(pwned) not in worker.log.read_text()  # never the args: not in the drop line, nor anywhere


def test_signed_runs_pass_and_nothing_they_send_is_dropped(cluster: Cluster, worker: ManagedProcess) -> None:
    """Chord bodies and the next `advance` are published by the worker itself: they are signed too."""
    drops = worker.log.read_text().count("dropped task")
    wf = {"nodes": [ECHO_BATCH]}
    items = list(range(6))
    local = scheduler.run(wf, {"items": items}, backend="celery")
    assert local.status == "success" and local.shared["b"]["success_count"] == 6
    durable = scheduler.wait(scheduler.submit(wf, {"items": items}), timeout=TIMEOUT)
    assert durable.status == "success" and durable.shared["b"]["success_count"] == 6
    assert worker.log.read_text().count("dropped task") == drops


def test_a_signed_chunk_with_a_spec_validation_refuses_fails_naming_the_node(
    worker: ManagedProcess, tmp_path: Path
) -> None:
    """A template inside a shell command string would become shell syntax: the worker checks the spec first."""
    pwned = tmp_path / "pwned"
    job = chunk_job("touch ${item}")  # the spec check of the model passes; validation's param check does not
    job["items"] = snapshot.encode([str(pwned)])
    sent = current_app().send_task(RUN_CHUNK, (job,))
    line = worker.wait_for_line(f"Task {RUN_CHUNK}[{sent.id}] raised", TIMEOUT)
    assert "ValidationError('node \\'sh\\': params: shell: param \\'command\\' contains the template" in line
    assert not pwned.exists()


@pytest.mark.parametrize(
    ("wire", "problem"),
    [
        ({"id": "n1", "type": "no-such-type"}, "unknown node type 'no-such-type'"),
        ({"id": "n2", "type": "shell", "params": {"command": "rm ${item}"}}, "contains the template '${item}'"),
        ({"id": "n3", "type": "echo", "max_retries": 0}, "max_retries: Input should be greater than or equal to 1"),
        ({"id": "n4", "type": "echo", "exec": "print(1)"}, "exec: Extra inputs are not permitted"),
    ],
)
def test_the_executor_checks_a_spec_as_validation_does(wire: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as raised:
        chunk_executor(wire, {})
    assert str(raised.value).startswith(f"node '{wire['id']}': ") and problem in str(raised.value)


def without_key(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in ("CHORDFLOW_SECRET_KEY", "CHORDFLOW_SECRET_KEY_FILE")}


@pytest.mark.parametrize("via", ["celery", "chordflow"])
def test_a_worker_without_a_key_exits_with_one_line_saying_how_to_set_it(cluster: Cluster, via: str) -> None:
    argv = cluster.worker_argv(f"keyless-{via}", via=via)
    done = subprocess.run(argv, env=without_key(cluster.env), capture_output=True, text=True, timeout=TIMEOUT)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 1
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: refusing to start a worker without a signing key: set CHORDFLOW_SECRET_KEY")
    assert "--insecure" in lines[0] and "CHORDFLOW_INSECURE=1" in lines[0]


INSECURE_STARTS = [("chordflow", ("--insecure",), {}), ("celery", (), {"CHORDFLOW_INSECURE": "1"})]


@pytest.mark.parametrize(("via", "args", "env"), INSECURE_STARTS)
def test_an_insecure_worker_starts_and_warns(
    cluster: Cluster, via: str, args: tuple[str, ...], env: dict[str, str]
) -> None:
    """`chordflow worker --insecure`, or CHORDFLOW_INSECURE=1 (on a queue of its own: it must not take real work)."""
    name = f"insecure-{via}"
    keyless = {**without_key(cluster.env), **env}
    started = cluster.start_worker(name, via=via, env=keyless, args=(*args, "-Q", "signing-insecure"))
    try:
        assert "WARNING" in started.wait_for_line("running INSECURE", TIMEOUT)
    finally:
        started.kill()
        del cluster.workers[name]


def test_a_client_without_a_key_refuses_to_send(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHORDFLOW_SECRET_KEY", raising=False)
    monkeypatch.delenv("CHORDFLOW_SECRET_KEY_FILE", raising=False)
    monkeypatch.delenv("CHORDFLOW_INSECURE", raising=False)
    with pytest.raises(signing.SigningKeyError, match="refusing to send unsigned task messages"):
        current_app().send_task("chordflow.advance", ("r", 0))  # refused before any connection
    monkeypatch.setenv("CHORDFLOW_INSECURE", "1")
    message = current_app().amqp.create_task_message("id", "chordflow.advance", ("r", 0), {})
    assert signing.HEADER not in message.headers


def test_chordflow_run_on_the_cluster_without_a_key_fails_with_one_line(cluster: Cluster, tmp_path: Path) -> None:
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({"nodes": [ECHO_BATCH]}))
    argv = [sys.executable, "-m", "scheduler.cli", "run", str(wf), "--input", "items=[1,2]", "--backend", "celery"]
    done = subprocess.run(argv, env=without_key(cluster.env), capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("error: refusing to send unsigned task messages")


# -- the signature itself ------------------------------------------------------------------------------------


def test_the_canonical_encoding_survives_the_msgpack_round_trip() -> None:
    body = (
        ({"run": "r", "snap": b"\x00\xff", "items": [1, 2.5, None, True]},),
        {"k": ("a", ("b",))},
        {"callbacks": [current_app().signature(RUN_CHUNK, (1,))], "errbacks": None, "chain": None, "chord": None},
    )
    content_type, encoding, data = dumps(body, serializer="msgpack")
    received = loads(data, content_type, encoding, accept=[content_type])
    assert received != body  # tuples came back as lists, the signature as a plain dict
    assert signing.canonical(received) == signing.canonical(body)
    reordered = {"b": 1, "a": 2}
    assert signing.canonical(reordered) == signing.canonical({"a": 2, "b": 1})


@pytest.mark.parametrize(
    ("one", "other"),
    [(["ab"], ["a", "b"]), ({"a": 1}, [["a", 1]]), (b"x", "x"), (1, "1"), (True, 1), (1, 1.0), ([], None), ({}, [])],
)
def test_different_values_never_encode_alike(one: Any, other: Any) -> None:
    assert signing.canonical(one) != signing.canonical(other)


def test_a_signature_verifies_only_for_its_key_name_id_expiry_and_body() -> None:
    signer = signing.Signer(b"k" * 32)
    body = [[{"x": b"1"}], {}, {}]
    signature = signer.sign(RUN_CHUNK, "id", body, 1_900_000_000)
    assert signer.verify(RUN_CHUNK, "id", body, 1_900_000_000, signature)
    assert not signing.Signer(b"j" * 32).verify(RUN_CHUNK, "id", body, 1_900_000_000, signature)
    assert not signer.verify("chordflow.advance", "id", body, 1_900_000_000, signature)
    assert not signer.verify(RUN_CHUNK, "id2", body, 1_900_000_000, signature)
    assert not signer.verify(RUN_CHUNK, "id", [[{"x": b"2"}], {}, {}], 1_900_000_000, signature)
    for expires in (1_900_000_001, "1900000000", 1_900_000_000.0, None):  # a later expiry, or another type
        assert not signer.verify(RUN_CHUNK, "id", body, expires, signature)
    for bad in (None, b"bytes", "é" * 64, signature.upper()):
        assert not signer.verify(RUN_CHUNK, "id", body, 1_900_000_000, bad)


def test_the_key_comes_from_the_environment_or_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("CHORDFLOW_SECRET_KEY", "CHORDFLOW_SECRET_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert signing.load_key(settings.load()) is None
    monkeypatch.setenv("CHORDFLOW_SECRET_KEY", "k" * 16)
    assert signing.load_key(settings.load()) == b"k" * 16
    assert "k" * 16 not in repr(settings.load())
    key_file = tmp_path / "key"
    key_file.write_text("f" * 20 + "\n")  # as `echo` writes it
    monkeypatch.setenv("CHORDFLOW_SECRET_KEY_FILE", str(key_file))
    with pytest.raises(signing.SigningKeyError, match="not both"):
        signing.load_key(settings.load())
    monkeypatch.delenv("CHORDFLOW_SECRET_KEY")
    assert signing.load_key(settings.load()) == b"f" * 20
    key_file.write_text("short")
    with pytest.raises(signing.SigningKeyError, match="the key has 5 bytes, it needs 16 or more"):
        signing.load_key(settings.load())
    monkeypatch.setenv("CHORDFLOW_SECRET_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(signing.SigningKeyError, match="cannot read the key: No such file or directory"):
        signing.load_key(settings.load())
