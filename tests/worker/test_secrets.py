"""Secrets never show in what chordflow reports about a failure.

A token given to a node — as a secret-named param, an `Authorization` header, a URL's query or password —
must not appear in the raised error, the RunResult's aggregate (`results`, `errors`), the run record, error
events, the CLI's output, the cluster's worker logs, or any Redis key. Real parts only: a local HTTP
server, the suite's redis-server and worker processes, a redis-server with `--requirepass`.

What is NOT masked (by design, see worker/redact.py): the data the user gave the run. An input holding a
token stays in the store (RunResult.shared, checkpoints, the state events): the run needs it to resume,
and the user put it there. The assertions below look at diagnostics, never at the inputs themselves.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import subprocess
import sys
import traceback
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import redis

import scheduler
from ir.errors import BackendError, BatchItemFailed
from scheduler.backends.celery import broker_errors
from scheduler.localcluster import Cluster, RedisServer
from scheduler.reach import preflight
from tests.support import http_server
from tests.support.kinds import starts
from worker import redact, settings
from worker.cluster.app import current_app
from worker.runs.sqlite import LocalRuns

ROOT = Path(__file__).parents[2]
SEEN_AUTH: list[str] = []  # the Authorization headers the server received: the token really was sent


class Handler(BaseHTTPRequestHandler):
    """/boom answers 500, anything else 404 (a JSON body that does not echo the request)."""

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def do_GET(self) -> None:
        SEEN_AUTH.append(self.headers.get("Authorization", ""))
        status = 500 if self.path.startswith("/boom") else 404
        data = json.dumps({"detail": "failed"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with http_server.serving(Handler) as url:
        yield url


@pytest.fixture
def refused_url() -> Iterator[str]:
    with http_server.refused_url() as url:
        yield url


@pytest.fixture
def token() -> Iterator[str]:
    """A fresh secret per test, so a search of shared logs or Redis finds only this test's leaks."""
    yield f"tok-{uuid.uuid4().hex}"
    redact.forget()  # the scheduler process remembered it: later tests start clean


def http_workflow(error_handling: str) -> dict[str, Any]:
    """A batch of GETs sending the token as the `api_token` query parameter and a Bearer header."""
    return {
        "inputs": {"api_token": {"description": "the API's token"}, "urls": {"description": "what to fetch"}},
        "nodes": [
            {
                "id": "fetch",
                "type": "http",
                "params": {
                    "url": "${item}",
                    "params": {"api_token": "${api_token}"},
                    "headers": {"Authorization": "Bearer ${api_token}"},
                    "timeout": 30,
                },
                # One chunk: items run in order, so fail_fast reports item 0 on both backends.
                "batch": {"items": "${urls}", "error_handling": error_handling, "chunk_size": 10},
            }
        ],
    }


def http_inputs(token: str, base_url: str, refused_url: str) -> dict[str, Any]:
    # Item 0 cannot connect: its error names the URL (with the query). Item 1 gets a 500; item 2 is a URL
    # that carries the token itself (its copy in `errors` must be masked) and gets a 404.
    return {"api_token": token, "urls": [refused_url, f"{base_url}/boom", f"{base_url}/missing?api_token={token}"]}


def echo_workflow(error_handling: str) -> dict[str, Any]:
    """Nodes whose failures echo a `password` param's value with no name next to it: only knowing the
    node's secret values masks them (test-fail raises "boom <value>"; test-error-string writes
    "Error: <value> is bad")."""
    params = {"value": "${item}", "password": "${item}"}
    batch = {"items": "${codes}", "error_handling": error_handling}
    return {
        "nodes": [
            {"id": "bad", "type": "test-error-string", "params": params, "batch": batch},
            {"id": "boom", "type": "test-fail", "params": {**params, "fail": True}, "batch": batch},
        ]
    }


def assert_hidden(secret: str, *texts: Any) -> None:
    for text in texts:
        shown = text if isinstance(text, str) else repr(text)
        assert secret not in shown, shown


def error_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # The `state` events carry the store, and with it the inputs (not masked, by design).
    return [e for e in events if e.get("type") != "state"]


def assert_cluster_clean(secret: str, cluster: Cluster) -> None:
    """No worker log line and no Redis value of the suite's cluster holds `secret`.

    Each solo worker answers a ping only after the task it was running ended (and was logged), so the
    logs are read after every chunk of the run wrote its lines. A chunk's result is bytes, which Celery
    logs (and Flower shows) in hex: the hex of the secret is looked for too.
    """
    replies = current_app().control.ping(timeout=30, limit=len(cluster.workers))
    assert len(replies) == len(cluster.workers), replies
    for name in cluster.workers:
        log = (cluster.workdir / f"worker-{name}.log").read_text(errors="replace")
        assert "succeeded" in log
        assert_hidden(secret, log)
        assert_hidden(secret.encode().hex(), log)
    client = redis.Redis.from_url(cluster.redis.url)
    needle = secret.encode()
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        if kind == b"string":
            values = [client.get(key) or b""]
        elif kind == b"hash":
            values = [b"%s=%s" % pair for pair in client.hgetall(key).items()]
        elif kind == b"list":
            values = client.lrange(key, 0, -1)
        elif kind == b"set":
            values = list(client.smembers(key))
        elif kind == b"zset":
            values = client.zrange(key, 0, -1)
        elif kind == b"stream":
            values = [b"".join(k + v for k, v in fields.items()) for _, fields in client.xrange(key)]
        else:
            values = []
        assert not any(needle in value for value in values), (key, kind)


# -- the http node, on both backends ------------------------------------------------------------------------


def test_http_failures_continue_mask_the_token_everywhere(backend, base_url, refused_url, token, request) -> None:
    events: list[dict[str, Any]] = []
    run_id = f"secrets-{uuid.uuid4().hex[:8]}"
    inputs = http_inputs(token, base_url, refused_url)
    result = scheduler.run(http_workflow("continue"), inputs, backend=backend, on_event=events.append, run_id=run_id)
    agg = result.shared["fetch"]
    assert (agg["count"], agg["error_count"]) == (3, 3)
    assert f"Bearer {token}" in SEEN_AUTH  # the server did receive the secret
    errors = agg["errors"]
    assert errors[0]["exception_type"] == "ConnectionError"
    assert "api_token=***" in errors[0]["error"] and refused_url in errors[0]["error"]
    assert errors[2]["item"] == f"{base_url}/missing?api_token=***"
    assert [e["error"] for e in errors[1:]] == ["HTTP 500 Internal Server Error", "HTTP 404 Not Found"]
    assert_hidden(token, agg, result.error, result.outputs, error_events(events), LocalRuns.default().get(run_id))
    if backend == "celery":
        assert_cluster_clean(token, request.getfixturevalue("celery_cluster"))


def test_http_failure_fail_fast_masks_the_token_everywhere(backend, base_url, refused_url, token, request) -> None:
    events: list[dict[str, Any]] = []
    run_id = f"secrets-{uuid.uuid4().hex[:8]}"
    store: dict[str, Any] = {}
    inputs = http_inputs(token, base_url, refused_url)
    with pytest.raises(ConnectionError) as info:
        scheduler.run(
            http_workflow("fail_fast"), inputs, shared=store, backend=backend, on_event=events.append, run_id=run_id
        )
    message = str(info.value)
    assert message.startswith(f"http: GET {refused_url}?api_token=*** failed:"), message
    assert "fetch" not in store  # fail_fast writes nothing
    record = LocalRuns.default().get(run_id)
    assert record is not None and record.status == "failed"
    assert_hidden(token, message, "".join(traceback.format_exception(info.value)), error_events(events), record)
    if backend == "celery":
        assert_cluster_clean(token, request.getfixturevalue("celery_cluster"))


# -- a secret echoed without its name: known from the node's params ----------------------------------------


def test_param_values_echoed_in_errors_are_masked_in_continue_mode(backend, token, request) -> None:
    result = scheduler.run(echo_workflow("continue"), {"codes": [token]}, backend=backend)
    bad, boom = result.shared["bad"], result.shared["boom"]
    assert bad["errors"] == [{"index": 0, "item": "***", "error": "Error: *** is bad"}]
    assert bad["results"] == [{"value": "Error: *** is bad"}]  # the error string the namespace keeps, too
    assert boom["errors"] == [{"index": 0, "item": "***", "error": "boom ***", "exception_type": "ValueError"}]
    assert_hidden(token, bad, boom)
    if backend == "celery":
        assert_cluster_clean(token, request.getfixturevalue("celery_cluster"))


def test_param_values_echoed_in_errors_are_masked_in_fail_fast(backend, token) -> None:
    with pytest.raises(BatchItemFailed, match=r"^batch node 'bad' item 0 failed: Error: \*\*\* is bad$"):
        scheduler.run(echo_workflow("fail_fast"), {"codes": [token]}, backend=backend)
    wf = echo_workflow("fail_fast")
    del wf["nodes"][0]
    with pytest.raises(ValueError, match=r"^boom \*\*\*$") as info:
        scheduler.run(wf, {"codes": [token]}, backend=backend)
    assert_hidden(token, "".join(traceback.format_exception(info.value)))


# -- the CLI ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("error_handling", ["fail_fast", "continue"])
@pytest.mark.processes
def test_cli_run_output_never_shows_the_token(error_handling, base_url, refused_url, token, tmp_path) -> None:
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(http_workflow(error_handling)))
    inputs = tmp_path / "inputs.json"  # a file, as a token should be given (not on the command line)
    inputs.write_text(json.dumps(http_inputs(token, base_url, refused_url)))
    argv = [sys.executable, "-m", "scheduler.cli", "run", str(wf), "--inputs-file", str(inputs)]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    if error_handling == "fail_fast":
        assert proc.returncode == 1, proc.stderr
        assert f"error: ConnectionError: http: GET {refused_url}?api_token=*** failed" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert "3 failed" in proc.stdout and "api_token=***" in proc.stdout
    assert_hidden(token, proc.stdout, proc.stderr)


def test_cli_one_line_error_masks_urls_in_any_exception() -> None:
    from scheduler.cli.errors import error_lines, error_text

    exc = RuntimeError("404 Client Error: Not Found for url: https://api.example/x?page=2&api_key=abc123xyz")
    assert error_lines(exc) == [
        "error: RuntimeError: 404 Client Error: Not Found for url: https://api.example/x?page=2&api_key=***"
    ]
    exc = ConnectionError("cannot connect to redis://:pr0d@s3cret@db:6379/0")
    assert error_text(exc) == "ConnectionError: cannot connect to redis://:**@db:6379/0"


# -- masking texts and URLs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:p@ss@host:6379/0", "redis://:**@host:6379/0"),
        ("redis://:pr0d@s3cret@host:6379/0", "redis://:**@host:6379/0"),
        ("redis://admin:pr0d@s3cret@host:6379/0", "redis://admin:**@host:6379/0"),
        ("rediss://:pr0d@s3cret@host:6380/0?ssl_cert_reqs=required", "rediss://:**@host:6380/0?ssl_cert_reqs=required"),
        ("amqp://guest:pr0d@s3cret@rabbit//", "amqp://guest:**@rabbit//"),
        ("redis://:pr0d%40s3cret@host:6379/0", "redis://:**@host:6379/0"),
        ("unix://:pr0d@s3cret@/tmp/redis.sock?db=0", "unix://:**@/tmp/redis.sock?db=0"),
        ("https://pr0ds3cret@github.com/o/r.git", "https://***@github.com/o/r.git"),
        ("https://h/x?api_token=pr0ds3cret&page=2", "https://h/x?api_token=***&page=2"),
        ("https://h/x?Password=pr0ds3cret#Access_Key=pr0ds3cret", "https://h/x?Password=***#Access_Key=***"),
        ("https://h/login?next=https://u:pr0ds3cret@h2/", "https://h/login?next=https://u:**@h2/"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("https://h/users/@me?page=2", "https://h/users/@me?page=2"),
    ],
)
def test_mask_url_never_shows_any_part_of_a_password(url: str, masked: str) -> None:
    assert redact.mask_url(url) == masked
    assert redact.mask(f"at {url} (refused)") == f"at {masked} (refused)"
    for part in ("pr0d", "s3cret", "p@ss"):
        assert part not in masked


def test_a_library_message_echoing_a_secret_param_is_masked_wherever_the_value_appears() -> None:
    params = {"url": "http://h/x", "headers": {"Authorization": "Bearer abc-123-def"}, "params": {"api_key": "k3y-v4l"}}
    secrets = redact.secrets_in(params)
    assert {"Bearer abc-123-def", "abc-123-def", "k3y-v4l"} <= secrets
    text = "rejected abc-123-def (key k3y-v4l) for {'Authorization': 'Bearer abc-123-def', 'Accept': '*/*'}"
    assert redact.mask(text, secrets) == "rejected *** (key ***) for {'Authorization': '***', 'Accept': '*/*'}"
    assert redact.mask("retry with Cookie: sid=abc; path=/ later") == "retry with Cookie: ***; path=/ later"


def test_a_failed_items_copy_and_exception_are_masked_but_keep_their_type() -> None:
    from worker.batch.outcome import ItemOutcome

    cause = OSError(111, "refused for http://u:pr0ds3cret@h/x")
    message = "call(api_key='k3y-v4l') sent tok-123456"  # not in the raise line: tracebacks quote source
    try:
        try:
            raise cause
        except OSError as exc:
            raise ValueError(message) from exc
    except ValueError as exc:
        outcome = ItemOutcome.raised(
            3, {"url": "http://h/?token=tok-123456", "auth": "tok-123456"}, exc, {"tok-123456"}
        )
    assert outcome.error == "call(api_key='***') sent ***"
    assert outcome.item == {"url": "http://h/?token=***", "auth": "***"}
    assert isinstance(outcome.exception, ValueError) and str(outcome.exception) == outcome.error
    shown = "".join(traceback.format_exception(outcome.exception))
    assert "[Errno 111] refused for http://u:**@h/x" in shown  # the cause is kept, masked
    assert_hidden("pr0ds3cret", shown)
    assert_hidden("tok-123456", shown)
    assert_hidden("k3y-v4l", shown)


# -- worker logs ------------------------------------------------------------------------------------------


def test_log_filter_masks_messages_arguments_and_tracebacks(token: str) -> None:
    """What the worker's log handlers get (hooked to Celery's after_setup_task_logger in worker/cluster/app.py)."""
    logger = logging.getLogger(f"test_secrets.{uuid.uuid4().hex}")
    logger.propagate = False
    logger.setLevel(logging.INFO)  # workers log at INFO
    out = io.StringIO()
    logger.addHandler(logging.StreamHandler(out))
    redact.install_log_filter(logger=logger)
    redact.install_log_filter(logger=logger)  # twice is harmless: one filter per handler
    assert sum(isinstance(f, redact.LogFilter) for f in logger.handlers[0].filters) == 1
    redact.remember([token])  # as a failed item of this process does
    logger.info("Task succeeded: %r", {"error": f"boom {token}", "url": "http://h/?api_token=xyz1234"})
    try:
        raise ConnectionError(f"cannot reach redis://:{token}@db:6379/0")
    except ConnectionError:
        logger.exception("chunk crashed")
    text = out.getvalue()
    assert "boom ***" in text and "api_token=***" in text and "redis://:**@db:6379/0" in text
    assert_hidden(token, text)
    assert_hidden("xyz1234", text)


# -- Redis credentials ----------------------------------------------------------------------------------------

PASSWORD = "s3cr3t@pr0d"
ECHO_BATCH = '{"nodes": [{"id": "b", "type": "echo", "params": {"v": "${item}"}, "batch": {"items": "${items}"}}]}'


@pytest.fixture(scope="module")
@starts("processes")
def locked_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server that requires PASSWORD (which contains an `@`)."""
    server = RedisServer(tmp_path_factory.mktemp("locked-redis"), ["--requirepass", PASSWORD])
    try:
        yield server
    finally:
        server.kill()


def _settings(url: str) -> settings.Settings:
    return dataclasses.replace(settings.load(), broker_url=url, result_backend=url)


def test_the_right_password_with_an_at_sign_passes_the_preflight(locked_redis: RedisServer) -> None:
    preflight(_settings(f"redis://:{PASSWORD}@127.0.0.1:{locked_redis.port}/0"))


def test_a_wrong_redis_password_says_authentication_failed(monkeypatch, locked_redis: RedisServer) -> None:
    url = f"redis://:wr0ng@guess@127.0.0.1:{locked_redis.port}/0"
    monkeypatch.setenv("CHORDFLOW_BROKER_URL", url)
    monkeypatch.setenv("CHORDFLOW_RESULT_BACKEND", url)
    with pytest.raises(BackendError) as info:
        scheduler.run(ECHO_BATCH, {"items": [1]}, backend="celery")
    expected = f"authentication failed for Redis at redis://:**@127.0.0.1:{locked_redis.port}/0: wrong user or password"
    assert str(info.value) == expected
    assert_hidden("wr0ng", str(info.value))
    assert_hidden("guess", str(info.value))


def test_no_password_for_a_locked_redis_says_authentication_failed(locked_redis: RedisServer) -> None:
    with pytest.raises(BackendError, match=r"^authentication failed for Redis at .*: the server requires a password$"):
        preflight(_settings(locked_redis.url))


def test_losing_the_credentials_mid_run_says_authentication_failed(locked_redis: RedisServer) -> None:
    """broker_errors (every Redis call during a run) names a refused password too, not a lost connection."""
    url = f"redis://:wr0ng@guess@127.0.0.1:{locked_redis.port}/0"
    with (
        pytest.raises(BackendError, match=r"^authentication failed for Redis at redis://:\*\*@127"),
        broker_errors(url),
    ):
        redis.Redis.from_url(url).get("x")


def test_cli_with_a_wrong_redis_password_prints_one_masked_line(locked_redis: RedisServer, tmp_path: Path) -> None:
    url = f"redis://:wr0ng@guess@127.0.0.1:{locked_redis.port}/0"
    wf = tmp_path / "wf.json"
    wf.write_text(ECHO_BATCH)
    env = {**os.environ, "CHORDFLOW_BROKER_URL": url, "CHORDFLOW_RESULT_BACKEND": url, "CHORDFLOW_HOME": str(tmp_path)}
    argv = [sys.executable, "-m", "scheduler.cli", "run", str(wf), "--input", "items=[1]", "--backend", "celery"]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    port = locked_redis.port
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: authentication failed for Redis at redis://:**@127.0.0.1:{port}/0: wrong user or password"
    )
    assert_hidden("wr0ng", proc.stderr)
    assert_hidden("guess", proc.stderr)
